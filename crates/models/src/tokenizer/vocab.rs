//! The tokenizer's description as GGUF stores it: tokens, merge rules, token types, the
//! pre-tokenizer and the special ids.

use crate::gguf::{Gguf, Metadata};

use super::error::{Result, TokenizerError};

/// The kind of a token, as llama.cpp numbers them in `tokenizer.ggml.token_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum TokenType {
    /// No type given (treated like `Normal`).
    Undefined = 0,
    /// An ordinary BPE token.
    Normal = 1,
    /// The unknown-token marker.
    Unknown = 2,
    /// A control token such as `<|im_start|>`: recognized in text as one token, printed as its
    /// text.
    Control = 3,
    /// A token added by the model's authors, always recognized in text as one token.
    UserDefined = 4,
    /// A token that is never produced.
    Unused = 5,
    /// A raw byte (used by SentencePiece vocabularies).
    Byte = 6,
}

impl TokenType {
    /// The type for llama.cpp's number, `None` outside 0..=6.
    pub fn from_i32(value: i32) -> Option<Self> {
        Some(match value {
            0 => TokenType::Undefined,
            1 => TokenType::Normal,
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => return None,
        })
    }

    /// Whether llama.cpp treats the token as special: matched whole in text and printed as its
    /// literal text rather than decoded from byte-level characters.
    pub fn is_special(self) -> bool {
        matches!(self, TokenType::Control | TokenType::Unknown)
    }
}

/// How text is split into words before BPE runs on each word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreTokenizerKind {
    /// GPT-2's regex: contractions, ` ?letters+`, ` ?digits+`, ` ?other+`, whitespace runs.
    Gpt2,
    /// Every digit (`\p{N}`) on its own, then the GPT-2 regex on the rest (SmolLM, StarCoder
    /// and others; `tokenizer.ggml.pre = smollm`).
    DigitsThenGpt2,
}

impl PreTokenizerKind {
    /// The kind for a `tokenizer.ggml.pre` name: the names llama.cpp maps to these two regex
    /// sets.
    pub fn from_gguf_name(name: &str) -> Option<Self> {
        match name {
            "gpt-2" | "gpt2" => Some(PreTokenizerKind::Gpt2),
            "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone"
            | "minerva-7b" => Some(PreTokenizerKind::DigitsThenGpt2),
            _ => None,
        }
    }
}

/// Everything needed to build a byte-level BPE [`Tokenizer`](super::Tokenizer).
///
/// Tokens are in GPT-2's byte-level spelling (a space is `Ġ`); merges are `"left right"`
/// strings, highest priority first.
#[derive(Debug, Clone, PartialEq)]
pub struct BpeVocab {
    /// The token strings, indexed by id.
    pub tokens: Vec<String>,
    /// One type per token.
    pub token_types: Vec<TokenType>,
    /// The merge rules, highest priority first.
    pub merges: Vec<String>,
    /// The pre-tokenizer.
    pub pre_tokenizer: PreTokenizerKind,
    /// The beginning-of-sequence id.
    pub bos_id: Option<u32>,
    /// The end-of-sequence id.
    pub eos_id: Option<u32>,
    /// Whether encoding prepends the BOS token.
    pub add_bos: bool,
    /// Whether encoding appends the EOS token.
    pub add_eos: bool,
}

const MODEL_KEY: &str = "tokenizer.ggml.model";
const PRE_KEY: &str = "tokenizer.ggml.pre";
const TOKENS_KEY: &str = "tokenizer.ggml.tokens";
const TYPES_KEY: &str = "tokenizer.ggml.token_type";
const MERGES_KEY: &str = "tokenizer.ggml.merges";
const BOS_KEY: &str = "tokenizer.ggml.bos_token_id";
const EOS_KEY: &str = "tokenizer.ggml.eos_token_id";
const ADD_BOS_KEY: &str = "tokenizer.ggml.add_bos_token";
const ADD_EOS_KEY: &str = "tokenizer.ggml.add_eos_token";

impl BpeVocab {
    /// Reads the tokenizer keys of a GGUF file.
    pub fn from_gguf(gguf: &Gguf) -> Result<Self> {
        Self::from_metadata(gguf.metadata())
    }

