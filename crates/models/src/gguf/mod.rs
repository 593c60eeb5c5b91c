//! A reader for GGUF files (versions 2 and 3, little-endian), the model format of llama.cpp.
//!
//! A file is a header — magic `GGUF`, version, tensor count and metadata pair count (u64 each
//! since v2), the metadata pairs, one description per tensor (name, dimensions, ggml type,
//! offset) — then, aligned to `general.alignment` (default 32), the tensor data section.
//!
//! [`Gguf::open`] maps the file read-only; [`Gguf::open_with`] holds it as a [`WeightMemory`]
//! says (the model loaders read it onto huge pages: see [`WeightMemory::for_inference`]);
//! [`Gguf::from_bytes`] parses a buffer (tests, fuzzing). Either way the whole header is parsed
//! and validated up front: every string length,
//! count, offset and size is checked against the file length before it is used, array counts
//! against the remaining bytes before anything is allocated, so a truncated, corrupted or
//! hostile file produces a [`GgufError`], never a panic, an out-of-bounds read or a huge
//! allocation. Tensor bytes are then borrowed without copying through [`Gguf::tensor_data`].
//!
//! ```
//! use tq_models::gguf::{GgmlType, Gguf};
//!
//! // A minimal file: one metadata pair, no tensors, padded to the default alignment of 32.
//! let mut bytes = b"GGUF".to_vec();
//! bytes.extend(3u32.to_le_bytes()); // version
//! bytes.extend(0u64.to_le_bytes()); // tensor count
//! bytes.extend(1u64.to_le_bytes()); // metadata pair count
//! bytes.extend(12u64.to_le_bytes());
//! bytes.extend(b"general.name");
//! bytes.extend(8u32.to_le_bytes()); // value type: string
//! bytes.extend(4u64.to_le_bytes());
//! bytes.extend(b"tiny");
//! bytes.resize(bytes.len().next_multiple_of(32), 0);
//!
//! let gguf = Gguf::from_bytes(bytes)?;
//! assert_eq!(gguf.version(), 3);
//! assert_eq!(gguf.metadata().str("general.name")?, "tiny");
//! assert!(gguf.tensors().is_empty());
//! # Ok::<(), tq_models::gguf::GgufError>(())
//! ```

mod error;
mod metadata;
mod metadata_reader;
mod parse;
mod reader;
mod storage;
mod string_array;
mod tensor;

use std::path::Path;

pub use error::{GgufError, Result};
pub use metadata::{MAX_ARRAY_NESTING, Metadata, MetadataArray, MetadataValue, ValueType};
pub use parse::{ALIGNMENT_KEY, DEFAULT_ALIGNMENT, MAGIC};
pub use string_array::StringArray;
pub use tensor::{BlockLayout, GgmlType, MAX_DIMS, TensorInfo, TensorView};

use parse::{Header, parse_header};
use storage::Storage;
pub use storage::WeightMemory;

/// A parsed GGUF file: its metadata, its tensor descriptions and access to the tensor bytes.
///
/// ```no_run
/// use tq_models::gguf::Gguf;
///
/// let gguf = Gguf::open("SmolLM2-135M-Instruct.Q4_1.gguf")?;
/// let layers = gguf.metadata_u32("llama.block_count")?;
/// let embedding = gguf.tensor_data("token_embd.weight")?;
/// println!("{layers} layers; embedding {:?} {} ({} bytes)",
///     embedding.dims(), embedding.ggml_type(), embedding.data.len());
/// # Ok::<(), tq_models::gguf::GgufError>(())
/// ```
#[derive(Debug)]
pub struct Gguf {
    storage: Storage,
    header: Header,
}

