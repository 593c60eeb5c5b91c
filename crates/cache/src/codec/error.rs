//! The codec error type.

use tq_lloyd_max::LloydMaxError;
use tq_qjl::QjlError;
use tq_rotation::RotationError;

/// Why a codec could not be built or could not encode/decode a vector.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    /// The bit width is outside what the codec supports.
    #[error("unsupported bit width {bits} (supported: {supported})")]
    UnsupportedBits {
        /// The requested width.
        bits: u8,
        /// The supported range, in words.
        supported: &'static str,
    },
    /// A buffer has the wrong length.
    #[error("{what}: expected length {expected}, got {actual}")]
    LengthMismatch {
        /// Which buffer.
        what: &'static str,
        /// The length the codec needs.
        expected: usize,
        /// The length it was given.
        actual: usize,
    },
    /// A code does not fit in the bit width.
    #[error("code {code} does not fit in {bits} bits")]
    CodeOutOfRange {
        /// The offending code.
        code: u8,
        /// The bit width.
        bits: u8,
    },
    /// The input vector holds NaN or ±Inf.
    #[error("input coordinate {index} is not finite ({value})")]
    NonFinite {
        /// Index of the first non-finite coordinate.
        index: usize,
        /// Its value.
        value: f32,
    },
    /// The vector norm does not fit in the f16 the layout stores.
    #[error("vector norm {norm} exceeds the f16 range of the packed layout (max 65504)")]
    NormOutOfRange {
        /// The norm that overflowed.
        norm: f32,
    },
    /// The options contradict each other.
    #[error("invalid codec configuration: {0}")]
    InvalidConfig(&'static str),
    /// Building the rotation failed.
    #[error(transparent)]
    Rotation(#[from] RotationError),
    /// Building the codebook failed.
    #[error(transparent)]
    Codebook(#[from] LloydMaxError),
    /// Building or using the QJL sketch failed.
    #[error(transparent)]
    Qjl(#[from] QjlError),
}
