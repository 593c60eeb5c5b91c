//! The one error type of the crate.

use tq_rotation::RotationError;

/// Everything that can go wrong when building a sketch or feeding it data.
///
/// Bad input (a wrong length, a NaN, an unsupported parameter) is reported here instead of
/// panicking, so a cache can reject one corrupt vector without taking the process down.
#[derive(Debug, thiserror::Error)]
pub enum QjlError {
    /// A sketch needs at least one dimension.
    #[error("sketch dimension must be at least 1")]
    ZeroDimension,

    /// The sketch matrix would not fit in memory (or its size overflows `usize`).
    #[error("a {dim}x{dim} sketch matrix is too large to allocate")]
    SketchTooLarge {
        /// The requested dimension.
        dim: usize,
    },

    /// The shrinkage factor α must be finite and strictly positive.
    #[error("shrinkage must be finite and > 0, got {value}")]
    InvalidShrinkage {
        /// The rejected value.
        value: f32,
    },

    /// A residual norm γ passed back in must be finite and non-negative.
    #[error("residual norm gamma must be finite and >= 0, got {value}")]
    InvalidGamma {
        /// The rejected value.
        value: f32,
    },

    /// A buffer has the wrong length.
    #[error("{buffer} has length {actual}, expected {expected}")]
    LengthMismatch {
        /// Which argument was wrong (`"input"`, `"scratch"`, `"bits"`, ...).
        buffer: &'static str,
        /// The length the sketch needs.
        expected: usize,
        /// The length that was passed.
        actual: usize,
    },

    /// An input vector holds a NaN or an infinity.
    #[error("{buffer}[{index}] is not finite")]
    NonFinite {
        /// Which argument held the value.
        buffer: &'static str,
        /// The first offending index.
        index: usize,
    },

    /// ‖r‖ is finite in `f64` but exceeds `f32::MAX`, so γ cannot be stored.
    #[error("the residual norm overflows f32")]
    NormOverflow,

    /// The orthogonal sketch matrix could not be built.
    #[error("rotation: {0}")]
    Rotation(#[from] RotationError),
}
