//! The SentencePiece-style vocabulary as GGUF stores it (`tokenizer.ggml.model = "llama"`):
//! tokens with scores and types, no merges, the special ids and the encoding flags.

use crate::gguf::{Gguf, Metadata, MetadataArray, MetadataValue};

use super::error::{Result, TokenizerError};
use super::spm::CONTROL_LOOKING;
use super::vocab::TokenType;

/// Everything needed to build a SentencePiece-style [`Tokenizer`](super::Tokenizer): scored
/// pieces (`▁` U+2581 stands for a space), byte-fallback tokens `<0x00>`…`<0xFF>`, and the
/// special ids.
///
/// ```
/// use tq_models::tokenizer::{SpmVocab, TokenType, Tokenizer};
///
/// // Three byte tokens, two scored pieces, a control token. In "ab b" (escaped "ab▁b") the
/// // pair "▁b" outscores "ab" and merges first; then "ab" merges.
/// let vocab = SpmVocab {
///     tokens: ["<0x61>", "<0x62>", "<0x20>", "ab", "▁b", "<s>"].map(String::from).to_vec(),
///     scores: vec![0.0, 0.0, 0.0, -2.0, -1.0, 0.0],
///     token_types: [6, 6, 6, 1, 1, 3].map(|t| TokenType::from_i32(t).unwrap()).to_vec(),
///     bos_id: Some(5),
///     eos_id: None,
///     add_bos: true,
///     add_eos: false,
///     add_space_prefix: false,
/// };
/// let tokenizer = Tokenizer::from_spm_vocab(vocab)?;
/// assert_eq!(tokenizer.encode("ab b")?, [5, 3, 4]);
/// // "a▁" is no token and "▁b" wins over nothing: "a" falls back to its byte.
/// assert_eq!(tokenizer.encode("a b")?, [5, 0, 4]);
/// assert_eq!(tokenizer.decode(&[3, 4])?, "ab b");
/// # Ok::<(), tq_models::tokenizer::TokenizerError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct SpmVocab {
    /// The token strings, indexed by id.
    pub tokens: Vec<String>,
    /// One score per token: a higher score merges first.
    pub scores: Vec<f32>,
    /// One type per token.
    pub token_types: Vec<TokenType>,
    /// The beginning-of-sequence id.
    pub bos_id: Option<u32>,
    /// The end-of-sequence id.
    pub eos_id: Option<u32>,
    /// Whether encoding prepends the BOS token.
    pub add_bos: bool,
    /// Whether encoding appends the EOS token.
    pub add_eos: bool,
    /// Whether a space is put before the text of each fragment that starts the text or follows
    /// a special token (SentencePiece's dummy prefix).
    pub add_space_prefix: bool,
}

const MODEL_KEY: &str = "tokenizer.ggml.model";
const TOKENS_KEY: &str = "tokenizer.ggml.tokens";
const SCORES_KEY: &str = "tokenizer.ggml.scores";
const TYPES_KEY: &str = "tokenizer.ggml.token_type";
const BOS_KEY: &str = "tokenizer.ggml.bos_token_id";
const EOS_KEY: &str = "tokenizer.ggml.eos_token_id";
const ADD_BOS_KEY: &str = "tokenizer.ggml.add_bos_token";
const ADD_EOS_KEY: &str = "tokenizer.ggml.add_eos_token";
const ADD_PREFIX_KEY: &str = "tokenizer.ggml.add_space_prefix";

/// The name of this tokenizer model in `tokenizer.ggml.model`.
pub(crate) const SPM_MODEL_NAME: &str = "llama";

impl SpmVocab {
    /// Reads the tokenizer keys of a GGUF file.
    pub fn from_gguf(gguf: &Gguf) -> Result<Self> {
        Self::from_metadata(gguf.metadata())
    }

