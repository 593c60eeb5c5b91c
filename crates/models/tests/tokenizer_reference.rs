//! The tokenizer against llama.cpp, the reference engine: the token ids it produced for a set of
//! strings and prompts (`tests/data/smollm2_llamacpp.json`) are reproduced exactly from the
//! reference model's own vocabulary, and decoding gives the text back.
//!
//! Needs the reference model (skipped with a message when absent, failing instead when
//! `TQ_REQUIRE_MODEL=1`).

mod gguf_common;

use gguf_common::reference_model_or_skip;
use serde_json::Value;
use tq_models::chat::{ChatTemplate, Message, Role};
use tq_models::gguf::Gguf;
use tq_models::tokenizer::{TokenType, Tokenizer};

fn reference() -> Value {
    let text = include_str!("data/smollm2_llamacpp.json");
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

fn load() -> Option<(Gguf, Tokenizer)> {
    let path = reference_model_or_skip()?;
    let gguf = Gguf::open(path).expect("the reference model parses");
    let tokenizer = Tokenizer::from_gguf(&gguf).expect("the tokenizer builds");
    Some((gguf, tokenizer))
}

#[test]
fn every_reference_string_tokenizes_to_llama_cpps_ids() {
    let Some((_, tokenizer)) = load() else { return };
    let reference = reference();
    let cases = reference["tokenize"].as_array().unwrap();
    assert_eq!(cases.len(), 6);
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let expected = ids(&case["ids"]);
        assert_eq!(tokenizer.encode(text).unwrap(), expected, "ids of {text:?}");
        assert_eq!(
            tokenizer.decode(&expected).unwrap(),
            text,
            "decode of {text:?}"
        );
    }
}

#[test]
fn every_greedy_prompt_tokenizes_to_llama_cpps_prompt_ids() {
    let Some((_, tokenizer)) = load() else { return };
    let reference = reference();
    let cases = reference["greedy"].as_array().unwrap();
    assert!(cases.len() >= 4);
    for case in cases {
        let prompt = case["prompt"].as_str().unwrap();
        let expected = ids(&case["prompt_ids"]);
        assert_eq!(
            tokenizer.encode(prompt).unwrap(),
            expected,
            "prompt {prompt:?}"
        );
        assert_eq!(tokenizer.decode(&expected).unwrap(), prompt);
    }
}

#[test]
fn the_chat_prompt_comes_from_the_files_template() {
    let Some((gguf, tokenizer)) = load() else {
        return;
    };
    let template = ChatTemplate::from_gguf(&gguf).unwrap();
    assert_eq!(template, ChatTemplate::smollm2());
    let reference = reference();
    let chat = reference["greedy"]
        .as_array()
        .unwrap()
        .iter()
        .find(|case| case["kind"] == "chat")
        .expect("a chat case");
    let rendered = template.render(&[Message::new(Role::User, "What is 2+2?")], true);
    assert_eq!(rendered, chat["prompt"].as_str().unwrap());
    assert_eq!(
        tokenizer.encode(&rendered).unwrap(),
        ids(&chat["prompt_ids"])
    );
}

#[test]
fn special_tokens_and_ids_match_the_file() {
    let Some((_, tokenizer)) = load() else { return };
    assert_eq!(tokenizer.vocab_size(), 49_152);
    assert_eq!(tokenizer.bos_id(), Some(1));
    assert_eq!(tokenizer.eos_id(), Some(2));
    assert!(!tokenizer.add_bos());
    assert!(tokenizer.is_eos(2));
    assert_eq!(tokenizer.token_id("<|im_start|>"), Some(1));
    assert_eq!(tokenizer.token_id("<|im_end|>"), Some(2));
    assert_eq!(tokenizer.token_type(0), Some(TokenType::Control));
    assert_eq!(tokenizer.token_type(17), Some(TokenType::Normal));
    assert_eq!(tokenizer.token_to_piece(2).unwrap(), b"<|im_end|>");
    // " Paris" is one token whose piece starts with a space.
    let paris = tokenizer.encode(" Paris").unwrap();
    assert_eq!(paris.len(), 1);
    assert_eq!(tokenizer.token_to_piece(paris[0]).unwrap(), b" Paris");
    assert!(tokenizer.token_to_piece(49_152).is_err());
}

#[test]
fn arbitrary_text_round_trips() {
    let Some((_, tokenizer)) = load() else { return };
    let texts = [
        "",
        " ",
        "\n\n\n",
        "   leading and trailing   ",
        "tabs\tand\r\nCRLF",
        "Ünïcödé: 日本語のテキスト, Ελληνικά, עברית, emoji 👩‍👩‍👧 and ½ ² ٣",
        "code: fn main() { println!(\"{}\", 1 + 2); }",
        "<|im_start|><|im_end|><|endoftext|>text<jupyter_code>",
        "it's, we'll, they're, I'd, you've, I'm — CONTRACTIONS'S",
        "1234567890 ١٢٣ Ⅻ",
    ];
    for text in texts {
        let ids = tokenizer.encode(text).unwrap();
        assert_eq!(
            tokenizer.decode(&ids).unwrap(),
            text,
            "round trip of {text:?}"
        );
    }
}

/// Found by the tokenizer fuzz target: SmolLM2's vocabulary has no token for some bytes, and
/// those bytes are dropped, as llama.cpp's BPE tokenizer drops them (a symbol that is not a
/// token falls back to its single bytes; a byte without a token is skipped).
#[test]
fn bytes_without_a_token_are_dropped_like_llama_cpp_does() {
    let Some((_, tokenizer)) = load() else { return };
    let missing: Vec<u8> = (0..=255u8)
        .filter(|&b| {
            tokenizer
                .token_id(&Tokenizer::byte_token(b).to_string())
                .is_none()
        })
        .collect();
    assert_eq!(
        missing,
        [
            0x04, 0x06, 0x13, 0x14, 0x16, 0x1D, 0xC0, 0xC1, 0xF1, 0xF2, 0xF5, 0xF6, 0xF7, 0xF8,
            0xF9, 0xFA, 0xFB, 0xFC, 0xFD, 0xFE, 0xFF
        ]
    );
    for control in ["\u{4}", "\u{6}", "\u{13}", "\u{14}", "\u{16}", "\u{1d}"] {
        assert!(tokenizer.encode(control).unwrap().is_empty(), "{control:?}");
        let text = format!("le{control} x");
        assert_eq!(
            tokenizer.encode(&text).unwrap(),
            tokenizer.encode("le x").unwrap()
        );
    }
    // U+40000 is F1 80 80 80: the lead byte goes, its continuation bytes stay (and decode to
    // replacement characters).
    let ids = tokenizer.encode("a\u{40000}b").unwrap();
    assert_eq!(
        tokenizer.decode(&ids).unwrap(),
        "a\u{FFFD}\u{FFFD}\u{FFFD}b"
    );
}
