//! The crate's one error type.

use crate::RotationKind;

/// Everything that can go wrong when building or applying a [`Rotation`](crate::Rotation).
///
/// Every variant is a property of the caller's input; none is an internal failure.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RotationError {
    /// A rotation of dimension 0 was requested.
    #[error("rotation dimension must be at least 1")]
    ZeroDimension,
    /// The requested dimension exceeds what this kind supports (see [`RotationKind::max_dim`]).
    #[error("dimension {dim} exceeds the maximum {max} supported by {kind:?} rotations")]
    DimensionTooLarge {
        /// The kind of rotation that was requested.
        kind: RotationKind,
        /// The requested dimension.
        dim: usize,
        /// The largest supported dimension for this kind.
        max: usize,
    },
    /// A vector (or, for batches, the output buffer) has the wrong length.
    #[error("length {actual} does not match the expected length {expected}")]
    DimensionMismatch {
        /// The length the rotation needed: its dimension, or for a batch the input length.
        expected: usize,
        /// The length that was passed.
        actual: usize,
    },
    /// A batch buffer's length is not a whole number of vectors.
    #[error("batch length {len} is not a multiple of the rotation dimension {dim}")]
    BatchLength {
        /// The length of the batch buffer.
        len: usize,
        /// The rotation's dimension.
        dim: usize,
    },
}
