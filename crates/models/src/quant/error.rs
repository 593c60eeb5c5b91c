//! The error type of the quantized-weight module.

use super::kind::QuantKind;

/// Why a quantized-weight operation rejected its input.
///
/// Every check happens before any kernel runs: a kernel never sees a length, shape or value
/// it cannot handle, so bad input is always one of these, never a panic or garbage.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum QuantError {
    /// A row length is not a whole number of blocks of the format.
    #[error("{kind}: {cols} values per row is not a multiple of the block size {block}")]
    NotBlockMultiple {
        /// The format.
        kind: QuantKind,
        /// Values per row asked for.
        cols: usize,
        /// The format's block size in values.
        block: usize,
    },
    /// A byte buffer has the wrong length for the format and shape.
    #[error("{what}: expected {expected} bytes, got {actual}")]
    ByteLength {
        /// Which buffer.
        what: &'static str,
        /// Bytes the format and shape require.
        expected: usize,
        /// Bytes given.
        actual: usize,
    },
    /// An f32 buffer has the wrong number of values.
    #[error("{what}: expected {expected} values, got {actual}")]
    ShapeMismatch {
        /// Which buffer.
        what: &'static str,
        /// Values the shape requires.
        expected: usize,
        /// Values given.
        actual: usize,
    },
    /// `rows × row bytes` does not fit in `usize`.
    #[error("a {rows} × {cols} {kind} matrix does not fit in memory")]
    SizeOverflow {
        /// The format.
        kind: QuantKind,
        /// Rows asked for.
        rows: usize,
        /// Columns asked for.
        cols: usize,
    },
    /// A row index past the end of the matrix.
    #[error("row {index} out of range for a matrix of {rows} rows")]
    RowOutOfRange {
        /// The index asked for.
        index: usize,
        /// Rows the matrix has.
        rows: usize,
    },
    /// An activation is NaN or infinite (it cannot be quantized to Q8, and a forward pass that
    /// produced it is already broken).
    #[error("activation {index} is not finite ({value})")]
    NonFiniteActivation {
        /// Position in the activation buffer (row-major over all rows).
        index: usize,
        /// The value.
        value: f32,
    },
    /// The format has no quantized-activation (integer) dot product.
    #[error(
        "{kind} has no quantized-activation dot product (Q4_0, Q4_1, Q5_0 and Q8_0 take Q8 \
         activations, Q4_K and Q6_K Q8_K activations)"
    )]
    NoQ8Dot {
        /// The format.
        kind: QuantKind,
    },
    /// A ggml type id this module does not implement.
    #[error("unsupported ggml tensor type {id}")]
    UnsupportedGgmlType {
        /// The `ggml_type` value.
        id: u32,
    },
}
