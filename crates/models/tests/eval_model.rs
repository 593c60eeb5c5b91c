//! `tq_models::eval::evaluate` on the real model over a short text: the reference row agrees
//! with itself exactly, compressed caches diverge measurably and more for fewer bits, the
//! byte counts match the allocation formulas, and a lane's figures do not depend on which
//! other allocations run beside it.
//!
//! Needs the reference model (skipped with a message when absent, failing instead when
//! `TQ_REQUIRE_MODEL=1`).

mod gguf_common;

use gguf_common::reference_model_or_skip;
use tq_cache::allocation::Allocation;
use tq_models::eval::{EvalOptions, EvalRow, evaluate};
use tq_models::llama::Llama;
use tq_models::tokenizer::Tokenizer;

/// A short public-domain text (the opening of the U.S. Declaration of Independence).
const TEXT: &str = "When in the Course of human events, it becomes necessary for one people to \
dissolve the political bands which have connected them with another, and to assume among the \
powers of the earth, the separate and equal station to which the Laws of Nature and of \
Nature's God entitle them, a decent respect to the opinions of mankind requires that they \
should declare the causes which impel them to the separation.";

fn allocations(names: &[&str]) -> Vec<(String, Allocation)> {
    names
        .iter()
        .map(|n| (n.to_string(), Allocation::preset(n).expect("preset")))
        .collect()
}

fn find<'r>(rows: &'r [EvalRow], name: &str) -> &'r EvalRow {
    rows.iter().find(|r| r.alloc == name).expect("row present")
}

#[test]
fn evaluation_against_the_f16_cache() {
    let Some(path) = reference_model_or_skip() else {
        return;
    };
    let model = Llama::load(&path).expect("the reference model loads");
    let tokenizer = Tokenizer::from_gguf(model.file()).expect("tokenizer");
    let tokens = tokenizer.encode(TEXT).expect("encodes");
    let reference = Allocation::preset("f16").unwrap();
    let options = EvalOptions {
        prefill_chunk: 32,
        decode_steps: 3,
        ..EvalOptions::default()
    };
    let mut calls = 0;
    let report = evaluate(
        &model,
        &tokens,
        ("f16", &reference),
        &allocations(&["f16", "mse-k4v4", "tq2.5"]),
        &options,
        |done, total| {
            calls += 1;
            assert!(done <= total);
        },
    )
    .expect("evaluates");
    assert_eq!(
        calls,
        tokens.len().div_ceil(32) * 3 + 3,
        "f16 runs once, as lane and reference; then one decode run per lane"
    );
    let layers = model.config.layers;

    let f16 = find(&report.rows, "f16");
    assert_eq!(f16.text.positions, tokens.len() - 1);
    assert_eq!(f16.text.mean_kl, 0.0);
    assert_eq!(f16.text.top1_agreement, 1.0);
    assert!(f16.text.perplexity > 1.0 && f16.text.perplexity < model.config.vocab as f64);
    assert_eq!(f16.cost.bits_per_value, 16.0);
    assert_eq!(f16.layer_score_error.len(), layers);
    assert!(
        f16.layer_score_error.iter().all(|&e| e > 0.0 && e < 1e-2),
        "{f16:?}"
    );

    let mse = find(&report.rows, "mse-k4v4");
    let tq = find(&report.rows, "tq2.5");
    assert_eq!(mse.cost.bits_per_value, 4.25);
    assert_eq!(tq.cost.bits_per_value, 3.0);
    for row in [f16, mse, tq] {
        assert_eq!(row.cost.cache_bytes_allocated, row.cost.cache_bytes_formula);
        assert!(row.text.perplexity.is_finite() && row.tokens_per_s > 0.0);
        assert!(row.decode_steps == 3 && row.decode_tokens_per_s > 0.0);
    }
    assert!(mse.text.mean_kl > 0.0 && mse.text.max_kl >= mse.text.mean_kl);
    // 3 stored bits per value (2-bit body) against 4.25: every layer's scores move more.
    assert!(
        tq.mean_score_error > mse.mean_score_error,
        "{tq:?} vs {mse:?}"
    );
    assert!(mse.mean_score_error > 10.0 * f16.mean_score_error);
    assert!(report.peak_rss_bytes.is_none_or(|b| b > 0));

    // Lanes are independent: mse-k4v4 alone (reference run separately) gives the same figures.
    let alone = evaluate(
        &model,
        &tokens,
        ("f16", &reference),
        &allocations(&["mse-k4v4"]),
        &options,
        |_, _| {},
    )
    .expect("evaluates");
    let alone = &alone.rows[0];
    assert_eq!(alone.text, mse.text);
    assert_eq!(alone.layer_score_error, mse.layer_score_error);
}
