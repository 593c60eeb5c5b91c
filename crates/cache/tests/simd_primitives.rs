//! Every vector primitive of `attention::simd` against the scalar reference, on every
//! instruction set this CPU runs (the scalar path itself is the reference).
//!
//! Lookups, conversions and sign updates must match bit for bit. Sums may differ in the last
//! bits because the vector paths add in another order and fuse multiply-adds: for a sum of `n`
//! products both results lie within `γ_n·Σ|a_i·b_i|` of the exact value (`γ_n = n·u/(1 − n·u)`,
//! `u = 2⁻²⁴`), so they differ by at most `2·γ_n·Σ|a_i·b_i|` (we allow `n + 8` terms for the
//! lane reduction). A wrong lane, a lost tail element or a wrong sign moves a result by a whole
//! term, orders of magnitude above that bound with these random inputs.

use half::f16;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};
use tq_cache::attention::primitives;
use tq_cache::attention::simd::{self, Isa};

const U: f64 = 1.0 / (1u64 << 24) as f64;

fn config(cases: u32) -> Config {
    Config {
        cases,
        rng_seed: RngSeed::Fixed(0x51AD_0001),
        failure_persistence: None,
        ..Config::default()
    }
}

/// The vector instruction sets this CPU runs (empty on a CPU with none).
fn vector_isas() -> Vec<Isa> {
    Isa::available()
        .into_iter()
        .filter(|&isa| isa != Isa::Scalar)
        .collect()
}

/// `2·γ_n·Σ|terms|` with `n = len + 8`.
fn sum_bound(len: usize, abs_sum: f64) -> f64 {
    let n = (len + 8) as f64;
    2.0 * n * U / (1.0 - n * U) * abs_sum
}

fn floats(len: usize, seed: u64) -> Vec<f32> {
    // A small LCG is enough for test data; values in [-4, 4) with varied magnitudes.
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            s = s
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let unit = (s >> 40) as f32 / (1u64 << 24) as f32;
            let scale = [0.01f32, 1.0, 4.0][(s >> 20) as usize % 3];
            (unit * 2.0 - 1.0) * scale
        })
        .collect()
}

fn words(len: usize, seed: u64) -> Vec<u32> {
    let mut s = seed.wrapping_mul(0xD1B5_4A32_D192_ED03) | 1;
    (0..len)
        .map(|_| {
            s = s
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (s >> 32) as u32
        })
        .collect()
}

#[test]
fn the_scalar_isa_is_always_available_and_detection_is_stable() {
    assert!(Isa::Scalar.is_available());
    assert_eq!(Isa::available()[0], Isa::Scalar);
    assert!(Isa::best().is_available());
    assert_eq!(Isa::detect(), Isa::detect());
    #[cfg(target_arch = "aarch64")]
    assert!(Isa::Neon.is_available());
}

