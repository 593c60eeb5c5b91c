//! Gemma 3's SentencePiece-style tokenizer against llama.cpp, the reference engine: the token
//! ids it produced for a set of strings and prompts (`tests/data/gemma3_llamacpp.json`) are
//! reproduced exactly from the model's own vocabulary, and decoding gives the text back.
//!
//! Needs Gemma 3 270M (skipped with a message when absent, failing instead when
//! `TQ_REQUIRE_MODEL=1`); `cargo xtask fetch-model` fetches it.

mod gguf_common;

use gguf_common::gemma3_model_or_skip;
use serde_json::Value;
use tq_models::gguf::Gguf;
use tq_models::tokenizer::{TokenType, Tokenizer};

fn reference() -> Value {
    let text = include_str!("data/gemma3_llamacpp.json");
    serde_json::from_str(text).expect("reference JSON parses")
}

fn ids(value: &Value) -> Vec<u32> {
    value
        .as_array()
        .expect("an id list")
        .iter()
        .map(|v| u32::try_from(v.as_u64().expect("an id")).expect("a u32 id"))
        .collect()
}

fn load() -> Option<Tokenizer> {
    let path = gemma3_model_or_skip()?;
    let gguf = Gguf::open(path).expect("Gemma 3 parses");
    Some(Tokenizer::from_gguf(&gguf).expect("the tokenizer builds"))
}

#[test]
fn every_reference_string_tokenizes_to_llama_cpps_ids() {
    let Some(tokenizer) = load() else { return };
    let reference = reference();
    let cases = reference["tokenize"].as_array().unwrap();
    assert_eq!(cases.len(), 7);
    for case in cases {
        let text = case["string"].as_str().unwrap();
        let expected = ids(&case["ids"]);
        assert_eq!(case["bos_added"], true);
        assert_eq!(tokenizer.encode(text).unwrap(), expected, "ids of {text:?}");
        // Without the BOS, the ids decode to the text.
        assert_eq!(
            tokenizer.decode(&expected[1..]).unwrap(),
            text,
            "decode of {text:?}"
        );
    }
}

#[test]
fn every_greedy_prompt_tokenizes_to_llama_cpps_prompt_ids() {
    let Some(tokenizer) = load() else { return };
    let reference = reference();
    let cases = reference["greedy"].as_array().unwrap();
    assert_eq!(cases.len(), 4);
    for case in cases {
        let prompt = case["prompt"].as_str().unwrap();
        let expected = ids(&case["prompt_ids"]);
        assert_eq!(
            tokenizer.encode(prompt).unwrap(),
            expected,
            "prompt {prompt:?}"
        );
        assert_eq!(tokenizer.decode(&expected[1..]).unwrap(), prompt);
        // The generated ids decode to the printed continuation (which adds nothing but the
        // engine's trailing newlines).
        let generated = tokenizer.decode(&ids(&case["generated_ids"])).unwrap();
        let printed = case["completion_text"].as_str().unwrap();
        assert!(
            printed.starts_with(&generated),
            "{generated:?} vs {printed:?}"
        );
    }
}

#[test]
fn special_tokens_and_ids_match_the_file() {
    let Some(tokenizer) = load() else { return };
    assert_eq!(tokenizer.vocab_size(), 262_144);
    assert_eq!(tokenizer.bos_id(), Some(2));
    assert_eq!(tokenizer.eos_id(), Some(1));
    assert!(tokenizer.add_bos());
    assert!(tokenizer.is_eos(1));
    assert_eq!(tokenizer.token_id("<bos>"), Some(2));
    assert_eq!(tokenizer.token_id("<end_of_turn>"), Some(106));
    assert_eq!(tokenizer.token_type(2), Some(TokenType::Control));
    assert_eq!(tokenizer.token_to_piece(2).unwrap(), b"<bos>");
    // Byte-fallback tokens decode to their byte; '\n' is a user-defined token of its own.
    let newline = tokenizer.token_id("<0x0A>").expect("a byte token for \\n");
    assert_eq!(tokenizer.token_type(newline), Some(TokenType::Byte));
    assert_eq!(tokenizer.token_to_piece(newline).unwrap(), b"\n");
    assert_eq!(tokenizer.token_to_piece(107).unwrap(), b"\n");
    // "▁Paris" is one token whose piece starts with a space.
    let paris = tokenizer.encode(" Paris").unwrap();
    assert_eq!(paris.len(), 2);
    assert_eq!(tokenizer.token_to_piece(paris[1]).unwrap(), b" Paris");
    // Control tokens in text are parsed as special, as llama-tokenize does by default.
    assert_eq!(tokenizer.encode("<bos>").unwrap(), [2, 2]);
    assert!(tokenizer.token_to_piece(262_144).is_err());
}

#[test]
fn arbitrary_text_round_trips() {
    let Some(tokenizer) = load() else { return };
    let texts = [
        "",
        " ",
        "\n\n\n",
        "   leading and trailing   ",
        "tabs\tand\r\nCRLF\t\t\t",
        "Ünïcödé: 日本語のテキスト, Ελληνικά, עברית, emoji 👩‍👩‍👧 and ½ ² ٣ \u{10FFFF}",
        "code: fn main() { println!(\"{}\", 1 + 2); }",
        "<b>bold</b><start_of_turn>user\nhi<end_of_turn>",
        "it's, we'll, they're, I'd, you've, I'm — CONTRACTIONS'S",
        "▁ a literal lower-one-eighth block ▁▁",
    ];
    for text in texts {
        let ids = tokenizer.encode(text).unwrap();
        assert_eq!(ids[0], 2, "BOS first for {text:?}");
        assert_eq!(
            tokenizer.decode(&ids[1..]).unwrap(),
            // A literal '▁' in the text is indistinguishable from an escaped space.
            text.replace('\u{2581}', " "),
            "round trip of {text:?}"
        );
    }
}
