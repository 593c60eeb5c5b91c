//! The one error type of the GGUF reader.

use std::path::PathBuf;

use super::{GgmlType, ValueType};

/// Everything that can go wrong reading a GGUF file.
///
/// Offsets are byte positions from the start of the file, so a report can be checked with a hex
/// dump. Every check that guards a read or an allocation produces one of these variants: a
/// truncated, corrupted or hostile file is an error, never a panic or a huge allocation.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// The file could not be opened, inspected or mapped.
    #[error("cannot read GGUF file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating-system error.
        source: std::io::Error,
    },
    /// The first four bytes are not `GGUF`.
    #[error("not a GGUF file: magic bytes {found:02x?}, expected \"GGUF\"")]
    BadMagic {
        /// The bytes found (fewer than four when the file is shorter).
        found: Vec<u8>,
    },
    /// A GGUF version this reader does not handle.
    #[error("unsupported GGUF version {version}: {reason}")]
    UnsupportedVersion {
        /// The version field as read (little-endian).
        version: u32,
        /// Why it is refused.
        reason: &'static str,
    },
    /// A field would extend past the end of the file.
    #[error(
        "truncated GGUF file: {what} at offset {offset} needs {needed} bytes, {available} left"
    )]
    Truncated {
        /// The field being read.
        what: &'static str,
        /// Where it starts.
        offset: u64,
        /// How many bytes it needs.
        needed: u64,
        /// How many bytes remain in the file from `offset`.
        available: u64,
    },
    /// A count (of tensors, key-value pairs or array elements) that the rest of the file cannot
    /// possibly hold, refused before allocating anything for it.
    #[error(
        "corrupt GGUF file: {what} count {count} at offset {offset} needs at least {min_bytes} bytes, {available} left"
    )]
    CountTooLarge {
        /// What is being counted.
        what: &'static str,
        /// The count as read.
        count: u64,
        /// Where the count field is.
        offset: u64,
        /// The fewest bytes `count` elements occupy (saturating).
        min_bytes: u64,
        /// How many bytes remain after the count field.
        available: u64,
    },
    /// A metadata value type id outside 0..=12.
    #[error("corrupt GGUF file: unknown metadata value type {id} at offset {offset}")]
    UnknownValueType {
        /// The id as read.
        id: u32,
        /// Where it is.
        offset: u64,
    },
    /// A boolean byte other than 0 or 1.
    #[error("corrupt GGUF file: boolean byte {value} at offset {offset} is neither 0 nor 1")]
    InvalidBool {
        /// The byte as read.
        value: u8,
        /// Where it is.
        offset: u64,
    },
    /// A string that is not UTF-8 (the format requires UTF-8).
    #[error("corrupt GGUF file: {what} at offset {offset} is not valid UTF-8")]
    InvalidUtf8 {
        /// Which string.
        what: &'static str,
        /// Where its bytes start.
        offset: u64,
    },
    /// Arrays nested deeper than the reader allows (guards the stack against hostile files).
    #[error("corrupt GGUF file: arrays nested deeper than {max} levels at offset {offset}")]
    NestingTooDeep {
        /// The deepest nesting accepted.
        max: usize,
        /// Where the over-deep array starts.
        offset: u64,
    },
    /// The same metadata key appears twice.
    #[error("corrupt GGUF file: duplicate metadata key {key:?}")]
    DuplicateKey {
        /// The key.
        key: String,
    },
    /// The same tensor name appears twice.
    #[error("corrupt GGUF file: duplicate tensor name {name:?}")]
    DuplicateTensor {
        /// The name.
        name: String,
    },
    /// A tensor with more dimensions than ggml supports.
    #[error("corrupt GGUF file: tensor {name:?} has {n_dims} dimensions, at most {max} allowed")]
    TooManyDims {
        /// The tensor.
        name: String,
        /// The count as read.
        n_dims: u32,
        /// The largest count accepted.
        max: usize,
    },
    /// A tensor type id that no ggml version defines (or one that was removed from the format).
    #[error("corrupt GGUF file: tensor {name:?} has unknown ggml type id {id}")]
    UnknownTensorType {
        /// The tensor.
        name: String,
        /// The id as read.
        id: u32,
    },
    /// A tensor shape whose element or byte count overflows, or whose rows are not a whole
    /// number of blocks of its type.
    #[error(
        "corrupt GGUF file: tensor {name:?} has an invalid shape {dims:?} for type {ggml_type}: {reason}"
    )]
    BadShape {
        /// The tensor.
        name: String,
        /// Its dimensions, innermost first.
        dims: Vec<u64>,
        /// Its type.
        ggml_type: GgmlType,
        /// What is wrong.
        reason: &'static str,
    },
    /// `general.alignment` is zero or not a power of two.
    #[error("corrupt GGUF file: general.alignment = {value} is not a power of two")]
    BadAlignment {
        /// The value as read.
        value: u64,
    },
    /// A tensor offset that is not a multiple of the file's alignment.
    #[error(
        "corrupt GGUF file: tensor {name:?} offset {offset} is not a multiple of the alignment {alignment}"
    )]
    MisalignedTensor {
        /// The tensor.
        name: String,
        /// Its offset relative to the data section.
        offset: u64,
        /// The file's alignment.
        alignment: u64,
    },
    /// Tensor data (or the start of the data section) past the end of the file.
    #[error("truncated GGUF file: {what} spans bytes {start}..{end} but the file has {file_len}")]
    OutOfBounds {
        /// What lies out of bounds (a tensor name, or "data section").
        what: String,
        /// Absolute start offset.
        start: u64,
        /// Absolute end offset (saturating).
        end: u64,
        /// The file length.
        file_len: u64,
    },
    /// No tensor of that name.
    #[error("no tensor named {name:?} in the GGUF file")]
    TensorNotFound {
        /// The name asked for.
        name: String,
    },
    /// A tensor type whose block layout this reader does not know, so its bytes cannot be
    /// delimited.
    #[error("tensor {name:?} has type {ggml_type}, whose data layout is not supported")]
    UnsupportedTensorType {
        /// The tensor.
        name: String,
        /// Its type.
        ggml_type: GgmlType,
    },
    /// A metadata key that is not present.
    #[error("GGUF metadata key {key:?} is missing")]
    MissingKey {
        /// The key.
        key: String,
    },
    /// A metadata value of another type than the one asked for.
    #[error("GGUF metadata key {key:?} holds {found}, expected {expected}")]
    WrongType {
        /// The key.
        key: String,
        /// What the accessor wanted.
        expected: &'static str,
        /// What the file holds (a value type, or `array of <type>`).
        found: String,
    },
    /// An integer value that does not fit the type asked for.
    #[error("GGUF metadata key {key:?} = {value} does not fit in {expected}")]
    OutOfRange {
        /// The key.
        key: String,
        /// The value, printed.
        value: String,
        /// The type asked for.
        expected: &'static str,
    },
}

/// Shorthand for results of the GGUF reader.
pub type Result<T, E = GgufError> = std::result::Result<T, E>;

impl GgufError {
    /// A `WrongType` error for `key`, describing the found value type.
    pub(crate) fn wrong_type(key: &str, expected: &'static str, found: ValueType) -> Self {
        GgufError::WrongType {
            key: key.to_owned(),
            expected,
            found: found.to_string(),
        }
    }
}