    /// Reads the tokenizer keys from GGUF metadata with llama.cpp's defaults for a `llama`
    /// (SentencePiece) vocabulary: `tokens` required; `scores` (f32 or i32; default 0),
    /// `token_type` (default normal), `bos_token_id` (default 1), `eos_token_id` (default 2),
    /// `add_bos_token` (default true), `add_eos_token` (default false) and `add_space_prefix`
    /// (default true) optional. A default id outside the vocabulary means "none", as in
    /// llama.cpp; an id read from the file outside it is an error.
    pub fn from_metadata(metadata: &Metadata) -> Result<Self> {
        let model = metadata.str(MODEL_KEY)?;
        if model != SPM_MODEL_NAME {
            return Err(TokenizerError::UnsupportedModel {
                model: model.to_owned(),
            });
        }
        let tokens: Vec<String> = metadata
            .array_str(TOKENS_KEY)?
            .iter()
            .enumerate()
            // llama.cpp renames empty tokens, so they can neither match nor vanish in decoding.
            .map(|(i, t)| {
                if t.is_empty() {
                    format!("[EMPTY_{i}]")
                } else {
                    t.to_owned()
                }
            })
            .collect();
        let scores = match metadata.get(SCORES_KEY) {
            None => vec![0.0; tokens.len()],
            Some(MetadataValue::Array(MetadataArray::F32(v))) => v.clone(),
            Some(MetadataValue::Array(MetadataArray::I32(v))) => {
                v.iter().map(|&s| s as f32).collect()
            }
            Some(_) => metadata.array_f32(SCORES_KEY)?.to_vec(),
        };
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
        let size = tokens.len();
        let id = |key, default: u32| -> Result<Option<u32>> {
            if metadata.contains_key(key) {
                Ok(Some(metadata.u32(key)?))
            } else {
                Ok((default < size as u32).then_some(default))
            }
        };
        let flag = |key, default| -> Result<bool> {
            if metadata.contains_key(key) {
                Ok(metadata.bool(key)?)
            } else {
                Ok(default)
            }
        };
        let vocab = SpmVocab {
            bos_id: id(BOS_KEY, 1)?,
            eos_id: id(EOS_KEY, 2)?,
            add_bos: flag(ADD_BOS_KEY, true)?,
            add_eos: flag(ADD_EOS_KEY, false)?,
            add_space_prefix: flag(ADD_PREFIX_KEY, true)?,
            tokens,
            scores,
            token_types,
        };
        vocab.validate()?;
        Ok(vocab)
    }

    /// Checks sizes, scores, byte tokens and special ids (everything the encoder relies on).
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
        if self.scores.len() != size {
            return Err(TokenizerError::ScoreCountMismatch {
                tokens: size,
                scores: self.scores.len(),
            });
        }
        if let Some(id) = self.scores.iter().position(|s| s.is_nan()) {
            return Err(TokenizerError::NanScore { id: id as u32 });
        }
        for (id, (text, kind)) in self.tokens.iter().zip(&self.token_types).enumerate() {
            if *kind == TokenType::Byte && byte_of_token(text).is_none() {
                return Err(TokenizerError::BadByteToken {
                    id: id as u32,
                    text: text.clone(),
                });
            }
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
        for (flag, set, key) in [
            (ADD_BOS_KEY, self.add_bos && self.bos_id.is_none(), BOS_KEY),
            (ADD_EOS_KEY, self.add_eos && self.eos_id.is_none(), EOS_KEY),
        ] {
            if set {
                return Err(TokenizerError::AddWithoutId { flag, key });
            }
        }
        Ok(())
    }

    /// The bytes each token stands for, as llama.cpp's `token_to_piece` with specials shown:
    /// control, unknown and user-defined tokens as their text, normal tokens with `▁` turned
    /// back into spaces, byte tokens as their byte, unused and undefined tokens as nothing.
    pub(crate) fn pieces(&self) -> Vec<Vec<u8>> {
        self.tokens
            .iter()
            .zip(&self.token_types)
            .map(|(text, kind)| match kind {
                // llama.cpp forces these names to control, which prints them as they are.
                _ if CONTROL_LOOKING.contains(&text.as_str()) => text.as_bytes().to_vec(),
                TokenType::Control | TokenType::Unknown | TokenType::UserDefined => {
                    text.as_bytes().to_vec()
                }
                TokenType::Normal => text.replace('\u{2581}', " ").into_bytes(),
                // Checked by `validate`.
                TokenType::Byte => byte_of_token(text).map(|b| vec![b]).unwrap_or_default(),
                TokenType::Unused | TokenType::Undefined => Vec::new(),
            })
            .collect()
    }
}

/// The byte of a byte token `<0xHH>` (two hex digits, either case), `None` for other text.
pub(crate) fn byte_of_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_tokens_parse() {
        assert_eq!(byte_of_token("<0x0A>"), Some(10));
        assert_eq!(byte_of_token("<0xff>"), Some(255));
        assert_eq!(byte_of_token("<0x0>"), None);
        assert_eq!(byte_of_token("<0x0AB>"), None);
        assert_eq!(byte_of_token("0x0A"), None);
        assert_eq!(byte_of_token("<0xZZ>"), None);
        // `from_str_radix` accepts a sign; a byte token never has one.
        assert_eq!(byte_of_token("<0x+1>"), None);
    }
}
