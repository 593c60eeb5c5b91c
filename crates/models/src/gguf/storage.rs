//! Where a GGUF file's bytes live: a read-only memory map of the file, or a buffer in memory.

use std::fs::File;
use std::ops::Deref;
use std::path::Path;

use memmap2::Mmap;

use super::error::{GgufError, Result};

/// The bytes of a GGUF file.
#[derive(Debug)]
pub(crate) enum Storage {
    /// A read-only map of a file: weights are paged in on demand and shared with the page cache
    /// instead of being copied into the heap.
    Mapped(Mmap),
    /// A caller's buffer (tests, fuzzing, files read some other way).
    Owned(Vec<u8>),
}

impl Storage {
    /// Maps the file at `path` read-only.
    pub(crate) fn map(path: &Path) -> Result<Self> {
        let io = |source| GgufError::Io {
            path: path.to_owned(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        // SAFETY: memmap2 requires that the file not be modified (truncated or written) while
        // mapped, otherwise the slice it hands out changes under us or a read faults with
        // SIGBUS. The map is read-only and private to this process; model files are written
        // once (the fetcher renames a finished, checksummed file into place and never writes it
        // again), so nothing in this project modifies a file while it is mapped. A user editing
        // the file during a run is outside what a safe API can prevent, as with every reader
        // that maps files.
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        Ok(Storage::Mapped(map))
    }
}

impl Deref for Storage {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Storage::Mapped(map) => map,
            Storage::Owned(bytes) => bytes,
        }
    }
}
