//! `tq_models::eval::perplexity` against the reference engine's own `llama-perplexity` figures
//! for SmolLM2 on the GPL-3 text (`tests/data/llamacpp_perplexity_smollm2.json`).
//!
//! The bound is the engine's own spread, not a rounding allowance: its two builds and its two
//! attention kernels put the f16 perplexity at 18.3459, 18.3541 and 18.3914 at ctx 512 (0.25%
//! apart), so a protocol error — wrong chunking, a missing or extra BOS, the wrong half
//! scored, an off-by-one in the scored positions — shows up as several percent (scoring the
//! first half instead of the second raises it by ~30%), far outside 0.3%.
//! - The default fused kernel (f32 scores and accumulator) is within 0.3% of both builds at
//!   ctx 512 and 2048 (measured 2026-12-05: +0.20% / −0.05% at 512, +0.07% / +0.18% at 2048).
//!   Its f16 bits are the same on every instruction set (plain records sum in one order on
//!   every path, `tq_cache::attention::primitives::lane8_dot`), so this test gives one answer
//!   on every machine. How close that answer sits to the bound is rounding, not protocol: the
//!   8-bit activation rounding turns any change of a score's summation order into a move of
//!   about 0.2% (AVX-512's former 16-lane order gave −0.30% at 512 and +0.35% at 2048), the
//!   size of the engine's own spread.
//! - The kernel that rounds like the engine's decode-path flash attention (f16 query and f16
//!   value accumulator: what greedy parity needs) is within 0.3% of both at ctx 512
//!   (measured +0.23% against the first build, −0.02% against the later one). The issue's
//!   0.05% against the first build is not met, and at ctx 2048 it is +0.5%: the engine
//!   itself switches prompt micro-batches of 64 rows or more to a tiled kernel with an f32
//!   accumulator, which this kernel does not reproduce (docs/results.md), so it is checked
//!   where it applies, at 512 only.
//!
//! Needs the reference model (skipped with a message when absent, failing instead when
//! `TQ_REQUIRE_MODEL=1`).

mod gguf_common;

use gguf_common::reference_model_or_skip;
use serde_json::Value;
use tq_cache::allocation::Allocation;
use tq_cache::attention::AttentionKernel;
use tq_models::eval::{PerplexityOptions, perplexity};
use tq_models::llama::Llama;
use tq_models::quant::Q8Order;
use tq_models::tokenizer::Tokenizer;

fn reference() -> Value {
    serde_json::from_str(include_str!("data/llamacpp_perplexity_smollm2.json"))
        .expect("reference JSON parses")
}

/// The text as `llama-perplexity -f` reads it: one trailing newline dropped.
fn text() -> &'static str {
    include_str!("data/GPL-3.txt")
        .strip_suffix('\n')
        .expect("the file ends with a newline")
}

/// The f16/f16 perplexity of a build's rows at `ctx` (flash attention on where recorded).
fn f16_ppl(rows: &Value, ctx: u64) -> f64 {
    rows.as_array()
        .unwrap()
        .iter()
        .find(|r| {
            r["ctx"] == ctx
                && r["cache_k"] == "f16"
                && r["cache_v"] == "f16"
                && r.get("flash_attn").is_none_or(|f| f == "on")
        })
        .and_then(|r| r["ppl"].as_f64())
        .expect("an f16 row at this context")
}

#[test]
fn f16_perplexity_matches_the_reference_engine() {
    let Some(path) = reference_model_or_skip() else {
        return;
    };
    let model = Llama::load(&path).expect("the reference model loads");
    // The reference-compatible kernel runs with the engine's weight summation order too.
    let mut parity_model = model.clone();
    parity_model.q8_order = Q8Order::LlamaCppAvx2;
    let tokenizer = Tokenizer::from_gguf(model.file()).expect("tokenizer");
    let reference = reference();
    let tokens = tokenizer.encode(text()).unwrap();
    assert_eq!(
        tokens.len() as u64,
        reference["text_tokens"].as_u64().unwrap(),
        "the text must tokenize as the engine tokenized it"
    );
    assert!(!tokenizer.add_bos(), "SmolLM2 adds no BOS");
    let f16 = vec![("f16".to_string(), Allocation::preset("f16").unwrap())];
    let mut report = Vec::new();
    let mut failures = Vec::new();
    for ctx in [512u64, 2048] {
        let first = f16_ppl(&reference["first_build"], ctx);
        let later = f16_ppl(&reference["later_build"], ctx);
        let mut kernels = vec![AttentionKernel::Fused];
        if ctx == 512 {
            kernels.push(AttentionKernel::LlamaCppF16);
        }
        for kernel in kernels {
            let (bound, against) = (0.003, [first, later]);
            let options = PerplexityOptions {
                ctx: ctx as usize,
                kernel,
                ..PerplexityOptions::default()
            };
            let model = match kernel {
                AttentionKernel::LlamaCppF16 => &parity_model,
                _ => &model,
            };
            let run = perplexity(model, &tokens, None, None, &f16, &options, |_, _| {}).unwrap();
            let row = &run.rows[0];
            let expected_chunks = tokens.len() / ctx as usize;
            assert_eq!(run.chunks, expected_chunks);
            assert_eq!(row.scored_tokens, expected_chunks * (ctx as usize / 2 - 1));
            assert!((row.bits_per_value - 16.0).abs() < 1e-12);
            for r in against {
                let off = row.ppl / r - 1.0;
                report.push(format!(
                    "ctx {ctx} {kernel:?}: {:.4} vs {r} ({:+.3}%)",
                    row.ppl,
                    100.0 * off
                ));
                if off.abs() > bound {
                    failures.push(report.last().unwrap().clone());
                }
            }
        }
    }
    eprintln!("{}", report.join("\n"));
    assert!(failures.is_empty(), "outside the bound: {failures:?}");
}

