//! The one error type of this crate.

/// Everything that can go wrong when building, using or restoring a Lloyd-Max codebook.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum LloydMaxError {
    /// The bit width is outside `1..=8`.
    #[error("unsupported bit width {bits}: Lloyd-Max codebooks support 1..=8 bits")]
    UnsupportedBits {
        /// The rejected bit width.
        bits: u8,
    },
    /// The dimension is below the smallest one the law is defined for
    /// (`Beta` needs `dim >= 3`, `Gaussian` needs `dim >= 1`).
    #[error("dimension {dim} is too small for the {law} law (minimum {min})")]
    DimensionTooSmall {
        /// `"beta"` or `"gaussian"`.
        law: &'static str,
        /// The rejected dimension.
        dim: usize,
        /// The smallest supported dimension for this law.
        min: usize,
    },
    /// Newton's method (with its damped and Lloyd fallbacks) did not bring the fixed-point
    /// residual `max_k |c_k - E[X | cell k]|` below `1e-12` standard deviations.
    #[error(
        "Lloyd-Max solver did not converge: fixed-point residual {residual:e} standard deviations after {iterations} iterations"
    )]
    NotConverged {
        /// Iterations spent.
        iterations: usize,
        /// The best residual reached, in units of the law's standard deviation.
        residual: f64,
    },
    /// A series or continued fraction of the incomplete beta function did not converge.
    #[error("{function} did not converge at argument {argument}")]
    SpecialFunctionNotConverged {
        /// Which expansion failed.
        function: &'static str,
        /// The argument it failed at.
        argument: f64,
    },
    /// Input and output slices differ in length.
    #[error("length mismatch: {expected} inputs but {actual} outputs")]
    LengthMismatch {
        /// Length of the input slice.
        expected: usize,
        /// Length of the output slice.
        actual: usize,
    },
    /// A density helper was given NaN.
    #[error("argument is NaN")]
    NanArgument,
    /// A deserialized codebook violates an invariant (sizes, ordering, midpoints).
    #[error("invalid codebook: {reason}")]
    InvalidCodebook {
        /// Which invariant failed.
        reason: String,
    },
}