impl Gguf {
    /// Maps the file at `path` read-only and parses its header.
    ///
    /// The file must not be modified while the returned value lives (see the memory map's
    /// safety note in the source).
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        Self::open_with(path, WeightMemory::Mapped)
    }

    /// Opens the file at `path` held as `memory` says and parses its header: mapped, read onto
    /// huge pages (what a model run wants: see [`WeightMemory`]), or read into a heap buffer.
    /// Every form parses the same bytes to the same result.
    pub fn open_with(path: impl AsRef<Path>, memory: WeightMemory) -> Result<Self> {
        let storage = Storage::open(path.as_ref(), memory)?;
        let header = parse_header(&storage)?;
        Ok(Gguf { storage, header })
    }

    /// How the file's bytes are held.
    pub fn memory(&self) -> WeightMemory {
        self.storage.memory()
    }

    /// Parses a GGUF file held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self> {
        let header = parse_header(&bytes)?;
        Ok(Gguf {
            storage: Storage::Owned(bytes),
            header,
        })
    }

    /// The format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.header.version
    }

    /// The metadata pairs, with typed accessors.
    pub fn metadata(&self) -> &Metadata {
        &self.header.metadata
    }

    /// `metadata().u32(key)`: an integer value that fits in `u32`, or an error naming the key.
    pub fn metadata_u32(&self, key: &str) -> Result<u32> {
        self.metadata().u32(key)
    }

    /// `metadata().u64(key)`: an integer value that fits in `u64`.
    pub fn metadata_u64(&self, key: &str) -> Result<u64> {
        self.metadata().u64(key)
    }

    /// `metadata().f32(key)`: an f32 value.
    pub fn metadata_f32(&self, key: &str) -> Result<f32> {
        self.metadata().f32(key)
    }

    /// `metadata().bool(key)`: a boolean value.
    pub fn metadata_bool(&self, key: &str) -> Result<bool> {
        self.metadata().bool(key)
    }

    /// `metadata().str(key)`: a string value.
    pub fn metadata_str(&self, key: &str) -> Result<&str> {
        self.metadata().str(key)
    }

    /// `metadata().array_str(key)`: an array of strings.
    pub fn metadata_array_str(&self, key: &str) -> Result<&StringArray> {
        self.metadata().array_str(key)
    }

    /// `metadata().array_i32(key)`: an array of i32.
    pub fn metadata_array_i32(&self, key: &str) -> Result<&[i32]> {
        self.metadata().array_i32(key)
    }

    /// The alignment of tensor data (`general.alignment`, default 32).
    pub fn alignment(&self) -> u64 {
        self.header.alignment
    }

    /// The absolute offset of the tensor data section in the file.
    pub fn data_offset(&self) -> u64 {
        self.header.data_offset
    }

    /// The whole file's bytes (tensor views borrow from these).
    pub fn bytes(&self) -> &[u8] {
        &self.storage
    }

    /// The file length in bytes.
    pub fn file_len(&self) -> u64 {
        self.storage.len() as u64
    }

    /// The tensor descriptions, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.header.tensors
    }

    /// The description of the tensor `name`, if present.
    pub fn tensor_info(&self, name: &str) -> Option<&TensorInfo> {
        self.header
            .tensor_index
            .get(name)
            .map(|&i| &self.header.tensors[i])
    }

    /// The bytes of the tensor `name`, borrowed from the file.
    ///
    /// Fails with [`GgufError::TensorNotFound`] for an absent name and
    /// [`GgufError::UnsupportedTensorType`] for a type without a known [`BlockLayout`].
    pub fn tensor_data(&self, name: &str) -> Result<TensorView<'_>> {
        let info = self
            .tensor_info(name)
            .ok_or_else(|| GgufError::TensorNotFound {
                name: name.to_owned(),
            })?;
        let size = info
            .byte_size()
            .ok_or_else(|| GgufError::UnsupportedTensorType {
                name: name.to_owned(),
                ggml_type: info.ggml_type,
            })?;
        // Parsing checked `data_offset + offset + size <= file length`; `get` re-checks it so a
        // logic error here could only ever produce an error, never an out-of-bounds read.
        let start = self.header.data_offset + info.offset;
        let end = start + size;
        let data = usize::try_from(start)
            .ok()
            .zip(usize::try_from(end).ok())
            .and_then(|(s, e)| self.storage.get(s..e))
            .ok_or_else(|| GgufError::OutOfBounds {
                what: format!("tensor {name:?}"),
                start,
                end,
                file_len: self.file_len(),
            })?;
        Ok(TensorView { info, data })
    }
}