proptest! {
    #![proptest_config(config(64))]

    /// Dot products: every length 0..300 class (multiples of 8 and not), random magnitudes.
    #[test]
    fn dot_matches_scalar(len in 0usize..300, seed in any::<u64>()) {
        let a = floats(len, seed);
        let b = floats(len, seed ^ 7);
        let reference = primitives::dot(&a, &b);
        let abs: f64 = a.iter().zip(&b).map(|(x, y)| f64::from(x * y).abs()).sum();
        for isa in vector_isas() {
            let got = simd::dot(isa, &a, &b);
            prop_assert!(
                (f64::from(got) - f64::from(reference)).abs() <= sum_bound(len, abs),
                "{isa:?} len {len}: {got} vs {reference}"
            );
        }
    }

    /// `y += αx`: one FMA rounding against a multiply and an add, so within `2u(|y| + 2|αx|)`.
    #[test]
    fn axpy_matches_scalar(len in 0usize..300, alpha in -3.0f32..3.0, seed in any::<u64>()) {
        let x = floats(len, seed);
        let y0 = floats(len, seed ^ 3);
        let mut reference = y0.clone();
        primitives::axpy(alpha, &x, &mut reference);
        for isa in vector_isas() {
            let mut got = y0.clone();
            simd::axpy(isa, alpha, &x, &mut got);
            for i in 0..len {
                let bound = 2.0 * U * (f64::from(y0[i]).abs() + 2.0 * f64::from(alpha * x[i]).abs());
                prop_assert!(
                    (f64::from(got[i]) - f64::from(reference[i])).abs() <= bound,
                    "{isa:?} element {i}: {} vs {}", got[i], reference[i]
                );
            }
        }
    }

    /// Unpacking b-bit codes (b = 1..8, codes straddling words, random padding bits) is a pure
    /// lookup: bit-identical.
    #[test]
    fn dequantize_matches_scalar(len in 1usize..300, bits in 1u8..=8, seed in any::<u64>()) {
        let centroids = floats(1 << bits, seed);
        let packed = words((len * bits as usize).div_ceil(32) + (seed % 3) as usize, seed ^ 5);
        let mut reference = vec![0.0f32; len];
        primitives::dequantize_codes(&packed, bits, &centroids, &mut reference);
        for isa in vector_isas() {
            let mut got = vec![f32::NAN; len];
            simd::dequantize(isa, &packed, bits, &centroids, &mut got);
            let same = got.iter().zip(&reference).all(|(a, b)| a.to_bits() == b.to_bits());
            prop_assert!(same, "{isa:?} bits {bits} len {len}");
        }
    }

    /// Sign sums: `Σ ±w_i` over any length, within the summation bound.
    #[test]
    fn signed_dot_matches_scalar(len in 0usize..300, seed in any::<u64>()) {
        let w = floats(len, seed);
        let signs = words(len.div_ceil(32) + 1, seed ^ 9);
        let reference = primitives::signed_dot(&w, &signs);
        let abs: f64 = w.iter().map(|x| f64::from(*x).abs()).sum();
        for isa in vector_isas() {
            let got = simd::signed_dot(isa, &w, &signs);
            prop_assert!(
                (f64::from(got) - f64::from(reference)).abs() <= sum_bound(len, abs),
                "{isa:?} len {len}: {got} vs {reference}"
            );
        }
    }

    /// `acc += α·z` rounds once either way: bit-identical.
    #[test]
    fn accumulate_signs_matches_scalar(len in 0usize..300, alpha in -3.0f32..3.0, seed in any::<u64>()) {
        let signs = words(len.div_ceil(32) + 1, seed);
        let acc0 = floats(len, seed ^ 11);
        let mut reference = acc0.clone();
        primitives::accumulate_signs(alpha, &signs, &mut reference);
        for isa in vector_isas() {
            let mut got = acc0.clone();
            simd::accumulate_signs(isa, alpha, &signs, &mut got);
            let same = got.iter().zip(&reference).all(|(a, b)| a.to_bits() == b.to_bits());
            prop_assert!(same, "{isa:?} len {len}");
        }
    }

    /// The RoPE center's block corrections: every path gives `score_bias`'s bits, for head
    /// dimensions that are multiples of 8 (the vector path) and not (the scalar one), any
    /// number of blocks (the vector path takes four at a time), and coefficients whose chunks
    /// are zero in every head (skipped by the vector path) or in some heads only (kept).
    #[test]
    fn center_biases_match_score_bias(
        half in 1usize..80,
        group in 1usize..5,
        first in 0usize..40,
        n in 0usize..13,
        zero_mask in any::<u32>(),
        seed in any::<u64>(),
    ) {
        let d = 2 * half;
        let angles = tq_cache::rope_center::center_angles(10_000.0, d, (first + n) * 16);
        let mut coefficients = floats(group * d, seed);
        for (h, row) in coefficients.chunks_exact_mut(d).enumerate() {
            for (j, chunk) in row.chunks_mut(8).enumerate() {
                // Bit j: the chunk is zero in every head; bit j + 16: in head 0 only.
                if zero_mask >> (j % 16) & 1 == 1 || (h == 0 && zero_mask >> (16 + j % 16) & 1 == 1) {
                    chunk.fill(0.0);
                }
            }
        }
        let mut live = Vec::new();
        simd::live_center_chunks(&coefficients, d, &mut live);
        let blocks = first..first + n;
        let mut reference = Vec::new();
        for row in coefficients.chunks_exact(d) {
            for b in blocks.clone() {
                reference.push(tq_cache::rope_center::score_bias(row, &angles, b).to_bits());
            }
        }
        for isa in Isa::available() {
            let mut out = vec![f32::NAN; group * n];
            simd::center_biases(isa, &coefficients, d, &live, &angles, blocks.clone(), &mut out);
            let got: Vec<u32> = out.iter().map(|v| v.to_bits()).collect();
            prop_assert_eq!(&got, &reference, "{:?} d {} group {} blocks {:?}", isa, d, group, blocks);
        }
    }

    /// Maxima are exact.
    #[test]
    fn max_matches_scalar(len in 0usize..300, seed in any::<u64>()) {
        let v = floats(len, seed);
        let reference = primitives::max(&v);
        for isa in vector_isas() {
            prop_assert_eq!(simd::max(isa, &v).to_bits(), reference.to_bits());
        }
    }

    /// f16 pairs (odd lengths leave a half word): bit-identical to the scalar conversion.
    #[test]
    fn decode_f16_pairs_matches_scalar(len in 0usize..300, seed in any::<u64>()) {
        let halves: Vec<f16> = floats(len + 1, seed).iter().map(|v| f16::from_f32(v * 100.0)).collect();
        let packed: Vec<u32> = halves
            .chunks(2)
            .map(|p| u32::from(p[0].to_bits()) | (u32::from(p.get(1).map_or(0, |h| h.to_bits())) << 16))
            .collect();
        let mut reference = vec![0.0f32; len];
        primitives::decode_f16_pairs(&packed, &mut reference);
        for isa in vector_isas() {
            let mut got = vec![f32::NAN; len];
            simd::decode_f16_pairs(isa, &packed, &mut got);
            let same = got.iter().zip(&reference).all(|(a, b)| a.to_bits() == b.to_bits());
            prop_assert!(same, "{isa:?} len {len}");
        }
    }

    /// `exp(x − shift)` and the sum: every path evaluates `exp_poly` lane by lane and adds
    /// value `i` to lane `i mod 8` in order, so each element and the sum are the scalar
    /// reference's bits (and each element within 2 ulp of `f32::exp`,
    /// `exp_poly_is_within_two_ulp`).
    #[test]
    fn exp_shifted_sum_matches_scalar(len in 0usize..300, seed in any::<u64>()) {
        let v: Vec<f32> = floats(len, seed).iter().map(|x| x * 30.0).collect();
        let shift = primitives::max(&v).max(0.0);
        let mut reference = v.clone();
        let reference_sum = primitives::exp_shifted_sum(&mut reference, shift);
        for (r, x) in reference.iter().zip(&v) {
            prop_assert_eq!(r.to_bits(), simd::exp_poly(x - shift).to_bits());
        }
        for isa in vector_isas() {
            let mut got = v.clone();
            let sum = simd::exp_shifted_sum(isa, &mut got, shift);
            for (g, r) in got.iter().zip(&reference) {
                prop_assert_eq!(g.to_bits(), r.to_bits(), "{:?}: {} vs {}", isa, g, r);
            }
            prop_assert_eq!(sum.to_bits(), reference_sum.to_bits(), "{:?}: sum {} vs {}", isa, sum, reference_sum);
        }
    }
}

