//! The next-token metric math of `tq_models::eval` on cases with known answers, and its
//! invariants as property tests (fixed seeds: `proptest` config below).

use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use tq_models::eval::memory::parse_vm_hwm;
use tq_models::eval::metrics::{
    TextMetrics, argmax, kl_divergence, log_softmax_into, log_sum_exp, negative_log_likelihood,
};

fn log_softmax(logits: &[f32]) -> Vec<f32> {
    let mut out = vec![0.0; logits.len()];
    log_softmax_into(logits, &mut out);
    out
}

fn runner() -> TestRunner {
    TestRunner::new_with_rng(
        Config {
            cases: 128,
            ..Config::default()
        },
        TestRng::from_seed(RngAlgorithm::ChaCha, &[7; 32]),
    )
}

fn logits(len: std::ops::Range<usize>) -> impl Strategy<Value = Vec<f32>> {
    prop::collection::vec(-20.0f32..20.0, len)
}

#[test]
fn kl_of_a_distribution_with_itself_is_zero() {
    runner()
        .run(&logits(1..300), |x| {
            prop_assert_eq!(kl_divergence(&log_softmax(&x), &x), 0.0);
            Ok(())
        })
        .unwrap();
}

#[test]
fn kl_is_non_negative_and_ignores_a_logit_shift() {
    // A sign error or a missing log-sum-exp normalization of Q breaks one of the two.
    let pairs = (1usize..200).prop_flat_map(|n| {
        (
            prop::collection::vec(-20.0f32..20.0, n),
            prop::collection::vec(-20.0f32..20.0, n),
            -50.0f32..50.0,
        )
    });
    runner()
        .run(&pairs, |(p, q, shift)| {
            let lp = log_softmax(&p);
            let kl = kl_divergence(&lp, &q);
            prop_assert!(kl >= -1e-6, "KL = {kl}");
            let shifted: Vec<f32> = q.iter().map(|x| x + shift).collect();
            let kl_shifted = kl_divergence(&lp, &shifted);
            prop_assert!(
                (kl - kl_shifted).abs() <= 1e-5 * (1.0 + kl),
                "{kl} vs {kl_shifted}"
            );
            Ok(())
        })
        .unwrap();
}

#[test]
fn kl_of_a_two_point_case_matches_its_definition() {
    // P = (1/2, 1/2), Q = (1/4, 3/4): KL = ½·ln(½ / ¼) + ½·ln(½ / ¾).
    let p = log_softmax(&[0.0, 0.0]);
    let q_logits = [0.0f32, 3.0f32.ln()];
    let expected = 0.5 * (0.5f64 / 0.25).ln() + 0.5 * (0.5f64 / 0.75).ln();
    let kl = kl_divergence(&p, &q_logits);
    assert!((kl - expected).abs() < 1e-7, "{kl} vs {expected}");
    // And the reverse direction differs (KL is not symmetric): ¼·ln(¼/½) + ¾·ln(¾/½).
    let reverse = kl_divergence(&log_softmax(&q_logits), &[0.0, 0.0]);
    let expected_reverse = 0.25 * (0.25f64 / 0.5).ln() + 0.75 * (0.75f64 / 0.5).ln();
    assert!((reverse - expected_reverse).abs() < 1e-7);
}

#[test]
fn perplexity_of_uniform_logits_is_the_vocabulary_size() {
    let cases = (1usize..5000, -30.0f32..30.0, 1usize..8);
    runner()
        .run(&cases, |(vocab, value, positions)| {
            let row = vec![value; vocab];
            let lp = log_softmax(&row);
            let mut metrics = TextMetrics::default();
            for i in 0..positions {
                metrics.add(&lp, &row, (i * 7919) % vocab);
            }
            let summary = metrics.summary();
            prop_assert_eq!(summary.positions, positions);
            let relative = (summary.perplexity - vocab as f64).abs() / vocab as f64;
            prop_assert!(
                relative < 1e-9,
                "perplexity {} for vocab {vocab}",
                summary.perplexity
            );
            prop_assert_eq!(summary.mean_kl, 0.0);
            prop_assert_eq!(summary.top1_agreement, 1.0);
            Ok(())
        })
        .unwrap();
}

#[test]
fn negative_log_likelihood_and_log_sum_exp_of_small_cases() {
    // softmax(0, ln 3) = (1/4, 3/4).
    let x = [0.0f32, 3.0f32.ln()];
    assert!((negative_log_likelihood(&x, 1) - (-(0.75f64).ln())).abs() < 1e-7);
    assert!((negative_log_likelihood(&x, 0) - (-(0.25f64).ln())).abs() < 1e-7);
    assert!((log_sum_exp(&x) - 4.0f64.ln()).abs() < 1e-7);
    // Large logits do not overflow: ln(e^1000 + e^1000) = 1000 + ln 2.
    assert!((log_sum_exp(&[1000.0, 1000.0]) - (1000.0 + 2.0f64.ln())).abs() < 1e-9);
    assert_eq!(log_sum_exp(&[]), f64::NEG_INFINITY);
}

#[test]
fn top1_agreement_counts_matching_argmax_positions() {
    assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1, "first maximum on ties");
    let reference = log_softmax(&[0.0, 5.0, 1.0]);
    let mut metrics = TextMetrics::default();
    metrics.add(&reference, &[0.0, 5.0, 1.0], 1); // agrees
    metrics.add(&reference, &[0.0, 1.0, 5.0], 1); // disagrees
    metrics.add(&reference, &[0.0, 4.0, 1.0], 0); // agrees
    let summary = metrics.summary();
    assert_eq!(summary.top1_agreement, 2.0 / 3.0);
    assert!(summary.max_kl > 0.0 && summary.mean_kl <= summary.max_kl);
}

#[test]
fn peak_rss_line_parses_in_bytes() {
    let status = "Name:\ttq\nVmPeak:\t  2000 kB\nVmHWM:\t    1536 kB\nVmRSS:\t 1000 kB\n";
    assert_eq!(parse_vm_hwm(status), Some(1536 * 1024));
    assert_eq!(parse_vm_hwm("VmHWM:\t12 MB\n"), None, "unknown unit");
    assert_eq!(parse_vm_hwm("VmRSS:\t12 kB\n"), None);
}
