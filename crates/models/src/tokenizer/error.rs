//! The one error type of the tokenizer.

use crate::gguf::GgufError;

/// Everything that can go wrong building or using a [`Tokenizer`](super::Tokenizer).
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// A tokenizer key is missing from the GGUF metadata or has the wrong type.
    #[error("cannot read the tokenizer from the GGUF metadata: {0}")]
    Metadata(#[from] GgufError),
    /// `tokenizer.ggml.model` names a tokenizer other than byte-level BPE (`gpt2`) or
    /// SentencePiece-style scored pieces (`llama`).
    #[error(
        "unsupported tokenizer model {model:?}: implemented are byte-level BPE (\"gpt2\") and \
         SentencePiece-style scored pieces (\"llama\")"
    )]
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
    /// The score array does not have one entry per token.
    #[error("{scores} token scores for {tokens} tokens")]
    ScoreCountMismatch {
        /// The number of tokens.
        tokens: usize,
        /// The number of scores.
        scores: usize,
    },
    /// A token score is NaN (scores order the merges, so every one must compare).
    #[error("token {id} has a NaN score")]
    NanScore {
        /// The token id.
        id: u32,
    },
    /// A token of type byte whose text is not `<0xHH>`.
    #[error("token {id} has type byte but its text {text:?} is not of the form <0xHH>")]
    BadByteToken {
        /// The token id.
        id: u32,
        /// The token text.
        text: String,
    },
    /// The file asks to add BOS or EOS but names no such token.
    #[error("{flag} is true but {key} is not set")]
    AddWithoutId {
        /// The flag key, e.g. `tokenizer.ggml.add_bos_token`.
        flag: &'static str,
        /// The id key, e.g. `tokenizer.ggml.bos_token_id`.
        key: &'static str,
    },
    /// A character that is no token and whose byte has no byte-fallback token.
    #[error("byte 0x{byte:02X} is in no token and the vocabulary has no <0x{byte:02X}> token")]
    NoByteToken {
        /// The byte.
        byte: u8,
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
