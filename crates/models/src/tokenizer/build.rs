//! Assembling the Hugging Face `tokenizers` pipeline that reproduces llama.cpp's byte-level BPE.
//!
//! llama.cpp tokenizes in three stages, and so does the pipeline built here:
//! 1. special tokens written in the text (control and user-defined tokens) are cut out whole —
//!    `tokenizers`' added-token matching, which runs on the raw text first;
//! 2. the rest is split into words by the pre-tokenizer's regexes — `Digits` (one digit per
//!    piece) for the `smollm` family, then `ByteLevel`'s GPT-2 regex, which also respells every
//!    byte as its GPT-2 character;
//! 3. each word is merged by BPE rank — the `BPE` model with the file's merges, no unknown
//!    token and no merge-skipping (llama.cpp skips merges only for Llama 3).

use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::{AddedToken, Tokenizer as HfTokenizer};

use super::error::{Result, TokenizerError};
use super::vocab::{BpeVocab, PreTokenizerKind, TokenType};

/// Builds the `tokenizers` pipeline for `vocab` (already validated).
pub(crate) fn build_pipeline(vocab: &BpeVocab) -> Result<HfTokenizer> {
    // With repeated token strings the last id wins, as in llama.cpp's token-to-id map.
    let ids: Vocab = vocab
        .tokens
        .iter()
        .enumerate()
        .map(|(id, token)| (token.clone(), id as u32))
        .collect();
    let bpe = BPE::builder()
        .vocab_and_merges(ids, vocab.merge_pairs()?)
        .ignore_merges(false)
        .build()
        .map_err(|err| TokenizerError::Build(err.to_string()))?;

    let mut tokenizer = HfTokenizer::new(bpe);
    // ByteLevel(add_prefix_space = false, trim_offsets = true, use_regex = true): the GPT-2
    // regex with no space added before the text, as `tokenizer.ggml.add_space_prefix = false`.
    let byte_level = ByteLevel::new(false, true, true);
    let pre: PreTokenizerWrapper = match vocab.pre_tokenizer {
        PreTokenizerKind::Gpt2 => byte_level.into(),
        PreTokenizerKind::DigitsThenGpt2 => {
            Sequence::new(vec![Digits::new(true).into(), byte_level.into()]).into()
        }
    };
    tokenizer.with_pre_tokenizer(Some(pre));

    // One call, because `tokenizers` rebuilds its matcher on every call.
    let added: Vec<AddedToken> = vocab
        .tokens
        .iter()
        .zip(&vocab.token_types)
        .filter(|(_, kind)| kind.is_special() || **kind == TokenType::UserDefined)
        .map(|(text, kind)| {
            // Matched on the raw text (no normalizer runs), with no stripping around it.
            AddedToken::from(text.clone(), kind.is_special()).normalized(false)
        })
        .collect();
    tokenizer.add_special_tokens(&added);
    Ok(tokenizer)
}
