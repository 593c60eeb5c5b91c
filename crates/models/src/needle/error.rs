//! The needle harness's error type.

use crate::llama::ModelError;
use crate::tokenizer::TokenizerError;

/// Why a needle cell could not be built or run.
#[derive(Debug, thiserror::Error)]
pub enum NeedleError {
    /// The spec file is not valid TOML or lacks a required key.
    #[error("needle spec: {0}")]
    Toml(#[from] toml::de::Error),
    /// The spec parses but cannot be used (empty filler, no facts, ...).
    #[error("needle spec: {0}")]
    Spec(String),
    /// A depth outside [0, 1] (or not a number).
    #[error("needle depth {0} is not in [0, 1]")]
    Depth(f64),
    /// The template, needle and question alone take more tokens than the context.
    #[error(
        "context of {context} tokens is too short: the template, needle and question alone take {needed}"
    )]
    ContextTooShort {
        /// The requested context.
        context: usize,
        /// Tokens without any filler.
        needed: usize,
    },
    /// The prompt plus the answer would not fit the model's window.
    #[error("{needed} tokens (prompt and answer) exceed the model's context of {limit}")]
    ContextTooLong {
        /// Prompt tokens plus answer tokens.
        needed: usize,
        /// The model's context length.
        limit: usize,
    },
    /// Options that cannot be used together.
    #[error("needle options: {0}")]
    Options(String),
    /// Tokenization failed.
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    /// The model or its cache failed.
    #[error(transparent)]
    Model(#[from] ModelError),
}
