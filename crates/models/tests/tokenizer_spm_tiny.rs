//! The SentencePiece-style tokenizer on a hand-built vocabulary written as GGUF metadata (no
//! model needed): merging by score with leftmost ties, byte fallback, user-defined tokens cut
//! out always, BOS, the space prefix, decoding, llama.cpp's defaults for absent keys, and
//! every construction error.

mod gguf_common;

use gguf_common::*;
use tq_models::gguf::Gguf;
use tq_models::tokenizer::{SpmVocab, TokenType, Tokenizer, TokenizerError};

/// `(text, score, type)`; ids are positions. Byte tokens for a, b, c, space and 0xE2 0x82 0xAC
/// (the three bytes of "€"); ids 0–2 are the usual pad/eos/bos.
const VOCAB: &[(&str, f32, i32)] = &[
    ("<pad>", -1000.0, 3), // 0
    ("<eos>", -1000.0, 3), // 1
    ("<bos>", -1000.0, 3), // 2
    ("<0x61>", 0.0, 6),    // 3  a
    ("<0x62>", 0.0, 6),    // 4  b
    ("<0x63>", 0.0, 6),    // 5  c
    ("<0x20>", 0.0, 6),    // 6  space
    ("<0xE2>", 0.0, 6),    // 7
    ("<0x82>", 0.0, 6),    // 8
    ("<0xAC>", 0.0, 6),    // 9
    ("a", -5.0, 1),        // 10
    ("b", -5.0, 1),        // 11
    ("▁", -4.0, 1),        // 12
    ("ab", -3.0, 1),       // 13
    ("bc", -2.0, 1),       // 14
    ("▁a", -1.0, 1),       // 15
    ("abc", -2.5, 1),      // 16
    ("\n\n", 0.0, 4),      // 17 user-defined
    ("<i>", 0.0, 4),       // 18 user-defined tag
    ("<unused0>", 0.0, 5), // 19 unused
];

fn gguf(extra: &[(&str, Encoded)], skip: &[&str]) -> Gguf {
    let tokens: Vec<&str> = VOCAB.iter().map(|t| t.0).collect();
    let scores: Vec<Encoded> = VOCAB.iter().map(|t| f32_value(t.1)).collect();
    let types: Vec<i32> = VOCAB.iter().map(|t| t.2).collect();
    let mut builder = GgufBuilder::new();
    let pairs = [
        ("tokenizer.ggml.model", string_value("llama")),
        ("tokenizer.ggml.pre", string_value("default")),
        ("tokenizer.ggml.tokens", string_array(&tokens)),
        ("tokenizer.ggml.scores", array_value(6, &scores)),
        ("tokenizer.ggml.token_type", i32_array(&types)),
        ("tokenizer.ggml.bos_token_id", u32_value(2)),
        ("tokenizer.ggml.eos_token_id", u32_value(1)),
        ("tokenizer.ggml.add_bos_token", bool_value(true)),
        ("tokenizer.ggml.add_space_prefix", bool_value(false)),
    ];
    for (key, value) in pairs {
        if skip.contains(&key) || extra.iter().any(|(k, _)| *k == key) {
            continue;
        }
        builder = builder.pair(key, value);
    }
    for (key, value) in extra {
        builder = builder.pair(key, value.clone());
    }
    Gguf::from_bytes(builder.build()).unwrap()
}

fn tokenizer() -> Tokenizer {
    Tokenizer::from_gguf(&gguf(&[], &[])).unwrap()
}

#[test]
fn pieces_merge_by_score_with_bos_first() {
    let t = tokenizer();
    // "abc": "bc" (−2) beats "ab" (−3); then "a"+"bc" = "abc" (−2.5) merges.
    assert_eq!(t.encode("abc").unwrap(), [2, 16]);
    // "ab": the only pair.
    assert_eq!(t.encode("ab").unwrap(), [2, 13]);
    // " a b": "▁a" (−1) first; "▁b" is no token, so "▁" and "b" stay apart.
    assert_eq!(t.encode(" a b").unwrap(), [2, 15, 12, 11]);
    // No space prefix: "a" alone is the piece "a", not "▁a".
    assert_eq!(t.encode("a").unwrap(), [2, 10]);
    assert_eq!(t.encode("").unwrap(), [2]);
}

#[test]
fn unknown_characters_fall_back_to_bytes_and_decode_back() {
    let t = tokenizer();
    // 'c' alone is no piece: its byte token; "€" is three byte tokens.
    assert_eq!(t.encode("c€").unwrap(), [2, 5, 7, 8, 9]);
    assert_eq!(t.decode(&[5, 7, 8, 9]).unwrap(), "c€");
    // A character with no byte tokens at all is a typed error naming the byte.
    assert!(matches!(
        t.encode("é"),
        Err(TokenizerError::NoByteToken { byte: 0xC3 })
    ));
}