/// Every f16 bit pattern converts to the same f32 as the `half` crate (NaN stays NaN).
#[test]
fn f16_conversion_is_exact_for_every_half() {
    let halves: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
    let mut reference = vec![0.0f32; halves.len()];
    primitives::f16_to_f32(&halves, &mut reference);
    for isa in Isa::available() {
        let mut got = vec![0.0f32; halves.len()];
        simd::f16_to_f32(isa, &halves, &mut got);
        for (i, (g, r)) in got.iter().zip(&reference).enumerate() {
            if r.is_nan() {
                assert!(g.is_nan(), "{isa:?}: half {i:#06x} should be NaN, got {g}");
            } else {
                assert_eq!(g.to_bits(), r.to_bits(), "{isa:?}: half {i:#06x}");
            }
        }
    }
}

/// The integer-only f16 conversion of the NEON path, checked exhaustively on any machine.
#[test]
fn integer_f16_conversion_is_exact_for_every_half() {
    for bits in 0..=u16::MAX {
        let expected = f16::from_bits(bits).to_f32();
        let got = simd::f16_bits_to_f32(bits);
        if expected.is_nan() {
            assert!(got.is_nan(), "half {bits:#06x}");
        } else {
            assert_eq!(got.to_bits(), expected.to_bits(), "half {bits:#06x}");
        }
    }
}

/// The polynomial `exp` of the vector paths: within 2 ulp of `f32::exp` on a dense grid of
/// `[EXP_LOW, 0]` (the softmax range) and up to 88, 0 below `EXP_LOW`. Each vector path
/// evaluates exactly these operations, so `exp_shifted_sum` above checks them lane by lane.
#[test]
fn exp_poly_is_within_two_ulp() {
    let mut worst = 0.0f64;
    let steps = 2_000_000;
    for k in 0..=steps {
        let x = primitives::EXP_LOW + (88.0 - primitives::EXP_LOW) * k as f32 / steps as f32;
        let exact = (f64::from(x)).exp();
        let nearest = exact as f32;
        let ulp = f64::from(f32::from_bits(nearest.to_bits() + 1) - nearest);
        let got = f64::from(simd::exp_poly(x));
        worst = worst.max((got - exact).abs() / ulp);
    }
    eprintln!("exp_poly: worst error {worst:.3} ulp over [EXP_LOW, 88]");
    assert!(worst <= 2.0, "worst error {worst} ulp");
    for x in [-87.34f32, -90.0, -1e4, f32::NEG_INFINITY] {
        assert_eq!(simd::exp_poly(x), 0.0, "exp_poly({x})");
    }
    assert_eq!(simd::exp_poly(0.0), 1.0);
}

/// On x86-64 the vector `exp` is `exp_poly` lane by lane, bit for bit.
#[test]
fn vector_exp_is_exp_poly_bit_for_bit() {
    let xs: Vec<f32> = (0..4099).map(|k| -100.0 + 0.0251 * k as f32).collect();
    for isa in vector_isas() {
        let mut got = xs.clone();
        simd::exp_shifted_sum(isa, &mut got, 0.0);
        for (x, g) in xs.iter().zip(&got) {
            assert_eq!(
                g.to_bits(),
                simd::exp_poly(*x).to_bits(),
                "{isa:?}: exp({x})"
            );
        }
    }
}
