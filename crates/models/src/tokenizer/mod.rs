//! The tokenizers GGUF files declare, built from their metadata, matching llama.cpp token for
//! token.
//!
//! [`Tokenizer::from_gguf`] reads `tokenizer.ggml.model` and builds one of two:
//!
//! - `gpt2`, **byte-level BPE** (SmolLM2; see [`BpeVocab::from_metadata`]), with the Hugging
//!   Face `tokenizers` crate: special tokens written in the text are recognized whole (as
//!   llama.cpp does with `parse_special = true`), then the pre-tokenizer named by
//!   `tokenizer.ggml.pre` splits words, then BPE merges them.
//! - `llama`, **SentencePiece-style scored pieces** (Gemma 3; see [`SpmVocab::from_metadata`]):
//!   special and user-defined tokens cut out first, then pieces merged by score with byte
//!   fallback — a direct transcription of llama.cpp's algorithm (`spm` module), since the
//!   `tokenizers` crate has no model that computes it (its Unigram is a different algorithm,
//!   and a BPE built from synthesized merges breaks ties differently).
//!
//! Decoding maps each token back to its bytes (control tokens to their literal text).
//!
//! A byte the vocabulary has no token for is dropped by the BPE encoder, as llama.cpp drops it
//! (`llm_tokenizer_bpe_session::tokenize`: a symbol that is not a token falls back to its single
//! bytes, and a byte that is not a token either is skipped). SmolLM2's vocabulary lacks 21 of
//! the 256 byte tokens: the control bytes 0x04, 0x06, 0x13, 0x14, 0x16, 0x1D, the lead bytes
//! 0xF1 and 0xF2 of the rare characters U+40000–U+BFFFF, and bytes no UTF-8 text contains. So
//! `decode(encode(text)) == text` holds exactly for text without those bytes (found by the
//! tokenizer fuzz target, `docs/fuzzing.md`).
//!
//! ```no_run
//! use tq_models::gguf::Gguf;
//! use tq_models::tokenizer::Tokenizer;
//!
//! let gguf = Gguf::open(tq_models::fetch::reference_model_path())?;
//! let tokenizer = Tokenizer::from_gguf(&gguf)?;
//! let ids = tokenizer.encode("The capital of France is")?;
//! assert_eq!(ids, [504, 3575, 282, 4649, 314]);
//! assert_eq!(tokenizer.decode(&ids)?, "The capital of France is");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod build;
mod byte_level;
mod error;
mod spm;
mod spm_vocab;
mod vocab;

pub use error::{Result, TokenizerError};
pub use spm_vocab::SpmVocab;
pub use vocab::{BpeVocab, PreTokenizerKind, TokenType};

use crate::gguf::Gguf;

/// A tokenizer built from a GGUF file, a [`BpeVocab`] (byte-level BPE, GPT-2 family) or an
/// [`SpmVocab`] (SentencePiece-style scored pieces).
///
/// ```
/// use tq_models::tokenizer::{BpeVocab, PreTokenizerKind, TokenType, Tokenizer};
///
/// // All 256 byte characters, one merge ("h" + "i"), and one control token.
/// let mut tokens: Vec<String> = (0u8..=255).map(|b| Tokenizer::byte_token(b).to_string()).collect();
/// tokens.extend(["hi".to_owned(), "<|end|>".to_owned()]);
/// let mut token_types = vec![TokenType::Normal; 257];
/// token_types.push(TokenType::Control);
/// let tokenizer = Tokenizer::from_vocab(BpeVocab {
///     tokens,
///     token_types,
///     merges: vec!["h i".to_owned()],
///     pre_tokenizer: PreTokenizerKind::DigitsThenGpt2,
///     bos_id: None,
///     eos_id: Some(257),
///     add_bos: false,
///     add_eos: false,
/// })?;
/// assert_eq!(tokenizer.encode("hi<|end|>")?, [256, 257]);
/// assert_eq!(tokenizer.encode("42")?, [u32::from(b'4'), u32::from(b'2')]);
/// assert_eq!(tokenizer.decode(&[256, 257])?, "hi<|end|>");
/// # Ok::<(), tq_models::tokenizer::TokenizerError>(())
/// ```
pub struct Tokenizer {
    encoder: Encoder,
    /// The bytes each token stands for, indexed by id.
    pieces: Vec<Vec<u8>>,
    token_types: Vec<TokenType>,
    bos_id: Option<u32>,
    eos_id: Option<u32>,
    add_bos: bool,
    add_eos: bool,
}

