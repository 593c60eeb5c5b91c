//! Quality and memory figures of a bit allocation on a real text, against the f16 cache.
//!
//! [`evaluate`] runs a token sequence through the model in prefill chunks (every chunk attends
//! to the compressed past, as in generation) once per allocation, in lockstep with a reference
//! allocation (the `f16` cache), and reports per allocation:
//!
//! - perplexity of the text and the mean next-token KL divergence `KL(P_ref ‖ P_alloc)` and
//!   top-1 agreement against the reference's distributions at the same positions
//!   ([`metrics`]);
//! - per layer, the relative error of the attention scores against the exact scores of the
//!   same queries on the unquantized keys, and the total-variation distance of the attention
//!   weights ([`score_probe`]);
//! - cache bytes per token by formula and as allocated, and the process peak RSS ([`memory`]).
//!
//! Lockstep, not one allocation after the other: the reference's log-probabilities are needed
//! at every position, and keeping them for a whole text costs `tokens × vocab × 4` bytes
//! (200 MB at 1K tokens for a 49K vocabulary); chunk by chunk it is one chunk's worth, and the
//! reference runs once however many allocations are compared.

pub mod kld;
pub mod memory;
pub mod metrics;
pub mod perplexity;
mod run;
pub mod score_probe;
pub mod sensitivity;

pub use perplexity::{PerplexityOptions, PerplexityReport, PerplexityRow, perplexity};
pub use run::{EvalOptions, EvalReport, EvalRow, evaluate};
pub use score_probe::{LayerScoreStats, ReconstructionStats, ScoreProbe};

use tq_cache::CacheError;
use tq_cache::allocation::AllocationError;

use crate::llama::ModelError;

/// Why an evaluation could not run.
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    /// The model refused a forward call.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The cache refused an operation.
    #[error(transparent)]
    Cache(#[from] CacheError),
    /// An allocation does not fit the model.
    #[error(transparent)]
    Allocation(#[from] AllocationError),
    /// The text is too short to score a single next-token prediction.
    #[error("the text has {0} tokens; at least 2 are needed to score a next-token prediction")]
    TooFewTokens(usize),
    /// The text does not fit the model's context window.
    #[error("{tokens} tokens exceed the model's context of {context} tokens")]
    TooManyTokens {
        /// Tokens asked for.
        tokens: usize,
        /// The model's context length.
        context: usize,
    },
    /// Arguments that contradict each other (no allocation, a zero chunk, logits of the
    /// wrong length).
    #[error("invalid evaluation call: {0}")]
    InvalidCall(String),
}
