//! The generated part of the seed corpus: tiny but complete GGUF models (one per architecture)
//! and saved caches (one per allocation family), written by the code below so anyone can see
//! what they hold and regenerate them when a format changes:
//!
//! ```text
//! TQ_WRITE_FUZZ_SEEDS=1 cargo test --release -p tq-fuzz --test seeds
//! ```
//!
//! Without the variable the test checks that the committed GGUF files are what this code
//! writes and that every seed is accepted by its loader all the way (a seed the loader refuses
//! would only teach the fuzzer the first error path).

#[path = "../../crates/models/tests/gguf_common/mod.rs"]
mod gguf_common;

use gguf_common::*;
use half::f16;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tq_cache::allocation::Allocation;
use tq_cache::attention::AttentionKernel;
use tq_fuzz::sample;
use tq_models::causal_lm::CausalLm;
use tq_models::forward_scratch::{ForwardScratch, Logits};
use tq_models::gemma3::Gemma3;
use tq_models::gguf::Gguf;
use tq_models::llama::Llama;
use tq_models::tokenizer::Tokenizer;

/// ggml type ids of the block formats the seeds use.
const F32: u32 = 0;
const Q4_0: u32 = 2;
const Q4_1: u32 = 3;
const Q5_0: u32 = 6;
const Q8_0: u32 = 8;

const EMBEDDING: u64 = 32;
const FEED_FORWARD: u64 = 32;
const HEAD_DIM: u64 = 16;

/// The allocations whose saved caches seed the cache-file target: plain f16, one-tier QJL
/// products, two tiers, centering with sinks, per-layer-kind overrides, full-precision recent
/// copies.
const CACHE_PRESETS: [&str; 6] = [
    "f16",
    "k5v4",
    "tq3.5",
    "rec4.25",
    "rec4.25-global",
    "paper-prod",
];

/// A data-aware basis on the keys (fitted from the first batch), centered values.
const BASIS: &str = r#"
name = "basis-k4v3"
key = { codec = "mse", bits = 4, basis = "pca" }
value = { codec = "mse", bits = 3, center = "first-chunk" }
"#;

fn seed_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("seeds")
        .join(target)
}

/// One block of `type_id` for 32 weights: a small f16 scale (and min), then pattern bytes.
fn block(type_id: u32, salt: u8) -> Vec<u8> {
    let scale = f16::from_f32(0.01).to_le_bytes();
    let mut out = scale.to_vec();
    let quants = match type_id {
        Q4_0 => 16,
        Q4_1 => {
            out.extend(f16::from_f32(-0.05).to_le_bytes());
            16
        }
        Q5_0 => {
            out.extend([0x5A, 0xA5, 0x0F, 0xF0]); // the fifth bits
            16
        }
        Q8_0 => 32,
        _ => unreachable!("no block layout for type {type_id}"),
    };
    out.extend(pattern(quants, salt));
    out
}

/// A `rows × cols` matrix (ggml dims `[cols, rows]`) of `type_id` blocks.
fn matrix(rows: u64, cols: u64, type_id: u32, salt: u8) -> (Vec<u64>, u32, Vec<u8>) {
    let blocks = rows * cols / 32;
    let data = (0..blocks)
        .flat_map(|b| block(type_id, salt.wrapping_add(b as u8)))
        .collect();
    (vec![cols, rows], type_id, data)
}

/// An f32 vector of ones (norm weights).
fn ones(n: u64) -> (Vec<u64>, u32, Vec<u8>) {
    (
        vec![n],
        F32,
        (0..n).flat_map(|_| 1.0f32.to_le_bytes()).collect(),
    )
}

fn with_tensor(builder: GgufBuilder, name: &str, tensor: (Vec<u64>, u32, Vec<u8>)) -> GgufBuilder {
    builder.tensor(name, &tensor.0, tensor.1, tensor.2)
}

/// The layer tensors both architectures share, with one matrix format per role.
fn common_layer(mut builder: GgufBuilder, heads: u64, kv_heads: u64) -> GgufBuilder {
    let q = heads * HEAD_DIM;
    let kv = kv_heads * HEAD_DIM;
    let tensors = [
        ("blk.0.attn_norm.weight", ones(EMBEDDING)),
        ("blk.0.attn_q.weight", matrix(q, EMBEDDING, Q4_0, 1)),
        ("blk.0.attn_k.weight", matrix(kv, EMBEDDING, Q4_1, 2)),
        ("blk.0.attn_v.weight", matrix(kv, EMBEDDING, Q5_0, 3)),
        ("blk.0.attn_output.weight", matrix(EMBEDDING, q, Q8_0, 4)),
        ("blk.0.ffn_norm.weight", ones(EMBEDDING)),
        (
            "blk.0.ffn_gate.weight",
            matrix(FEED_FORWARD, EMBEDDING, Q4_0, 5),
        ),
        (
            "blk.0.ffn_up.weight",
            matrix(FEED_FORWARD, EMBEDDING, Q8_0, 6),
        ),
        (
            "blk.0.ffn_down.weight",
            matrix(EMBEDDING, FEED_FORWARD, Q4_1, 7),
        ),
        ("output_norm.weight", ones(EMBEDDING)),
    ];
    for (name, tensor) in tensors {
        builder = with_tensor(builder, name, tensor);
    }
    builder
}

