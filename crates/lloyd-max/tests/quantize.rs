//! Encoding and decoding: `quantize` is the nearest-centroid rule, agrees with the `f64`
//! decision rule on every `f32`, and `quantize_slice` matches it elementwise.

mod common;

use common::fixed_config;
use proptest::prelude::*;
use tq_lloyd_max::{CoordinateDistribution, LloydMaxCodebook, LloydMaxError};

fn codebook(dim: usize, gaussian: bool, bits: u8) -> LloydMaxCodebook {
    let law = if gaussian {
        CoordinateDistribution::Gaussian { dim }
    } else {
        CoordinateDistribution::Beta { dim }
    };
    LloydMaxCodebook::new(law, bits).expect("solvable")
}

/// The first index minimizing `|x − c_k|`, and whether the runner-up is a tie to within
/// rounding (then either answer is a nearest centroid and the case is skipped).
fn brute_force(centroids: &[f64], x: f64) -> (usize, bool) {
    let distances: Vec<f64> = centroids.iter().map(|c| (x - c).abs()).collect();
    let best = (0..distances.len()).fold(0, |best, k| {
        if distances[k] < distances[best] {
            k
        } else {
            best
        }
    });
    let tie = distances
        .iter()
        .enumerate()
        .any(|(k, &d)| k != best && d - distances[best] <= 1e-15 * (1.0 + x.abs()));
    (best, tie)
}

/// Inputs spread over the codebook's range: z ~ ±5 σ (sometimes far outside), in f32.
fn input(sigma: f64) -> impl Strategy<Value = f32> {
    prop_oneof![
        8 => (-5.0f64..5.0).prop_map(move |z| (z * sigma) as f32),
        1 => (-1.5f64..1.5).prop_map(|t| t as f32),
    ]
}

proptest! {
    #![proptest_config(fixed_config(64, 0x9e37_79b9))]

    #[test]
    fn quantize_is_the_nearest_centroid(
        dim in 3usize..5000,
        gaussian in any::<bool>(),
        bits in 1u8..=8,
        raw in prop::collection::vec(-5.0f64..5.0, 200),
    ) {
        let codebook = codebook(dim, gaussian, bits);
        let sigma = codebook.distribution().std_dev();
        let mut checked = 0;
        for z in raw {
            let x = (z * sigma) as f32;
            let code = codebook.quantize(x);
            // Exact agreement with the f64 rule, ties included.
            prop_assert_eq!(code, codebook.quantize_f64(f64::from(x)));
            let (nearest, tie) = brute_force(codebook.centroids(), f64::from(x));
            if !tie {
                prop_assert_eq!(usize::from(code), nearest, "x = {}", x);
                checked += 1;
            }
        }
        // Ties have probability ~0 for continuous inputs; make sure the test did its job.
        prop_assert!(checked >= 190);
    }

    #[test]
    fn quantize_slice_matches_quantize(
        dim in 3usize..5000,
        gaussian in any::<bool>(),
        bits in 1u8..=8,
        values in prop::collection::vec(input(1.0 / 8.0), 0..300),
    ) {
        // Lengths 0..300 cross the 64-value blocks of the vectorized path at every offset.
        let codebook = codebook(dim, gaussian, bits);
        let mut codes = vec![0xAA_u8; values.len()];
        codebook.quantize_slice(&values, &mut codes).expect("same length");
        for (x, code) in values.iter().zip(&codes) {
            prop_assert_eq!(*code, codebook.quantize(*x));
        }
    }
}

/// `thresholds_f32[k]` is the largest f32 ≤ `thresholds[k]`, which is what makes the f32
/// comparison exact.
#[test]
fn f32_thresholds_round_down() {
    for bits in 1..=8 {
        for codebook in [
            codebook(128, false, bits),
            codebook(1, true, bits),
            codebook(5, false, bits),
        ] {
            for (t32, t64) in codebook.thresholds_f32().iter().zip(codebook.thresholds()) {
                let next_up = if *t32 >= 0.0 {
                    f32::from_bits(t32.to_bits() + 1)
                } else if t32.to_bits() == (-0.0f32).to_bits() {
                    f32::from_bits(1)
                } else {
                    f32::from_bits(t32.to_bits() - 1)
                };
                assert!(
                    f64::from(*t32) <= *t64 && f64::from(next_up) > *t64,
                    "{t32} vs {t64}"
                );
            }
            for (c32, c64) in codebook.centroids_f32().iter().zip(codebook.centroids()) {
                assert_eq!(*c32, *c64 as f32);
            }
        }
    }
}

#[test]
fn edge_values_have_documented_codes() {
    for bits in 1..=8 {
        let codebook = codebook(64, false, bits);
        let top = (codebook.levels() - 1) as u8;
        assert_eq!(codebook.quantize(f32::NAN), 0, "NaN maps to code 0");
        assert_eq!(codebook.quantize(f32::NEG_INFINITY), 0);
        assert_eq!(codebook.quantize(f32::INFINITY), top);
        assert_eq!(codebook.quantize(f32::MAX), top);
        assert_eq!(codebook.quantize(-f32::MAX), 0);
        let mut codes = [9u8; 3];
        codebook
            .quantize_slice(&[f32::NAN, f32::INFINITY, f32::NEG_INFINITY], &mut codes)
            .expect("same length");
        assert_eq!(codes, [0, top, 0]);
        // A value exactly on a threshold goes to the lower cell; the middle threshold is 0.
        assert_eq!(codebook.quantize(0.0), top / 2);
        assert_eq!(codebook.quantize(-0.0), top / 2);
        for (k, &t) in codebook.thresholds_f32().iter().enumerate() {
            assert_eq!(usize::from(codebook.quantize(t)), k, "on threshold {k}");
        }
        // Centroids encode to themselves and decode to their f32 copy.
        for (k, &c) in codebook.centroids_f32().iter().enumerate() {
            assert_eq!(usize::from(codebook.quantize(c)), k);
            assert_eq!(codebook.dequantize(k as u8), c);
        }
        // Out-of-range codes clamp to the top centroid.
        assert_eq!(
            codebook.dequantize(255),
            codebook.centroids_f32()[usize::from(top)]
        );
    }
}

#[test]
fn quantize_slice_rejects_a_length_mismatch() {
    let codebook = codebook(64, false, 3);
    let mut codes = [0u8; 4];
    assert_eq!(
        codebook.quantize_slice(&[0.0; 5], &mut codes),
        Err(LloydMaxError::LengthMismatch {
            expected: 5,
            actual: 4
        })
    );
}