/// The KL-divergence mode on a short run: the base row reports 0 and 100% by definition, a
/// quantized cache a positive KL that grows as bits fall, and the base run's perplexity does
/// not change when allocations run beside it (the lanes share nothing but the text).
#[test]
fn kl_divergence_mode_orders_allocations() {
    let Some(path) = reference_model_or_skip() else {
        return;
    };
    let model = Llama::load(&path).expect("the reference model loads");
    let tokenizer = Tokenizer::from_gguf(model.file()).expect("tokenizer");
    let tokens = tokenizer.encode(text()).unwrap();
    let f16 = Allocation::preset("f16").unwrap();
    // `rec4.25`'s levers with a 56-token f16 window (the preset until 2026-12-04): its 8-bit
    // windows of 256 tokens would cover a whole 256-token chunk (a typed refusal; its all-in
    // bits are pinned by `limits.rs`).
    let w56 = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../cache/presets/levers/rec4.25-w56.toml"
    );
    let allocations: Vec<(String, Allocation)> = vec![
        ("mse-k4v4".into(), Allocation::preset("mse-k4v4").unwrap()),
        ("tq2.5".into(), Allocation::preset("tq2.5").unwrap()),
        ("rec4.25-w56".into(), Allocation::load(w56).unwrap()),
    ];
    let options = PerplexityOptions {
        ctx: 256,
        max_chunks: Some(2),
        ..PerplexityOptions::default()
    };
    let run = perplexity(
        &model,
        &tokens,
        None,
        Some(("f16", &f16)),
        &allocations,
        &options,
        |_, _| {},
    )
    .unwrap();
    assert_eq!(run.rows.len(), 4);
    let base = &run.rows[0];
    assert!(base.base && base.alloc == "f16");
    assert_eq!(base.kld_mean, Some(0.0));
    assert_eq!(base.same_top_p, Some(100.0));
    let alone = perplexity(
        &model,
        &tokens,
        None,
        None,
        &[("f16".to_string(), f16.clone())],
        &options,
        |_, _| {},
    )
    .unwrap();
    assert_eq!(alone.rows[0].ppl, base.ppl, "lanes must not interact");
    let (k4, k25) = (&run.rows[1], &run.rows[2]);
    assert!(k4.kld_mean.unwrap() > 0.0);
    assert!(
        k25.kld_mean.unwrap() > k4.kld_mean.unwrap(),
        "fewer bits, more divergence: {k4:?} {k25:?}"
    );
    assert!(k25.bits_per_value < k4.bits_per_value);
    assert!(k4.same_top_p.unwrap() < 100.0);
    // All-in bits at 256 tokens, per KV head and layer: keys 34 B and values 26 B per token
    // (4- and 3-bit codes plus an f16 norm); per stream 2 f16 sink tokens and a 56-token f16
    // window (58 · 128 B) and a 64-f32 mean (256 B): 8·(256·60 + 2·7680) / (2·256·64) = 7.5
    // bits — the fixed window weighs as much as the codes at this short context; plus each key
    // stream's plane fit, which depends on the data: 2 bytes per kept coordinate and 8 per
    // group (0 for a stream left on the plain codec), at most 2·64 + 8·8 bytes.
    let values = (2 * 256 * 64 * 30 * 3) as f64;
    let fits = (run.rows[3].bits_per_value - 7.5) * values / 8.0;
    assert!(
        fits >= 0.0 && fits <= (90 * (2 * 64 + 8 * 8)) as f64 && (fits - fits.round()).abs() < 1e-6,
        "plane fits of {fits} bytes: {:?}",
        run.rows[3]
    );
    assert_eq!(k4.bits_per_value, 4.25);
}