/// A one-layer Llama with a byte-level BPE vocabulary (the 256 byte tokens, two merges and a
/// control token) and a ChatML template.
fn tiny_llama() -> Vec<u8> {
    let mut tokens: Vec<String> = (0..=255u8)
        .map(|b| Tokenizer::byte_token(b).to_string())
        .collect();
    tokens.extend(["he".into(), "ll".into(), "<|im_end|>".into()]);
    let mut types = vec![1; 258];
    types.push(3);
    let tokens: Vec<&str> = tokens.iter().map(String::as_str).collect();
    let vocab = tokens.len() as u64;
    let template = "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}";
    let builder = GgufBuilder::new()
        .pair("general.architecture", string_value("llama"))
        .pair("llama.block_count", u32_value(1))
        .pair("llama.context_length", u32_value(8))
        .pair("llama.embedding_length", u32_value(EMBEDDING as u32))
        .pair("llama.feed_forward_length", u32_value(FEED_FORWARD as u32))
        .pair("llama.attention.head_count", u32_value(2))
        .pair("llama.attention.head_count_kv", u32_value(1))
        .pair("llama.rope.dimension_count", u32_value(HEAD_DIM as u32))
        .pair("llama.rope.freq_base", f32_value(10_000.0))
        .pair("llama.attention.layer_norm_rms_epsilon", f32_value(1e-5))
        .pair("tokenizer.ggml.model", string_value("gpt2"))
        .pair("tokenizer.ggml.pre", string_value("smollm"))
        .pair("tokenizer.ggml.tokens", string_array(&tokens))
        .pair("tokenizer.ggml.token_type", i32_array(&types))
        .pair("tokenizer.ggml.merges", string_array(&["h e", "l l"]))
        .pair("tokenizer.ggml.bos_token_id", u32_value(258))
        .pair("tokenizer.ggml.eos_token_id", u32_value(258))
        .pair("tokenizer.chat_template", string_value(template));
    let builder = with_tensor(
        builder,
        "token_embd.weight",
        matrix(vocab, EMBEDDING, Q8_0, 8),
    );
    common_layer(builder, 2, 1).build()
}

/// A one-layer Gemma 3 (a sliding-window layer) with a SentencePiece-style vocabulary: control
/// tokens, byte fallbacks, scored pieces and a user-defined token.
fn tiny_gemma3() -> Vec<u8> {
    let vocab: [(&str, f32, i32); 12] = [
        ("<pad>", -1000.0, 3),
        ("<eos>", -1000.0, 3),
        ("<bos>", -1000.0, 3),
        ("<0x61>", 0.0, 6),
        ("<0x20>", 0.0, 6),
        ("<0xE2>", 0.0, 6),
        ("a", -5.0, 1),
        ("b", -5.0, 1),
        ("▁", -4.0, 1),
        ("ab", -3.0, 1),
        ("▁a", -1.0, 1),
        ("<start_of_turn>", 0.0, 4),
    ];
    let tokens: Vec<&str> = vocab.iter().map(|t| t.0).collect();
    let scores: Vec<Encoded> = vocab.iter().map(|t| f32_value(t.1)).collect();
    let types: Vec<i32> = vocab.iter().map(|t| t.2).collect();
    let builder = GgufBuilder::new()
        .pair("general.architecture", string_value("gemma3"))
        .pair("gemma3.block_count", u32_value(1))
        .pair("gemma3.context_length", u32_value(8))
        .pair("gemma3.embedding_length", u32_value(EMBEDDING as u32))
        .pair("gemma3.feed_forward_length", u32_value(FEED_FORWARD as u32))
        .pair("gemma3.attention.head_count", u32_value(2))
        .pair("gemma3.attention.head_count_kv", u32_value(1))
        .pair("gemma3.attention.key_length", u32_value(HEAD_DIM as u32))
        .pair("gemma3.attention.value_length", u32_value(HEAD_DIM as u32))
        .pair("gemma3.attention.sliding_window", u32_value(4))
        .pair("gemma3.attention.layer_norm_rms_epsilon", f32_value(1e-6))
        .pair("gemma3.rope.freq_base", f32_value(1_000_000.0))
        .pair("tokenizer.ggml.model", string_value("llama"))
        .pair("tokenizer.ggml.pre", string_value("default"))
        .pair("tokenizer.ggml.tokens", string_array(&tokens))
        .pair("tokenizer.ggml.scores", array_value(GGUF_TYPE_F32, &scores))
        .pair("tokenizer.ggml.token_type", i32_array(&types))
        .pair("tokenizer.ggml.bos_token_id", u32_value(2))
        .pair("tokenizer.ggml.eos_token_id", u32_value(1))
        .pair("tokenizer.ggml.add_bos_token", bool_value(true))
        .pair("tokenizer.ggml.add_space_prefix", bool_value(false));
    let mut builder = with_tensor(
        builder,
        "token_embd.weight",
        matrix(vocab.len() as u64, EMBEDDING, Q8_0, 9),
    );
    for name in ["attn_q_norm", "attn_k_norm"] {
        builder = with_tensor(builder, &format!("blk.0.{name}.weight"), ones(HEAD_DIM));
    }
    for name in ["post_attention_norm", "post_ffw_norm"] {
        builder = with_tensor(builder, &format!("blk.0.{name}.weight"), ones(EMBEDDING));
    }
    common_layer(builder, 2, 1).build()
}

