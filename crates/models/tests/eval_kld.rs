//! The reference engine's KL-divergence bookkeeping (`tq_models::eval::kld`) and the
//! perplexity protocol's chunking, on cases with known answers and as property tests with a
//! fixed seed (no model needed).

use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use tq_models::eval::kld::{BaseLogProbs, KldStats, WINDOW, percentile};
use tq_models::eval::metrics::{log_softmax_into, log_sum_exp};
use tq_models::eval::perplexity::protocol_chunks;

fn runner() -> TestRunner {
    TestRunner::new_with_rng(
        Config {
            cases: 256,
            ..Config::default()
        },
        TestRng::from_seed(RngAlgorithm::ChaCha, &[13; 32]),
    )
}

/// Logits spanning less than the 16-nat window, so no entry is clamped and the bounds below
/// are the quantization's alone.
fn logits() -> impl Strategy<Value = Vec<f32>> {
    prop::collection::vec(-7.0f32..7.0, 2..400)
}

fn exact_log_probs(x: &[f32]) -> Vec<f64> {
    let lse = log_sum_exp(x);
    x.iter().map(|&v| f64::from(v) - lse).collect()
}

/// Each stored log-probability is within half a step of the exact one, plus the f32 rounding
/// the engine's own arithmetic has (the step index `(x − floor)/scale` computed in f32 is off by
/// at most 65535·3·2⁻²⁴ ≈ 0.012 steps; the floor's log-probability and the decode `scale·i +
/// floor` are f32 values below 16 in magnitude, a few ulps of 16 ≈ 2e-6 each: 1e-5 covers them),
/// and the returned NLL is the exact one. A step off (wrong rounding, wrong floor, wrong
/// scale) breaks the bound by a factor of two.
#[test]
fn stored_log_probs_are_within_half_a_step() {
    runner()
        .run(&(logits(), any::<prop::sample::Index>()), |(x, t)| {
            let target = t.index(x.len());
            let mut base = BaseLogProbs::default();
            let nll = base.quantize(&x, target);
            let exact = exact_log_probs(&x);
            prop_assert!((nll + exact[target]).abs() < 1e-9);
            let max = x.iter().copied().fold(f32::MIN, f32::max);
            let min = x.iter().copied().fold(f32::MAX, f32::min);
            let step = f64::from((max - min) / 65535.0);
            for (i, &e) in exact.iter().enumerate() {
                let stored = f64::from(base.log_prob(i));
                prop_assert!(
                    (stored - e).abs() <= 0.512 * step + 1e-5,
                    "entry {}: stored {} exact {} step {}",
                    i,
                    stored,
                    e,
                    step
                );
            }
            Ok(())
        })
        .unwrap();
}

/// KL of a distribution against itself through the stored base is no larger than the
/// storage's half step (`Σ p̂ (ln p̂ − ln p)` with `|ln p̂ − ln p| ≤ step/2`), and adding a
/// constant to every logit changes nothing (softmax shift invariance).
#[test]
fn kl_against_itself_is_the_storage_floor() {
    runner()
        .run(&(logits(), -5.0f32..5.0), |(x, shift)| {
            let mut base = BaseLogProbs::default();
            base.quantize(&x, 0);
            let max = x.iter().copied().fold(f32::MIN, f32::max);
            let min = x.iter().copied().fold(f32::MAX, f32::min);
            let step = f64::from((max - min) / 65535.0);
            let kl = base.kl_divergence(&x);
            prop_assert!(
                kl.abs() <= 0.5 * step * 1.01 + 1e-6,
                "kl {} step {}",
                kl,
                step
            );
            let shifted: Vec<f32> = x.iter().map(|v| v + shift).collect();
            let kl_shifted = base.kl_divergence(&shifted);
            prop_assert!((kl_shifted - kl).abs() < 1e-5);
            Ok(())
        })
        .unwrap();
}

/// Against a different distribution the stored-base KL is the exact KL up to the storage
/// error: `|KL̂ − KL| ≤ δ·(1 + e^δ·E_p|ln p − ln q|) + …` with `δ` half a step; a wrong sign,
/// a missing `p` weight or a log in another base fails by orders of magnitude.
#[test]
fn kl_against_another_distribution_is_exact_up_to_the_storage() {
    runner()
        .run(
            &(logits(), prop::collection::vec(-1.0f32..1.0, 400)),
            |(x, noise)| {
                let y: Vec<f32> = x.iter().zip(&noise).map(|(a, b)| a + b).collect();
                let mut base = BaseLogProbs::default();
                base.quantize(&x, 0);
                let lp = exact_log_probs(&x);
                let lq = exact_log_probs(&y);
                let exact: f64 = lp.iter().zip(&lq).map(|(p, q)| p.exp() * (p - q)).sum();
                let spread: f64 = lp
                    .iter()
                    .zip(&lq)
                    .map(|(p, q)| p.exp() * (p - q).abs())
                    .sum();
                let max = x.iter().copied().fold(f32::MIN, f32::max);
                let min = x.iter().copied().fold(f32::MAX, f32::min);
                let delta = 0.5 * f64::from((max - min) / 65535.0) + 1e-6;
                let got = base.kl_divergence(&y);
                prop_assert!(
                    (got - exact).abs() <= delta * (1.0 + 1.01 * spread) + 1e-9,
                    "got {} exact {} delta {}",
                    got,
                    exact,
                    delta
                );
                Ok(())
            },
        )
        .unwrap();
}

