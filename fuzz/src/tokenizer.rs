//! The tokenizer target: arbitrary bytes through both reference vocabularies.

use std::path::Path;
use tq_models::fetch::KnownModel;
use tq_models::gguf::Gguf;
use tq_models::tokenizer::Tokenizer;

/// The two vocabularies the project runs: SmolLM2's byte-level BPE and Gemma 3's
/// SentencePiece-style one, read from the model files `cargo xtask fetch-model` fetches.
pub struct TokenizerPair {
    /// SmolLM2-135M-Instruct's tokenizer (no BOS added).
    pub smollm2: Tokenizer,
    /// Gemma 3 270M's tokenizer (BOS added).
    pub gemma3: Tokenizer,
    /// Which bytes SmolLM2's vocabulary has a byte token for (235 of 256): the others are
    /// dropped by the encoder, as llama.cpp drops them.
    smollm2_spells: [bool; 256],
}

impl TokenizerPair {
    /// Both tokenizers from the model cache folder, or the reason they are not there.
    pub fn load() -> Result<Self, String> {
        let smollm2 = load(&KnownModel::SmolLm2.path())?;
        let smollm2_spells = std::array::from_fn(|b| {
            let byte = Tokenizer::byte_token(b as u8).to_string();
            smollm2.token_id(&byte).is_some()
        });
        Ok(Self {
            smollm2,
            gemma3: load(&KnownModel::Gemma3_270m.path())?,
            smollm2_spells,
        })
    }
}

fn load(path: &Path) -> Result<Tokenizer, String> {
    let gguf = Gguf::open(path).map_err(|e| {
        format!(
            "{}: {e} (run `cargo xtask fetch-model` first)",
            path.display()
        )
    })?;
    Tokenizer::from_gguf(&gguf).map_err(|e| format!("{}: {e}", path.display()))
}

/// The first byte picks the vocabulary (even: SmolLM2, odd: Gemma 3); the rest, read as UTF-8
/// with invalid sequences replaced, is encoded and decoded, and read as little-endian ids it
/// is decoded.
///
/// Panics when encoding fails, when decoding does not give the text back (SmolLM2: exactly,
/// but for the bytes its vocabulary has no token for, which are dropped; Gemma 3: after its
/// BOS, with a literal `▁` read back as the space it escapes, as SentencePiece defines it), when an id the encoder produced is outside the vocabulary, or
/// when decoding arbitrary ids panics instead of naming the unknown one.
pub fn tokenizer(data: &[u8], pair: &TokenizerPair) {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(rest);
    let (tokenizer, skip, expected) = if selector % 2 == 0 {
        let spelled: Vec<u8> = text
            .bytes()
            .filter(|&b| pair.smollm2_spells[b as usize])
            .collect();
        (
            &pair.smollm2,
            0,
            String::from_utf8_lossy(&spelled).into_owned(),
        )
    } else {
        (&pair.gemma3, 1, text.replace('\u{2581}', " "))
    };
    let ids = tokenizer.encode(&text).expect("any text encodes");
    let vocab = tokenizer.vocab_size();
    assert!(ids.iter().all(|&id| (id as usize) < vocab), "{ids:?}");
    let decoded = tokenizer.decode(&ids[skip..]).expect("its own ids decode");
    assert_eq!(decoded, expected, "round trip of {text:?}");
    let raw: Vec<u32> = rest
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) % (vocab as u32 + 8))
        .collect();
    let decoded = tokenizer.decode(&raw);
    assert_eq!(
        decoded.is_ok(),
        raw.iter().all(|&id| (id as usize) < vocab),
        "{raw:?}"
    );
}