/// A saved cache of [`sample::specs`] after three appends, without its CRC-32 (the target
/// appends it, see `tq_fuzz::with_crc`).
fn saved_cache(allocation: &Allocation) -> Vec<u8> {
    let mut cache = sample::cache(allocation).unwrap();
    // The first batch is longer than the head dimension, so a basis stream fits its basis.
    for (tokens, seed) in [(17, 1), (2, 2), (1, 3)] {
        sample::append(&mut cache, tokens, seed).unwrap();
    }
    let mut bytes = tq_cache::persist::to_bytes(&cache).unwrap();
    bytes.truncate(bytes.len() - 4);
    bytes
}

fn generated() -> Vec<(&'static str, String, Vec<u8>)> {
    let mut seeds = vec![
        ("gguf", "gen-llama.gguf".to_string(), tiny_llama()),
        ("gguf", "gen-gemma3.gguf".to_string(), tiny_gemma3()),
    ];
    for preset in CACHE_PRESETS {
        let allocation = Allocation::preset(preset).unwrap();
        seeds.push((
            "cache_file",
            format!("gen-{preset}.tqc"),
            saved_cache(&allocation),
        ));
    }
    let basis = Allocation::from_toml_str(BASIS).unwrap();
    seeds.push(("cache_file", "gen-basis.tqc".into(), saved_cache(&basis)));
    seeds
}

#[test]
fn generated_seeds_are_committed_and_load_all_the_way() {
    let write = std::env::var("TQ_WRITE_FUZZ_SEEDS").as_deref() == Ok("1");
    for (target, name, bytes) in generated() {
        let path = seed_dir(target).join(&name);
        if write {
            std::fs::write(&path, &bytes).unwrap();
        } else {
            let committed = std::fs::read(&path).unwrap_or_else(|e| {
                panic!(
                    "{}: {e}; regenerate with TQ_WRITE_FUZZ_SEEDS=1",
                    path.display()
                )
            });
            // A saved cache holds codes computed in floating point, which this test does not
            // ask to be the same bits on every machine; a GGUF seed is bytes written by hand.
            assert!(
                target != "gguf" || committed == bytes,
                "{} differs from what this test writes; regenerate with TQ_WRITE_FUZZ_SEEDS=1",
                path.display()
            );
        }
    }
    // Each GGUF seed must reach the end of the GGUF target: a tokenizer and a model that runs.
    for (name, arch) in [("gen-llama.gguf", "llama"), ("gen-gemma3.gguf", "gemma3")] {
        let file = Arc::new(
            Gguf::from_bytes(std::fs::read(seed_dir("gguf").join(name)).unwrap()).unwrap(),
        );
        Tokenizer::from_gguf(&file).unwrap();
        let model: Box<dyn CausalLm> = match arch {
            "llama" => Box::new(Llama::from_gguf(file).unwrap()),
            _ => Box::new(Gemma3::from_gguf(file).unwrap()),
        };
        assert_eq!(model.dims().layers, 1, "{name}");
        let mut cache = model
            .new_cache(&Allocation::preset("f16").unwrap(), 2)
            .unwrap();
        let logits = model
            .forward(
                &[0, 1],
                &[0, 1],
                &mut cache,
                AttentionKernel::Fused,
                Logits::Last,
                &mut ForwardScratch::default(),
            )
            .unwrap()
            .to_vec();
        assert!(logits.iter().all(|x| x.is_finite()), "{name}: {logits:?}");
        tq_fuzz::gguf(&std::fs::read(seed_dir("gguf").join(name)).unwrap());
    }
    for preset in CACHE_PRESETS.iter().chain(&["basis"]) {
        let contents =
            std::fs::read(seed_dir("cache_file").join(format!("gen-{preset}.tqc"))).unwrap();
        tq_cache::persist::from_bytes(&tq_fuzz::with_crc(&contents))
            .unwrap_or_else(|e| panic!("{preset}: {e}"));
    }
}