    /// Reads the tokenizer keys from GGUF metadata: `tokenizer.ggml.model` must be `gpt2`;
    /// `tokens`, `merges` and `pre` are required; `token_type` (default: all normal),
    /// `bos_token_id`, `eos_token_id`, `add_bos_token` and `add_eos_token` (default false) are
    /// optional.
    pub fn from_metadata(metadata: &Metadata) -> Result<Self> {
        let model = metadata.str(MODEL_KEY)?;
        if model != "gpt2" {
            return Err(TokenizerError::UnsupportedModel {
                model: model.to_owned(),
            });
        }
        let pre = metadata.str(PRE_KEY)?;
        let pre_tokenizer = PreTokenizerKind::from_gguf_name(pre).ok_or_else(|| {
            TokenizerError::UnsupportedPreTokenizer {
                pre: pre.to_owned(),
            }
        })?;
        let tokens = metadata.array_str(TOKENS_KEY)?.to_vec();
        let token_types = if metadata.contains_key(TYPES_KEY) {
            metadata
                .array_i32(TYPES_KEY)?
                .iter()
                .enumerate()
                .map(|(id, &value)| {
                    TokenType::from_i32(value).ok_or(TokenizerError::UnknownTokenType {
                        id: id as u32,
                        value,
                    })
                })
                .collect::<Result<Vec<_>>>()?
        } else {
            vec![TokenType::Normal; tokens.len()]
        };
        let merges = metadata.array_str(MERGES_KEY)?.to_vec();
        let optional_id = |key| -> Result<Option<u32>> {
            if metadata.contains_key(key) {
                Ok(Some(metadata.u32(key)?))
            } else {
                Ok(None)
            }
        };
        let optional_flag = |key| -> Result<bool> {
            if metadata.contains_key(key) {
                Ok(metadata.bool(key)?)
            } else {
                Ok(false)
            }
        };
        let vocab = BpeVocab {
            tokens,
            token_types,
            merges,
            pre_tokenizer,
            bos_id: optional_id(BOS_KEY)?,
            eos_id: optional_id(EOS_KEY)?,
            add_bos: optional_flag(ADD_BOS_KEY)?,
            add_eos: optional_flag(ADD_EOS_KEY)?,
        };
        vocab.validate()?;
        Ok(vocab)
    }

    /// Checks the sizes and ids that the builder relies on.
    pub(crate) fn validate(&self) -> Result<()> {
        let size = self.tokens.len();
        if size == 0 || u32::try_from(size).is_err() {
            return Err(TokenizerError::BadVocabSize { size });
        }
        if self.token_types.len() != size {
            return Err(TokenizerError::TypeCountMismatch {
                tokens: size,
                types: self.token_types.len(),
            });
        }
        for (key, id) in [(BOS_KEY, self.bos_id), (EOS_KEY, self.eos_id)] {
            match id {
                Some(id) if id as usize >= size => {
                    return Err(TokenizerError::SpecialIdOutOfRange {
                        key,
                        id,
                        vocab_size: size,
                    });
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The merge rules as pairs, keeping the first occurrence of a repeated rule (its rank is
    /// the one llama.cpp uses).
    pub(crate) fn merge_pairs(&self) -> Result<Vec<(String, String)>> {
        let mut seen = std::collections::HashSet::with_capacity(self.merges.len());
        let mut pairs = Vec::with_capacity(self.merges.len());
        for (index, rule) in self.merges.iter().enumerate() {
            // The separator is the first space after the first character: byte-level tokens
            // never contain a space, but a hand-made left token might start with one.
            let first_len = rule.chars().next().map_or(0, char::len_utf8);
            let split = rule[first_len..].find(' ').map(|i| i + first_len);
            let Some(split) = split else {
                return Err(TokenizerError::BadMerge {
                    index,
                    rule: rule.clone(),
                });
            };
            let (left, right) = (&rule[..split], &rule[split + 1..]);
            if right.is_empty() {
                return Err(TokenizerError::BadMerge {
                    index,
                    rule: rule.clone(),
                });
            }
            if seen.insert((left, right)) {
                pairs.push((left.to_owned(), right.to_owned()));
            }
        }
        Ok(pairs)
    }
}
