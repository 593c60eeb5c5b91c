//! The tokenizer's construction logic on a hand-built vocabulary (no model needed): merge
//! ranks, the two pre-tokenizers, special tokens in text, decoding, the GGUF metadata path, and
//! every construction error.

mod gguf_common;

use gguf_common::*;
use tq_models::gguf::Gguf;
use tq_models::tokenizer::{BpeVocab, PreTokenizerKind, TokenType, Tokenizer, TokenizerError};

/// Tokens added after the 256 byte tokens, with their types.
const EXTRA: &[(&str, TokenType)] = &[
    ("he", TokenType::Normal),          // 256
    ("ll", TokenType::Normal),          // 257
    ("hell", TokenType::Normal),        // 258
    ("hello", TokenType::Normal),       // 259
    ("Ġb", TokenType::Normal),          // 260
    ("ab", TokenType::Normal),          // 261
    ("bc", TokenType::Normal),          // 262
    ("12", TokenType::Normal),          // 263
    ("'t", TokenType::Normal),          // 264
    ("ĊĊ", TokenType::Normal),          // 265
    ("<|start|>", TokenType::Control),  // 266
    ("<user>", TokenType::UserDefined), // 267
    ("<|unused|>", TokenType::Unused),  // 268
];

const MERGES: &[&str] = &[
    "b c", "h e", "l l", "he ll", "hell o", "Ġ b", "a b", "1 2", "' t", "Ċ Ċ",
];

fn id(token: &str) -> u32 {
    if let Some(i) = EXTRA.iter().position(|(t, _)| *t == token) {
        return 256 + i as u32;
    }
    let mut chars = token.chars();
    let c = chars.next().unwrap();
    assert!(
        chars.next().is_none(),
        "test bug: {token:?} is not a byte token"
    );
    (0..=255u8)
        .find(|&b| Tokenizer::byte_token(b) == c)
        .unwrap()
        .into()
}

fn vocab(pre_tokenizer: PreTokenizerKind) -> BpeVocab {
    let mut tokens: Vec<String> = (0..=255u8)
        .map(|b| Tokenizer::byte_token(b).to_string())
        .collect();
    let mut token_types = vec![TokenType::Normal; 256];
    for (token, kind) in EXTRA {
        tokens.push((*token).to_owned());
        token_types.push(*kind);
    }
    BpeVocab {
        tokens,
        token_types,
        merges: MERGES.iter().map(|m| (*m).to_owned()).collect(),
        pre_tokenizer,
        bos_id: Some(id("<|start|>")),
        eos_id: Some(id("<|start|>")),
        add_bos: false,
        add_eos: false,
    }
}

fn tokenizer() -> Tokenizer {
    Tokenizer::from_vocab(vocab(PreTokenizerKind::DigitsThenGpt2)).unwrap()
}

#[test]
fn merges_apply_in_rank_order() {
    let t = tokenizer();
    assert_eq!(t.encode("hello").unwrap(), [id("hello")]);
    // "b c" outranks "a b", so "abc" is a + bc, not ab + c.
    assert_eq!(t.encode("abc").unwrap(), [id("a"), id("bc")]);
    assert_eq!(t.encode("ab").unwrap(), [id("ab")]);
    // A repeated rule keeps its first (higher) rank.
    let mut v = vocab(PreTokenizerKind::Gpt2);
    v.merges = vec!["a b".into(), "b c".into(), "a b".into()];
    let t = Tokenizer::from_vocab(v).unwrap();
    assert_eq!(t.encode("abc").unwrap(), [id("ab"), id("c")]);
}

#[test]
fn digits_split_one_by_one_only_for_the_smollm_pre_tokenizer() {
    assert_eq!(
        tokenizer().encode("123").unwrap(),
        [id("1"), id("2"), id("3")]
    );
    let gpt2 = Tokenizer::from_vocab(vocab(PreTokenizerKind::Gpt2)).unwrap();
    assert_eq!(gpt2.encode("123").unwrap(), [id("12"), id("3")]);
}