#[test]
fn user_defined_and_control_tokens_are_cut_out_first() {
    let t = tokenizer();
    // "\n\n" and "<i>" are user-defined; "<bos>" is control (parsed as special, as
    // llama-tokenize does by default). Text after a special token gets no space prefix.
    assert_eq!(
        t.encode("ab\n\n<i>a<bos>abc").unwrap(),
        [2, 13, 17, 18, 10, 2, 16]
    );
    // An unused token is not special: "<unused0>" is text (here: its '<' has no byte token,
    // an error, which shows it was not matched whole).
    assert!(matches!(
        t.encode("<unused0>"),
        Err(TokenizerError::NoByteToken { byte: b'<' })
    ));
    assert_eq!(t.token_id("<i>"), Some(18));
    assert_eq!(t.token_type(17), Some(TokenType::UserDefined));
}

#[test]
fn decoding_follows_llama_cpps_pieces() {
    let t = tokenizer();
    // Normal pieces turn '▁' into spaces; specials and user-defined tokens print their text;
    // unused tokens print nothing.
    assert_eq!(t.decode(&[15, 12, 11]).unwrap(), " a b");
    assert_eq!(t.decode(&[2, 17, 18, 19]).unwrap(), "<bos>\n\n<i>");
    assert_eq!(t.token_to_piece(6).unwrap(), b" ");
    assert!(t.token_to_piece(20).is_err());
    for text in ["abc ab", " a\n\n<i>b", "c€ a"] {
        let ids = t.encode(text).unwrap();
        assert_eq!(t.decode(&ids[1..]).unwrap(), text);
    }
}

#[test]
fn absent_keys_take_llama_cpps_defaults() {
    // No flags, no ids: BOS = 1, EOS = 2 by default, BOS added, space prefix on.
    let g = gguf(
        &[],
        &[
            "tokenizer.ggml.bos_token_id",
            "tokenizer.ggml.eos_token_id",
            "tokenizer.ggml.add_bos_token",
            "tokenizer.ggml.add_space_prefix",
        ],
    );
    let vocab = SpmVocab::from_gguf(&g).unwrap();
    assert_eq!((vocab.bos_id, vocab.eos_id), (Some(1), Some(2)));
    assert!(vocab.add_bos && !vocab.add_eos && vocab.add_space_prefix);
    let t = Tokenizer::from_spm_vocab(vocab).unwrap();
    // The space prefix: "a" becomes "▁a"; after a special token too.
    assert_eq!(t.encode("a").unwrap(), [1, 15]);
    assert_eq!(t.encode("a<i>a").unwrap(), [1, 15, 18, 15]);
    // Integer scores are accepted (llama.cpp reads i32 or f32 arrays).
    let ints: Vec<i32> = VOCAB.iter().map(|t| t.1 as i32).collect();
    let g = gguf(&[("tokenizer.ggml.scores", i32_array(&ints))], &[]);
    assert_eq!(
        Tokenizer::from_gguf(&g).unwrap().encode("abc").unwrap(),
        [2, 16]
    );
    // No scores at all: every score 0, ties merge leftmost first ("ab", then "abc").
    let g = gguf(&[], &["tokenizer.ggml.scores"]);
    assert_eq!(
        Tokenizer::from_gguf(&g).unwrap().encode("abc").unwrap(),
        [2, 16]
    );
}

#[test]
fn broken_vocabularies_are_typed_errors() {
    let build = |extra: &[(&str, Encoded)]| Tokenizer::from_gguf(&gguf(extra, &[]));
    let short: Vec<Encoded> = VOCAB[1..].iter().map(|t| f32_value(t.1)).collect();
    assert!(matches!(
        build(&[("tokenizer.ggml.scores", array_value(6, &short))]),
        Err(TokenizerError::ScoreCountMismatch {
            tokens: 20,
            scores: 19
        })
    ));
    let mut nan: Vec<Encoded> = VOCAB.iter().map(|t| f32_value(t.1)).collect();
    nan[13] = f32_value(f32::NAN);
    assert!(matches!(
        build(&[("tokenizer.ggml.scores", array_value(6, &nan))]),
        Err(TokenizerError::NanScore { id: 13 })
    ));
    let mut bad_byte: Vec<i32> = VOCAB.iter().map(|t| t.2).collect();
    bad_byte[10] = 6; // "a" claims to be a byte token
    assert!(matches!(
        build(&[("tokenizer.ggml.token_type", i32_array(&bad_byte))]),
        Err(TokenizerError::BadByteToken { id: 10, .. })
    ));
    let err = Tokenizer::from_gguf(&gguf(&[], &["tokenizer.ggml.tokens"])).unwrap_err();
    assert!(err.to_string().contains("tokenizer.ggml.tokens"), "{err}");
    assert!(matches!(
        build(&[("tokenizer.ggml.bos_token_id", u32_value(20))]),
        Err(TokenizerError::SpecialIdOutOfRange { id: 20, .. })
    ));
    // add_bos with no BOS id: llama.cpp refuses such a file too.
    let vocab = SpmVocab {
        bos_id: None,
        ..SpmVocab::from_gguf(&gguf(&[], &[])).unwrap()
    };
    assert!(matches!(
        Tokenizer::from_spm_vocab(vocab),
        Err(TokenizerError::AddWithoutId { .. })
    ));
}