/// Entries more than 16 nats below the top are clamped and left out of the sum, as the
/// engine does; the argmax is the first of the largest.
#[test]
fn window_floor_and_argmax() {
    let x = [0.0f32, 5.0, -30.0, 5.0];
    let mut base = BaseLogProbs::default();
    base.quantize(&x, 1);
    assert_eq!(base.argmax(), 1);
    assert!(base.log_prob(2) <= -WINDOW + 1e-4);
    let mut lp = [0.0f32; 4];
    log_softmax_into(&x, &mut lp);
    assert!((base.log_prob(0) - lp[0]).abs() < 2e-4);
    // Equal logits: a zero scale, every entry the floor, KL against itself 0.
    let flat = [1.0f32; 5];
    base.quantize(&flat, 0);
    assert!((base.log_prob(3) + (5.0f32).ln()).abs() < 1e-6);
    assert!(base.kl_divergence(&flat).abs() < 1e-6);
}

#[test]
fn percentiles_interpolate_like_the_engine() {
    let odd: Vec<f64> = (0..=100).map(f64::from).collect();
    assert_eq!(percentile(&odd, 0.5), 50.0);
    assert_eq!(percentile(&odd, 0.99), 99.0);
    let even = [1.0, 2.0, 4.0, 8.0];
    assert_eq!(percentile(&even, 0.5), 3.0);
    assert!((percentile(&even, 0.99) - (0.03 * 4.0 + 0.97 * 8.0)).abs() < 1e-12);
    assert_eq!(percentile(&[], 0.5), 0.0);
    assert_eq!(percentile(&[7.0], 0.99), 7.0);
}

/// The summary's "±" are the engine's formulas, checked on hand-computed values.
#[test]
fn summary_matches_the_engine_formulas() {
    let mut stats = KldStats::default();
    for nll in [1.0, 2.0, 3.0, 4.0] {
        stats.add_nll(nll);
    }
    let s = stats.summary();
    let mean: f64 = 2.5;
    let var: f64 = (1.0 + 4.0 + 9.0 + 16.0) / 4.0 - mean * mean;
    assert_eq!(s.count, 4);
    assert!((s.ppl - mean.exp()).abs() < 1e-12);
    assert!((s.ppl_err - mean.exp() * (var / 3.0).sqrt()).abs() < 1e-12);
    assert_eq!(s.kld_mean, None);
    let mut base_stats = KldStats::default();
    base_stats.add_base(1.0);
    base_stats.add_base(2.0);
    let b = base_stats.summary();
    assert_eq!((b.kld_mean, b.same_top_p), (Some(0.0), Some(100.0)));
}

#[test]
fn chunks_drop_the_remainder_and_overwrite_the_first_token() {
    let tokens: Vec<u32> = (10..31).collect(); // 21 tokens
    let chunks = protocol_chunks(&tokens, 8, None, None);
    assert_eq!(
        chunks,
        vec![(10..18).collect::<Vec<_>>(), (18..26).collect()]
    );
    let with_bos = protocol_chunks(&tokens, 8, Some(2), None);
    assert_eq!(with_bos[1][0], 2, "replaced, not inserted");
    assert_eq!(with_bos[1][1..], tokens[9..16]);
    assert_eq!(protocol_chunks(&tokens, 8, None, Some(1)).len(), 1);
}

/// A window that covers the whole chunk is refused with the fields named; one that leaves
/// compressed tokens is accepted.
#[test]
fn windows_covering_the_chunk_are_refused() {
    use tq_cache::allocation::Allocation;
    use tq_models::eval::perplexity::check_windows;
    let mut a = Allocation::preset("rec4.25").unwrap();
    assert!(check_windows([&a], 512).is_ok());
    a.recent_fp_tokens = 510;
    let err = check_windows([&a], 512).unwrap_err().to_string();
    assert!(
        err.contains("recent window (510 tokens") && err.contains("sink_tokens (2)"),
        "{err}"
    );
    assert!(check_windows([&a], 2048).is_ok());
    // One stream's own window counts too (the longest of any stream).
    let mut b = Allocation::preset("rec4.25").unwrap();
    b.value.recent_fp_tokens = Some(600);
    b.value.recent_fraction = None;
    let err = check_windows([&b], 512).unwrap_err().to_string();
    assert!(err.contains("recent window (600 tokens"), "{err}");
    assert!(check_windows([&b], 1024).is_ok());
    // A fraction is of the tokens held, the chunk at its end: the same fraction covers it at
    // every context, or at none (alone here: a count beside it is its floor).
    b.value.recent_fp_tokens = None;
    b.value.recent_fraction = Some(0.9995);
    for ctx in [512, 4096] {
        let err = check_windows([&b], ctx).unwrap_err().to_string();
        let window = (0.9995 * ctx as f64).round();
        assert!(
            err.contains(&format!("recent window ({window} tokens")),
            "{err}"
        );
    }
    b.value.recent_fraction = Some(0.5);
    assert!(check_windows([&b], 512).is_ok() && check_windows([&b], 4096).is_ok());
}