#[test]
fn the_gpt2_regex_splits_words_spaces_and_contractions() {
    let t = tokenizer();
    // The second space stays alone: `\s+(?!\S)` leaves the last space to the word after it.
    assert_eq!(t.encode("a  b").unwrap(), [id("a"), id("Ġ"), id("Ġb")]);
    assert_eq!(
        t.encode("don't").unwrap(),
        [id("d"), id("o"), id("n"), id("'t")]
    );
    assert_eq!(t.encode("\n\n").unwrap(), [id("ĊĊ")]);
    // No space is added before the text.
    assert_eq!(t.encode("b").unwrap(), [id("b")]);
    assert_eq!(t.encode("").unwrap(), Vec::<u32>::new());
}

#[test]
fn special_and_user_defined_tokens_in_text_are_single_tokens() {
    let t = tokenizer();
    assert_eq!(
        t.encode("<|start|>hello<user> b").unwrap(),
        [id("<|start|>"), id("hello"), id("<user>"), id("Ġb")]
    );
    // An unused token is not matched: its text is tokenized as bytes.
    let ids = t.encode("<|unused|>").unwrap();
    assert_eq!(ids.len(), "<|unused|>".len());
    assert_eq!(t.token_id("<|start|>"), Some(266));
    assert_eq!(t.token_type(266), Some(TokenType::Control));
    assert_eq!(t.token_type(9999), None);
}

#[test]
fn decoding_concatenates_pieces_and_replaces_broken_utf8() {
    let t = tokenizer();
    let text = "<|start|>hello<user>  b\n\n€";
    let ids = t.encode(text).unwrap();
    assert_eq!(t.decode(&ids).unwrap(), text);
    assert_eq!(t.token_to_piece(id("Ġb")).unwrap(), b" b");
    assert_eq!(t.token_to_piece(id("<|start|>")).unwrap(), b"<|start|>");
    // "€" is E2 82 AC: each byte is its own token here, and a lone byte is not UTF-8.
    let euro = t.encode("€").unwrap();
    assert_eq!(euro.len(), 3);
    assert_eq!(t.token_to_piece(euro[0]).unwrap(), [0xE2]);
    assert_eq!(t.decode(&euro[..1]).unwrap(), "\u{FFFD}");
    let err = t.decode(&[0, 269]).unwrap_err();
    assert!(
        matches!(
            err,
            TokenizerError::UnknownId {
                id: 269,
                vocab_size: 269
            }
        ),
        "{err}"
    );
}

#[test]
fn bos_and_eos_are_added_only_when_asked() {
    let mut v = vocab(PreTokenizerKind::Gpt2);
    v.add_bos = true;
    v.add_eos = true;
    let t = Tokenizer::from_vocab(v).unwrap();
    assert_eq!(t.encode("b").unwrap(), [266, id("b"), 266]);
    assert!(t.add_bos());
}

#[test]
fn construction_errors_are_typed() {
    let mut v = vocab(PreTokenizerKind::Gpt2);
    v.merges.push("nospace".into());
    let err = Tokenizer::from_vocab(v).unwrap_err();
    assert!(
        matches!(&err, TokenizerError::BadMerge { index: 10, rule } if rule == "nospace"),
        "{err}"
    );

    let mut v = vocab(PreTokenizerKind::Gpt2);
    v.merges.push("x ".into());
    assert!(matches!(
        Tokenizer::from_vocab(v),
        Err(TokenizerError::BadMerge { .. })
    ));

    // "h l" would make "hl", which is not a token.
    let mut v = vocab(PreTokenizerKind::Gpt2);
    v.merges.push("h l".into());
    assert!(matches!(
        Tokenizer::from_vocab(v),
        Err(TokenizerError::Build(_))
    ));

    let mut v = vocab(PreTokenizerKind::Gpt2);
    v.token_types.pop();
    assert!(matches!(
        Tokenizer::from_vocab(v),
        Err(TokenizerError::TypeCountMismatch {
            tokens: 269,
            types: 268
        })
    ));

    let mut v = vocab(PreTokenizerKind::Gpt2);
    v.bos_id = Some(269);
    assert!(matches!(
        Tokenizer::from_vocab(v),
        Err(TokenizerError::SpecialIdOutOfRange { id: 269, .. })
    ));

    let mut v = vocab(PreTokenizerKind::Gpt2);
    v.tokens.clear();
    v.token_types.clear();
    assert!(matches!(
        Tokenizer::from_vocab(v),
        Err(TokenizerError::BadVocabSize { size: 0 })
    ));
}

