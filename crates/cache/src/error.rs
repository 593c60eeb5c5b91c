//! The cache error type.

use crate::codec::CodecError;

/// Why a cache operation failed.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// A codec rejected a vector or could not be built.
    #[error(transparent)]
    Codec(#[from] CodecError),
    /// A bit allocation could not be resolved for this cache.
    #[error(transparent)]
    Allocation(#[from] Box<crate::allocation::AllocationError>),
    /// A two-tier codec could not be built or calibrated.
    #[error(transparent)]
    TwoTier(#[from] crate::two_tier::TwoTierError),
    /// A statically allocated cache is full.
    #[error("context overflow: the cache holds at most {capacity} tokens")]
    ContextOverflow {
        /// Tokens the cache was allocated for.
        capacity: usize,
    },
    /// A tensor handed to the cache has the wrong shape.
    #[error("shape mismatch for {what}: expected {expected} values, got {actual}")]
    ShapeMismatch {
        /// Which tensor.
        what: &'static str,
        /// Expected element count.
        expected: usize,
        /// Actual element count.
        actual: usize,
    },
    /// `positions.len − query_len` does not match what the cache already holds.
    #[error(
        "offset mismatch: the cache holds {cached} tokens but positions.len − query_len = {offset}"
    )]
    OffsetMismatch {
        /// Tokens already cached.
        cached: usize,
        /// The offset the call implies.
        offset: usize,
    },
    /// Positions must increase by one from the cache's next position.
    #[error("position {got} is not the next position {expected}")]
    PositionGap {
        /// The position the cache expects next.
        expected: u32,
        /// The position it was given.
        got: u32,
    },
    /// A rewind went further back than the state can restore exactly.
    #[error("cannot rewind {requested} tokens: {reason}")]
    RewindTooFar {
        /// Tokens the caller asked to drop.
        requested: usize,
        /// Why the state cannot do it.
        reason: &'static str,
    },
    /// The operation does not apply to this kind of state.
    #[error("state `{state}`: {reason}")]
    Unsupported {
        /// The state's name.
        state: String,
        /// What is not supported.
        reason: &'static str,
    },
    /// An invalid cache configuration.
    #[error("invalid cache configuration: {0}")]
    InvalidConfig(String),
    /// A store allocated up front (a static cache, a sliding-window ring, sink or recent
    /// copies) is larger than memory: its byte count overflows or the allocator refused it.
    #[error(
        "cannot allocate a store of {tokens} records of {bytes_per_record} bytes (its size overflows or memory is too small)"
    )]
    StorageTooLarge {
        /// Records asked for.
        tokens: usize,
        /// Bytes per record (code words and f16 scales).
        bytes_per_record: usize,
    },
}

impl From<crate::allocation::AllocationError> for CacheError {
    fn from(error: crate::allocation::AllocationError) -> Self {
        CacheError::Allocation(Box::new(error))
    }
}