/// The algorithm that turns text into ids.
enum Encoder {
    /// Byte-level BPE through the `tokenizers` pipeline.
    Bpe(Box<tokenizers::Tokenizer>),
    /// SentencePiece-style merging by score.
    Spm(Box<spm::SpmEncoder>),
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The pipeline's own Debug prints the whole vocabulary.
        let kind = match self.encoder {
            Encoder::Bpe(_) => "bpe",
            Encoder::Spm(_) => "spm",
        };
        f.debug_struct("Tokenizer")
            .field("kind", &kind)
            .field("vocab_size", &self.vocab_size())
            .field("bos_id", &self.bos_id)
            .field("eos_id", &self.eos_id)
            .field("add_bos", &self.add_bos)
            .field("add_eos", &self.add_eos)
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Builds the tokenizer described by a GGUF file's metadata: byte-level BPE for
    /// `tokenizer.ggml.model = "gpt2"`, SentencePiece-style for `"llama"`.
    pub fn from_gguf(gguf: &Gguf) -> Result<Self> {
        let model = gguf.metadata().str("tokenizer.ggml.model")?;
        if model == spm_vocab::SPM_MODEL_NAME {
            Self::from_spm_vocab(SpmVocab::from_gguf(gguf)?)
        } else {
            Self::from_vocab(BpeVocab::from_gguf(gguf)?)
        }
    }

    /// Builds the SentencePiece-style tokenizer for `vocab`.
    pub fn from_spm_vocab(vocab: SpmVocab) -> Result<Self> {
        vocab.validate()?;
        let encoder = spm::SpmEncoder::new(&vocab);
        Ok(Tokenizer {
            encoder: Encoder::Spm(Box::new(encoder)),
            pieces: vocab.pieces(),
            token_types: vocab.token_types,
            bos_id: vocab.bos_id,
            eos_id: vocab.eos_id,
            add_bos: vocab.add_bos,
            add_eos: vocab.add_eos,
        })
    }

    /// Builds the tokenizer for `vocab`.
    pub fn from_vocab(vocab: BpeVocab) -> Result<Self> {
        vocab.validate()?;
        let pipeline = build::build_pipeline(&vocab)?;
        let decoder = byte_level::CharToByte::new();
        let pieces = vocab
            .tokens
            .iter()
            .zip(&vocab.token_types)
            .map(|(token, kind)| {
                if kind.is_special() {
                    token.as_bytes().to_vec()
                } else {
                    decoder.decode_token(token)
                }
            })
            .collect();
        Ok(Tokenizer {
            encoder: Encoder::Bpe(Box::new(pipeline)),
            pieces,
            token_types: vocab.token_types,
            bos_id: vocab.bos_id,
            eos_id: vocab.eos_id,
            add_bos: vocab.add_bos,
            add_eos: vocab.add_eos,
        })
    }

    /// The GPT-2 character that spells byte `b` in a byte-level vocabulary (`Ġ` for a space).
    pub fn byte_token(b: u8) -> char {
        byte_level::byte_to_char_table()[usize::from(b)]
    }

    /// Token ids for `text`. Special tokens written in the text (`<|im_start|>`, ...) become
    /// their ids; BOS/EOS are added only when the file asks for it (`add_bos_token`,
    /// `add_eos_token`).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let mut ids = Vec::with_capacity(text.len() / 3 + 2);
        if self.add_bos {
            ids.extend(self.bos_id);
        }
        match &self.encoder {
            Encoder::Bpe(pipeline) => {
                let encoding = pipeline
                    .encode(text, false)
                    .map_err(|err| TokenizerError::Encode(err.to_string()))?;
                ids.extend_from_slice(encoding.get_ids());
            }
            Encoder::Spm(encoder) => ids.extend(encoder.encode(text, true)?),
        }
        if self.add_eos {
            ids.extend(self.eos_id);
        }
        Ok(ids)
    }

    /// The text of `ids`: their pieces concatenated, control tokens as their literal text, and
    /// byte sequences that are not UTF-8 replaced by U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        let mut bytes = Vec::new();
        for &id in ids {
            bytes.extend_from_slice(self.token_to_piece(id)?);
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// The bytes token `id` stands for. A piece may be part of a UTF-8 character (byte-level
    /// tokens split multi-byte characters), so streaming output should buffer bytes, not
    /// decode each piece alone.
    pub fn token_to_piece(&self, id: u32) -> Result<&[u8]> {
        self.pieces
            .get(id as usize)
            .map(Vec::as_slice)
            .ok_or(TokenizerError::UnknownId {
                id,
                vocab_size: self.vocab_size(),
            })
    }

    /// The id of the token whose text is exactly `text` (e.g. `<|im_end|>`), if any.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        match &self.encoder {
            Encoder::Bpe(pipeline) => pipeline.token_to_id(text),
            Encoder::Spm(encoder) => encoder.token_id(text),
        }
    }

    /// The type of token `id`.
    pub fn token_type(&self, id: u32) -> Option<TokenType> {
        self.token_types.get(id as usize).copied()
    }

    /// The number of tokens.
    pub fn vocab_size(&self) -> usize {
        self.pieces.len()
    }

    /// The beginning-of-sequence id, if the file names one.
    pub fn bos_id(&self) -> Option<u32> {
        self.bos_id
    }

    /// The end-of-sequence id, if the file names one.
    pub fn eos_id(&self) -> Option<u32> {
        self.eos_id
    }

    /// Whether [`encode`](Self::encode) prepends BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Whether `id` is the end-of-sequence token (for SmolLM2-Instruct, id 2, `<|im_end|>`, which
    /// ends an assistant turn).
    pub fn is_eos(&self, id: u32) -> bool {
        Some(id) == self.eos_id
    }
}