/// The tiny vocabulary written as GGUF metadata, the way llama.cpp's converter writes it.
fn gguf_with(model: &str, pre: &str, types: &[i32]) -> GgufBuilder {
    let v = vocab(PreTokenizerKind::DigitsThenGpt2);
    let tokens: Vec<&str> = v.tokens.iter().map(String::as_str).collect();
    GgufBuilder::new()
        .pair("tokenizer.ggml.model", string_value(model))
        .pair("tokenizer.ggml.pre", string_value(pre))
        .pair("tokenizer.ggml.tokens", string_array(&tokens))
        .pair("tokenizer.ggml.token_type", i32_array(types))
        .pair("tokenizer.ggml.merges", string_array(MERGES))
        .pair("tokenizer.ggml.bos_token_id", u32_value(266))
        .pair("tokenizer.ggml.eos_token_id", u32_value(266))
        .pair("tokenizer.ggml.add_bos_token", bool_value(false))
}

fn types() -> Vec<i32> {
    vocab(PreTokenizerKind::Gpt2)
        .token_types
        .iter()
        .map(|t| *t as i32)
        .collect()
}

#[test]
fn a_gguf_vocabulary_builds_the_same_tokenizer() {
    let gguf = Gguf::from_bytes(gguf_with("gpt2", "smollm", &types()).build()).unwrap();
    let from_file = Tokenizer::from_gguf(&gguf).unwrap();
    let direct = tokenizer();
    for text in ["<|start|>hello<user> b", "123 abc", "don't\n\n"] {
        assert_eq!(
            from_file.encode(text).unwrap(),
            direct.encode(text).unwrap(),
            "{text:?}"
        );
    }
    assert_eq!(from_file.bos_id(), Some(266));
    assert!(!from_file.add_bos());
    // Token types are optional: without them every token is normal (no special matching).
    let mut builder = gguf_with("gpt2", "gpt-2", &types());
    builder
        .pairs
        .retain(|(k, _)| k != "tokenizer.ggml.token_type");
    let plain = Tokenizer::from_gguf(&Gguf::from_bytes(builder.build()).unwrap()).unwrap();
    assert_eq!(plain.token_type(266), Some(TokenType::Normal));
    assert_ne!(plain.encode("<|start|>").unwrap(), [266]);
}

#[test]
fn unsupported_or_broken_gguf_vocabularies_are_typed_errors() {
    let build = |b: GgufBuilder| Tokenizer::from_gguf(&Gguf::from_bytes(b.build()).unwrap());
    assert!(matches!(
        build(gguf_with("t5", "smollm", &types())),
        Err(TokenizerError::UnsupportedModel { model }) if model == "t5"
    ));
    assert!(matches!(
        build(gguf_with("gpt2", "qwen2", &types())),
        Err(TokenizerError::UnsupportedPreTokenizer { pre }) if pre == "qwen2"
    ));
    let mut bad_types = types();
    bad_types[5] = 9;
    assert!(matches!(
        build(gguf_with("gpt2", "smollm", &bad_types)),
        Err(TokenizerError::UnknownTokenType { id: 5, value: 9 })
    ));
    let mut no_merges = gguf_with("gpt2", "smollm", &types());
    no_merges
        .pairs
        .retain(|(k, _)| k != "tokenizer.ggml.merges");
    let err = build(no_merges).unwrap_err();
    assert!(err.to_string().contains("tokenizer.ggml.merges"), "{err}");
    let wrong_type =
        gguf_with("gpt2", "smollm", &types()).pair("tokenizer.ggml.add_eos_token", u8_value(1));
    let err = build(wrong_type).unwrap_err();
    assert!(
        err.to_string().contains("tokenizer.ggml.add_eos_token"),
        "{err}"
    );
}

#[test]
fn tokenizers_and_files_can_be_shared_across_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Tokenizer>();
    assert_send_sync::<Gguf>();
}
