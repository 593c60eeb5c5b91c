//! Where a GGUF file's bytes live: a read-only memory map of the file, a copy in anonymous
//! memory on transparent 2 MiB pages, or a buffer in memory.

use std::fs::File;
use std::io::Read;
use std::ops::Deref;
use std::path::Path;

use memmap2::{Mmap, MmapOptions};

use super::error::{GgufError, Result};

/// How a GGUF file's bytes are held in memory.
///
/// A decode step reads every weight once (96 MB for SmolLM2), so on a CPU the step is a
/// stream through memory. On 4 KiB pages that stream takes a TLB miss every 4 KiB; on 2 MiB
/// pages almost none. Measured on one thread here (`docs/results.md`): a plain read of the
/// weights at 8.2–8.7 GB/s from huge pages against 6.6–7.0 from the file map, and SmolLM2's
/// decode 1.16× faster. The file's own map cannot have huge pages (the page cache of this
/// file system holds 4 KiB pages, and `madvise(MADV_HUGEPAGE)` on it does nothing), so the
/// fast form is a copy.
///
/// The environment variable `TQ_WEIGHTS=mapped|huge-pages` overrides what
/// [`WeightMemory::for_inference`] picks, process-wide (as `TQ_SIMD` picks the instruction
/// set).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightMemory {
    /// A read-only map of the file: pages are read on first use and shared with the page cache
    /// (and with other processes mapping the file); nothing is copied. Resident weights count
    /// as file-backed memory (`RssFile`).
    Mapped,
    /// The file read once into anonymous memory advised for transparent huge pages
    /// (`MADV_HUGEPAGE`): the whole file is read at open, and the weights count as anonymous
    /// memory (`RssAnon`); where the kernel has no transparent huge pages it still works, on
    /// small pages.
    HugePages,
    /// A caller's buffer ([`Gguf::from_bytes`](super::Gguf::from_bytes)).
    Buffer,
}

impl WeightMemory {
    /// What a model run should use: [`WeightMemory::HugePages`] on Linux where transparent
    /// huge pages are enabled (`always` or `madvise` in
    /// `/sys/kernel/mm/transparent_hugepage/enabled`), [`WeightMemory::Mapped`] elsewhere;
    /// `TQ_WEIGHTS=mapped` or `TQ_WEIGHTS=huge-pages` overrides it (another value is ignored).
    pub fn for_inference() -> Self {
        if let Ok(name) = std::env::var("TQ_WEIGHTS") {
            let chosen = [WeightMemory::Mapped, WeightMemory::HugePages]
                .into_iter()
                .find(|m| m.name() == name);
            if let Some(memory) = chosen {
                return memory;
            }
        }
        if transparent_huge_pages() {
            WeightMemory::HugePages
        } else {
            WeightMemory::Mapped
        }
    }

    /// The name `TQ_WEIGHTS` takes (`buffer` for a caller's buffer).
    pub fn name(self) -> &'static str {
        match self {
            WeightMemory::Mapped => "mapped",
            WeightMemory::HugePages => "huge-pages",
            WeightMemory::Buffer => "buffer",
        }
    }
}

/// Whether this kernel hands out transparent huge pages to a region that asks for them.
fn transparent_huge_pages() -> bool {
    cfg!(target_os = "linux")
        && std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .is_ok_and(|s| s.contains("[always]") || s.contains("[madvise]"))
}

/// The bytes of a GGUF file.
#[derive(Debug)]
pub(crate) enum Storage {
    /// A read-only map of a file: weights are paged in on demand and shared with the page cache
    /// instead of being copied into the heap.
    Mapped(Mmap),
    /// The file's bytes in a read-only anonymous map advised for huge pages.
    HugePages(Mmap),
    /// A caller's buffer (tests, fuzzing, files read some other way).
    Owned(Vec<u8>),
}

impl Storage {
    /// The file at `path`, held as `memory` says ([`WeightMemory::Buffer`] reads it into a
    /// heap buffer).
    pub(crate) fn open(path: &Path, memory: WeightMemory) -> Result<Self> {
        let io = |source| GgufError::Io {
            path: path.to_owned(),
            source,
        };
        let mut file = File::open(path).map_err(io)?;
        match memory {
            WeightMemory::Mapped => {
                // SAFETY: memmap2 requires that the file not be modified (truncated or written)
                // while mapped, otherwise the slice it hands out changes under us or a read
                // faults with SIGBUS. The map is read-only and private to this process; model
                // files are written once (the fetcher renames a finished, checksummed file into
                // place and never writes it again), so nothing in this project modifies a file
                // while it is mapped. A user editing the file during a run is outside what a
                // safe API can prevent, as with every reader that maps files.
                let map = unsafe { Mmap::map(&file) }.map_err(io)?;
                Ok(Storage::Mapped(map))
            }
            WeightMemory::HugePages => {
                let len = file.metadata().map_err(io)?.len();
                let len = usize::try_from(len).map_err(|_| {
                    io(std::io::Error::other(
                        "the file is larger than the address space",
                    ))
                })?;
                if len == 0 {
                    // An anonymous map cannot be empty; the header parser reports the file.
                    return Ok(Storage::Owned(Vec::new()));
                }
                let mut anon = MmapOptions::new().len(len).map_anon().map_err(io)?;
                // Advice before the first touch, so the pages the read faults in are huge ones.
                // Best effort: without it the copy still works, on small pages.
                #[cfg(target_os = "linux")]
                let _ = anon.advise(memmap2::Advice::HugePage);
                // `read`, not a copy out of a map of the file: the file's pages never become
                // part of this process's resident memory, so the peak is one copy.
                file.read_exact(&mut anon).map_err(io)?;
                Ok(Storage::HugePages(anon.make_read_only().map_err(io)?))
            }
            WeightMemory::Buffer => {
                let mut bytes = Vec::new();
                file.read_to_end(&mut bytes).map_err(io)?;
                Ok(Storage::Owned(bytes))
            }
        }
    }

    /// How the bytes are held.
    pub(crate) fn memory(&self) -> WeightMemory {
        match self {
            Storage::Mapped(_) => WeightMemory::Mapped,
            Storage::HugePages(_) => WeightMemory::HugePages,
            Storage::Owned(_) => WeightMemory::Buffer,
        }
    }
}

impl Deref for Storage {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Storage::Mapped(map) | Storage::HugePages(map) => map,
            Storage::Owned(bytes) => bytes,
        }
    }
}
