//! The model error type.

use tq_cache::CacheError;

use crate::gguf::GgufError;
use crate::quant::QuantError;
use crate::tokenizer::TokenizerError;

/// Why a model could not be loaded or run.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The file is not a usable GGUF.
    #[error(transparent)]
    Gguf(#[from] GgufError),
    /// A weight tensor has an unusable format or shape.
    #[error(transparent)]
    Quant(#[from] QuantError),
    /// The cache refused an operation (context overflow, bad allocation, ...).
    #[error(transparent)]
    Cache(#[from] CacheError),
    /// Tokenization failed.
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    /// The file is a GGUF but not a model this code runs.
    #[error("unsupported model: {0}")]
    Unsupported(String),
    /// A tensor has the wrong shape.
    #[error("tensor `{name}` has shape {actual:?}, expected {expected:?}")]
    Shape {
        /// Tensor name.
        name: String,
        /// Expected dims (innermost first).
        expected: Vec<u64>,
        /// Actual dims.
        actual: Vec<u64>,
    },
    /// A token id outside the vocabulary.
    #[error("token id {id} is outside the vocabulary of {vocab}")]
    TokenOutOfRange {
        /// The id.
        id: u32,
        /// Vocabulary size.
        vocab: usize,
    },
    /// A position at or beyond the model's trained context.
    #[error(
        "position {position} is beyond the model's trained context of {context} tokens: \
         shorten the input (or the requested context) to at most {context} tokens"
    )]
    ContextOverflow {
        /// The first position out of range.
        position: usize,
        /// The trained context length.
        context: usize,
    },
    /// The call's arguments contradict each other.
    #[error("invalid forward call: {0}")]
    InvalidCall(String),
    /// The GPU attention backend failed: no adapter, a driver error (with its message), or a
    /// cache configuration the GPU kernels do not implement (`GpuError::Unsupported`).
    #[error(transparent)]
    Gpu(#[from] tq_attention_wgpu::GpuError),
}
