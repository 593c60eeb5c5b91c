//! The one error type of the tokenizer.

use crate::gguf::GgufError;

/// Everything that can go wrong building or using a [`Tokenizer`](super::Tokenizer).
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// A tokenizer key is missing from the GGUF metadata or has the wrong type.
    #[error("cannot read the tokenizer from the GGUF metadata: {0}")]
    Metadata(#[from] GgufError),
    /// `tokenizer.ggml.model` names a tokenizer other than byte-level BPE (`gpt2`).
    #[error("unsupported tokenizer model {model:?}: only byte-level BPE (\"gpt2\") is implemented")]
    UnsupportedModel {
        /// The model name as read.
        model: String,
    },
    /// `tokenizer.ggml.pre` names a pre-tokenizer this crate does not implement.
    #[error(
        "unsupported pre-tokenizer {pre:?}: implemented are \"gpt-2\" and the digit-splitting family of \"smollm\""
    )]
    UnsupportedPreTokenizer {
        /// The pre-tokenizer name as read.
        pre: String,
    },
    /// The vocabulary is empty or has more entries than `u32` ids can address.
    #[error("invalid vocabulary size {size}")]
    BadVocabSize {
        /// The number of tokens.
        size: usize,
    },
    /// The token-type array does not have one entry per token.
    #[error("{types} token types for {tokens} tokens")]
    TypeCountMismatch {
        /// The number of tokens.
        tokens: usize,
        /// The number of token types.
        types: usize,
    },
    /// A token type outside llama.cpp's 0..=6.
    #[error("token {id} has unknown token type {value}")]
    UnknownTokenType {
        /// The token id.
        id: u32,
        /// The type as read.
        value: i32,
    },
    /// A merge rule that is not two space-separated tokens.
    #[error("merge rule {index} ({rule:?}) is not two tokens separated by a space")]
    BadMerge {
        /// The rule's position in the merge list.
        index: usize,
        /// The rule as read.
        rule: String,
    },
    /// A special-token id (BOS, EOS) outside the vocabulary.
    #[error("{key} = {id} is outside the vocabulary of {vocab_size} tokens")]
    SpecialIdOutOfRange {
        /// The metadata key.
        key: &'static str,
        /// The id as read.
        id: u32,
        /// The vocabulary size.
        vocab_size: usize,
    },
    /// The underlying tokenizer library refused the vocabulary (e.g. a merge whose parts or
    /// result are not tokens).
    #[error("cannot build the BPE tokenizer: {0}")]
    Build(String),
    /// Encoding failed inside the tokenizer library.
    #[error("cannot encode text: {0}")]
    Encode(String),
    /// A token id outside the vocabulary.
    #[error("token id {id} is outside the vocabulary of {vocab_size} tokens")]
    UnknownId {
        /// The id.
        id: u32,
        /// The vocabulary size.
        vocab_size: usize,
    },
}

/// Shorthand for results of the tokenizer.
pub type Result<T, E = TokenizerError> = std::result::Result<T, E>;
