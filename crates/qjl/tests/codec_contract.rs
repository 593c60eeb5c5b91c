//! The codec-facing contract: fast estimate = reconstruction dot product, the packed layout,
//! zero vectors, typed errors, determinism and serialization.

mod common;

use common::{UNIT_ROUNDOFF, apply_steps, proptest_config, rounding_gamma};
use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use std::f64::consts::{FRAC_2_PI, FRAC_PI_2, PI};
use tq_qjl::{
    QjlError, QjlSketch, QjlSpec, SketchKind, SketchScale, asymptotic_bias_factor,
    expected_abs_coordinate,
};

const KINDS: [SketchKind; 3] = [SketchKind::Gaussian, SketchKind::Haar, SketchKind::Hadamard];
const SCALES: [SketchScale; 3] = [
    SketchScale::Paper,
    SketchScale::Asymptotic,
    SketchScale::Exact,
];

fn buffers(sketch: &QjlSketch) -> (Vec<f32>, Vec<u32>) {
    (vec![0.0; sketch.rows()], vec![0; sketch.words()])
}

fn seeded_vector(dim: usize, seed: u64) -> Vec<f32> {
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    (0..dim).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

proptest! {
    #![proptest_config(proptest_config(128, 0x5EED_0003))]

    /// `estimate_inner_product` (sign-flip sum over the packed bits) equals `⟨y, r̂⟩` from
    /// `reconstruct`, for every kind, scale, shrinkage and dimension, up to f32 rounding.
    ///
    /// Both compute `c·Σ_i z_i·(S·y)_i` with `c = α·γ·s`. With `F = ‖S‖_F`, `K = apply_steps(d)`:
    /// the projection is off by `‖p̂ − p‖ ≤ (γ_K + u)·F·‖y‖` (dense rows: `γ_d·‖S_i‖·‖y‖`; a
    /// stored Haar matrix adds `u`; each Hadamard pass loses `(log₂B + 2)·u` of `‖x‖`), so
    /// `Σ z_i p̂_i` moves by `√m` times that, and the fast sum adds `γ_m·√m·‖p̂‖`. The
    /// reconstruction `fl(Sᵀz)` is off by `(γ_K + u)·F·√m`, then two roundings of `c` and the
    /// product. Total: `c·√m·F·‖y‖·(3γ_K + 5u)(1 + γ_K + u) + u·|estimate|`. A single wrong bit
    /// moves the estimate by `2c·|p_i|`, ~30× this bound for a typical coordinate at d = 128.
    #[test]
    fn fast_estimate_matches_reconstruction_dot_product(
        seed in any::<u64>(),
        kind_index in 0usize..3,
        scale_index in 0usize..3,
        dim in 1usize..=130,
        alpha in 0.1f32..2.0,
        raw in proptest::collection::vec(-10.0f32..10.0, 130),
        query in proptest::collection::vec(-10.0f32..10.0, 130),
        exponent in -10i32..10,
    ) {
        let spec = QjlSpec::new(KINDS[kind_index], dim, seed)
            .with_scale(SCALES[scale_index])
            .with_shrinkage(alpha);
        let sketch = spec.build().unwrap();
        let r: Vec<f32> = raw[..dim].iter().map(|v| v * 2f32.powi(exponent)).collect();
        let y = &query[..dim];
        let (mut scratch, mut bits) = buffers(&sketch);
        let gamma = sketch.encode(&r, &mut scratch, &mut bits).unwrap();
        let mut projected = vec![0.0; sketch.rows()];
        sketch.project(y, &mut projected).unwrap();
        let fast = f64::from(sketch.estimate_inner_product(&projected, &bits, gamma));
        let mut r_hat = vec![0.0; dim];
        sketch.reconstruct(&bits, gamma, &mut scratch, &mut r_hat).unwrap();
        let naive = common::dot(y, &r_hat);

        let frobenius = sketch.to_dense_f64().iter().map(|v| v * v).sum::<f64>().sqrt();
        let c = f64::from(alpha) * sketch.scale_factor() * f64::from(gamma);
        let g = rounding_gamma(apply_steps(dim));
        let u = UNIT_ROUNDOFF;
        let tolerance = c * (sketch.rows() as f64).sqrt() * frobenius * common::norm_sq(y).sqrt()
            * (3.0 * g + 5.0 * u) * (1.0 + g + u)
            + u * fast.abs();
        prop_assert!((fast - naive).abs() <= tolerance, "fast {fast} naive {naive} tol {tolerance}");
    }
}

/// Bit `i` is bit `i % 32` of word `i / 32`, 1 for `(S·r)_i ≥ 0`, with zero padding, for sizes
/// around and between word boundaries. Checked against `sign(S·r)` in f64, skipping rows
/// within the f32 rounding bound `2(γ_K + u)·Σ_j|S_ij·r_j|` of zero (none occur for these
/// fixed seeds; the count is asserted so the check cannot silently become empty).
#[test]
fn packed_layout_matches_signs_of_the_projection() {
    for kind in KINDS {
        for dim in [1usize, 31, 32, 33, 100, 130] {
            let sketch = QjlSpec::new(kind, dim, 17).build().unwrap();
            assert_eq!(sketch.words(), dim.div_ceil(32));
            let r = seeded_vector(dim, 99);
            let (mut scratch, mut bits) = buffers(&sketch);
            sketch.encode(&r, &mut scratch, &mut bits).unwrap();
            let dense = sketch.to_dense_f64();
            let margin_factor = 2.0 * (rounding_gamma(apply_steps(dim)) + UNIT_ROUNDOFF);
            let mut checked = 0;
            for (i, row) in dense.chunks_exact(dim).enumerate() {
                let exact: f64 = row.iter().zip(&r).map(|(s, &x)| s * f64::from(x)).sum();
                let spread: f64 = row
                    .iter()
                    .zip(&r)
                    .map(|(s, &x)| (s * f64::from(x)).abs())
                    .sum();
                if exact.abs() > margin_factor * spread {
                    assert_eq!(
                        (bits[i / 32] >> (i % 32)) & 1 == 1,
                        exact >= 0.0,
                        "{kind:?} d={dim} row {i}"
                    );
                    checked += 1;
                }
            }
            assert_eq!(checked, dim, "{kind:?} d={dim}: rows too close to zero");
            if dim % 32 != 0 {
                assert_eq!(bits[dim / 32] >> (dim % 32), 0, "{kind:?} d={dim}: padding");
            }
        }
    }
}

/// For an orthogonal `S`, `r = Sᵀt` gives `S·r = t` (up to ~1e-6), so the bits must spell the
/// signs of a chosen `t` exactly (|t_i| ≥ 1 leaves no rounding ambiguity).
#[test]
fn orthogonal_sketch_encodes_a_designed_sign_pattern() {
    for kind in [SketchKind::Haar, SketchKind::Hadamard] {
        for dim in [33usize, 100] {
            let sketch = QjlSpec::new(kind, dim, 5).build().unwrap();
            let positive = |i: usize| (i * 7 + i / 3) % 5 < 2;
            let t: Vec<f64> = (0..dim)
                .map(|i| (1.0 + (i % 3) as f64) * if positive(i) { 1.0 } else { -1.0 })
                .collect();
            let dense = sketch.to_dense_f64();
            let r: Vec<f32> = (0..dim)
                .map(|j| (0..dim).map(|i| dense[i * dim + j] * t[i]).sum::<f64>() as f32)
                .collect();
            let (mut scratch, mut bits) = buffers(&sketch);
            sketch.encode(&r, &mut scratch, &mut bits).unwrap();
            let mut expected = vec![0u32; dim.div_ceil(32)];
            for i in (0..dim).filter(|&i| positive(i)) {
                expected[i / 32] |= 1 << (i % 32);
            }
            assert_eq!(bits, expected, "{kind:?} d={dim}");
        }
    }
}

#[test]
fn zero_residual_gives_zero_norm_and_zero_estimate() {
    for kind in KINDS {
        let sketch = QjlSpec::new(kind, 33, 3).build().unwrap();
        let (mut scratch, mut bits) = buffers(&sketch);
        let gamma = sketch.encode(&[0.0; 33], &mut scratch, &mut bits).unwrap();
        assert_eq!(gamma, 0.0);
        assert_eq!(bits, vec![u32::MAX, 1], "S·0 = 0 counts as non-negative");
        let mut projected = vec![0.0; 33];
        sketch
            .project(&seeded_vector(33, 1), &mut projected)
            .unwrap();
        assert_eq!(sketch.estimate_inner_product(&projected, &bits, gamma), 0.0);
        let mut r_hat = vec![1.0; 33];
        sketch
            .reconstruct(&bits, gamma, &mut scratch, &mut r_hat)
            .unwrap();
        assert!(r_hat.iter().all(|&v| v == 0.0), "{kind:?}");
    }
}

#[test]
fn bad_input_is_a_typed_error() {
    let sketch = QjlSpec::new(SketchKind::Haar, 40, 1).build().unwrap();
    let (mut scratch, mut bits) = buffers(&sketch);
    let good = seeded_vector(40, 2);
    let mismatch = |e: Result<_, QjlError>, name: &str, expected, actual| match e {
        Err(QjlError::LengthMismatch {
            buffer,
            expected: e,
            actual: a,
        }) => {
            assert_eq!((buffer, e, a), (name, expected, actual));
        }
        other => panic!("expected a length error for {name}, got {other:?}"),
    };
    mismatch(
        sketch
            .encode(&good[..39], &mut scratch, &mut bits)
            .map(|_| ()),
        "residual",
        40,
        39,
    );
    mismatch(
        sketch
            .encode(&good, &mut scratch[..39], &mut bits)
            .map(|_| ()),
        "scratch",
        40,
        39,
    );
    mismatch(
        sketch.encode(&good, &mut scratch, &mut [0; 1]).map(|_| ()),
        "bits",
        2,
        1,
    );
    mismatch(
        sketch.project(&good, &mut [0.0; 41]),
        "projected query",
        40,
        41,
    );
    mismatch(sketch.project(&good[..1], &mut [0.0; 40]), "query", 40, 1);
    let mut out = vec![0.0; 40];
    mismatch(
        sketch.reconstruct(&bits[..1], 1.0, &mut scratch, &mut out),
        "bits",
        2,
        1,
    );
    mismatch(
        sketch.reconstruct(&bits, 1.0, &mut scratch, &mut out[..3]),
        "output",
        40,
        3,
    );

    for (index, bad) in [
        (0usize, f32::NAN),
        (7, f32::INFINITY),
        (39, f32::NEG_INFINITY),
    ] {
        let mut r = good.clone();
        r[index] = bad;
        match sketch.encode(&r, &mut scratch, &mut bits) {
            Err(QjlError::NonFinite {
                buffer: "residual",
                index: i,
            }) => assert_eq!(i, index),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            sketch.project(&r, &mut out),
            Err(QjlError::NonFinite { buffer: "query", index: i }) if i == index
        ));
    }
    let mut huge = vec![0.0f32; 40];
    huge[..2].copy_from_slice(&[3e38, 3e38]);
    assert!(matches!(
        sketch.encode(&huge, &mut scratch, &mut bits),
        Err(QjlError::NormOverflow)
    ));
    for gamma in [-1.0, f32::NAN, f32::INFINITY] {
        assert!(matches!(
            sketch.reconstruct(&bits, gamma, &mut scratch, &mut out),
            Err(QjlError::InvalidGamma { .. })
        ));
    }
    // The hot path has no Result: wrong lengths give NaN, never a panic or a wrong score.
    assert!(
        sketch
            .estimate_inner_product(&out[..39], &bits, 1.0)
            .is_nan()
    );
    assert!(
        sketch
            .estimate_inner_product(&out, &bits[..1], 1.0)
            .is_nan()
    );

    assert!(matches!(
        QjlSpec::new(SketchKind::Gaussian, 0, 1).build(),
        Err(QjlError::ZeroDimension)
    ));
    for alpha in [0.0, -1.0, f32::NAN, f32::INFINITY] {
        let spec = QjlSpec::new(SketchKind::Gaussian, 4, 1).with_shrinkage(alpha);
        assert!(matches!(
            spec.build(),
            Err(QjlError::InvalidShrinkage { .. })
        ));
        assert!(matches!(
            sketch.clone().with_shrinkage(alpha),
            Err(QjlError::InvalidShrinkage { .. })
        ));
    }
    assert!(matches!(
        QjlSpec::new(SketchKind::Haar, 8193, 1).build(),
        Err(QjlError::Rotation(_))
    ));
    assert!(matches!(
        QjlSpec::new(SketchKind::Gaussian, usize::MAX / 2, 1).build(),
        Err(QjlError::SketchTooLarge { .. })
    ));
}

/// Entries of ±0.35·f32::MAX have a finite norm (0.99·f32::MAX at d = 8) but the Hadamard
/// butterflies overflow to ±inf and then to inf − inf = NaN when the input's signs cancel
/// `D₁`'s: one of the 256 sign patterns does. That pattern must be an error, never bits.
#[test]
fn projection_overflow_to_nan_is_an_error() {
    let sketch = QjlSpec::new(SketchKind::Hadamard, 8, 4).build().unwrap();
    let (mut scratch, mut bits) = buffers(&sketch);
    let mut overflowed = 0;
    for pattern in 0u32..256 {
        let r: Vec<f32> = (0..8)
            .map(|j| {
                if (pattern >> j) & 1 == 1 {
                    0.35 * f32::MAX
                } else {
                    -0.35 * f32::MAX
                }
            })
            .collect();
        match sketch.encode(&r, &mut scratch, &mut bits) {
            Ok(gamma) => assert!(gamma.is_finite()),
            Err(QjlError::NonFinite {
                buffer: "projected residual",
                ..
            }) => overflowed += 1,
            Err(other) => panic!("{other}"),
        }
    }
    assert!(overflowed >= 1);
}

/// A sketch is a pure function of its spec: same matrix and bits on a rebuild and under any
/// rayon pool size; another seed gives another matrix.
#[test]
fn sketches_are_pure_functions_of_the_spec() {
    let run = |threads: usize, kind: SketchKind, seed: u64| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| {
            let sketch = QjlSpec::new(kind, 100, seed).build().unwrap();
            let (mut scratch, mut bits) = buffers(&sketch);
            let gamma = sketch
                .encode(&seeded_vector(100, 8), &mut scratch, &mut bits)
                .unwrap();
            (sketch.to_dense_f64(), bits, gamma)
        })
    };
    for kind in KINDS {
        let first = run(1, kind, 21);
        assert_eq!(first, run(3, kind, 21), "{kind:?}");
        assert_ne!(first.0, run(1, kind, 22).0, "{kind:?}");
    }
}

/// Pins the first draws so a change of generator, stream or sampling order is noticed: a saved
/// cache stores the spec, and must rebuild the very same matrix.
#[test]
fn gaussian_matrix_is_pinned() {
    let dense = QjlSpec::new(SketchKind::Gaussian, 2, 7)
        .build()
        .unwrap()
        .to_dense_f64();
    let pinned: Vec<u32> = dense.iter().map(|&v| (v as f32).to_bits()).collect();
    assert_eq!(pinned, PINNED_GAUSSIAN_D2_SEED7);
}

const PINNED_GAUSSIAN_D2_SEED7: [u32; 4] = [3211592686, 3208404515, 3189484025, 3197204094];

/// The sketch seed is domain-separated from the rotation crate's: a codec that seeds its
/// rotation Π and its sketch S with the same number still gets independent matrices.
#[test]
fn sketch_is_not_the_rotation_with_the_same_seed() {
    for (kind, rotation_kind) in [
        (SketchKind::Haar, tq_rotation::RotationKind::Haar),
        (SketchKind::Hadamard, tq_rotation::RotationKind::Hadamard),
    ] {
        let sketch = QjlSpec::new(kind, 16, 3).build().unwrap().to_dense_f64();
        let rotation = tq_rotation::Rotation::new(rotation_kind, 16, 3)
            .unwrap()
            .to_dense_f64();
        assert_ne!(sketch, rotation, "{kind:?}");
    }
    let gaussian = QjlSpec::new(SketchKind::Gaussian, 16, 3)
        .build()
        .unwrap()
        .to_dense_f64();
    let mut rng = ChaCha20Rng::seed_from_u64(3);
    let plain: Vec<f64> = (0..256)
        .map(|_| f64::from(rng.sample::<f64, _>(rand_distr::StandardNormal) as f32))
        .collect();
    assert_ne!(gaussian, plain);
}

#[test]
fn spec_serializes_in_lowercase_and_round_trips() {
    let spec = QjlSpec::new(SketchKind::Haar, 64, 7).with_shrinkage(0.5);
    let json = serde_json::to_string(&spec).unwrap();
    assert_eq!(
        json,
        r#"{"kind":"haar","dim":64,"seed":7,"scale":"exact","shrinkage":0.5}"#
    );
    assert_eq!(serde_json::from_str::<QjlSpec>(&json).unwrap(), spec);
    let defaulted: QjlSpec =
        serde_json::from_str(r#"{"kind":"gaussian","dim":8,"seed":1,"scale":"paper"}"#).unwrap();
    assert_eq!(defaulted, QjlSpec::new(SketchKind::Gaussian, 8, 1));
    assert_eq!(
        serde_json::to_string(&SketchScale::Asymptotic).unwrap(),
        r#""asymptotic""#
    );
    assert_eq!(
        serde_json::to_string(&SketchKind::Hadamard).unwrap(),
        r#""hadamard""#
    );
    assert!(serde_json::from_str::<SketchKind>(r#""Haar""#).is_err());
}

/// Scale values, mean gains and MMSE shrinkages against their closed forms.
#[test]
fn scales_gains_and_shrinkages_match_closed_forms() {
    let d = 64usize;
    let df = d as f64;
    let kappa = asymptotic_bias_factor(d);
    let build = |kind, scale| QjlSpec::new(kind, d, 1).with_scale(scale).build().unwrap();
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-12 * b.abs().max(1.0);

    let paper = build(SketchKind::Gaussian, SketchScale::Paper);
    assert!(close(paper.scale_factor(), FRAC_PI_2.sqrt() / df));
    assert!(close(paper.bias_factor().unwrap(), 1.0));
    assert!(close(
        paper.mmse_shrinkage().unwrap(),
        1.0 / (FRAC_PI_2 + (df - 1.0) / df)
    ));
    // The mismatched pair of the ablation: Gaussian S with the orthogonal scale is √d too large.
    assert!(close(
        build(SketchKind::Gaussian, SketchScale::Asymptotic)
            .bias_factor()
            .unwrap(),
        df.sqrt()
    ));

    let exact = build(SketchKind::Haar, SketchScale::Exact);
    assert!(close(
        exact.scale_factor(),
        1.0 / (df * expected_abs_coordinate(d))
    ));
    assert!(close(exact.bias_factor().unwrap(), 1.0));
    assert!(close(
        exact.mmse_shrinkage().unwrap(),
        2.0 * kappa * kappa / PI
    ));
    let asymptotic = build(SketchKind::Haar, SketchScale::Asymptotic);
    assert!(close(
        asymptotic.scale_factor(),
        FRAC_PI_2.sqrt() / df.sqrt()
    ));
    assert!(close(asymptotic.bias_factor().unwrap(), kappa));
    assert!(close(
        asymptotic.mmse_shrinkage().unwrap(),
        2.0 * kappa / PI
    ));
    let shrunk = asymptotic.with_shrinkage(0.5).unwrap();
    assert!(close(shrunk.bias_factor().unwrap(), 0.5 * kappa));
    assert!(
        close(shrunk.scale_factor(), FRAC_PI_2.sqrt() / df.sqrt()),
        "s excludes α"
    );

    let hadamard = build(SketchKind::Hadamard, SketchScale::Exact);
    assert!(hadamard.bias_factor().is_none() && hadamard.mmse_shrinkage().is_none());
    assert_eq!(
        QjlSpec::new(SketchKind::Gaussian, 8, 0).scale,
        SketchScale::Paper
    );
    assert_eq!(
        QjlSpec::new(SketchKind::Hadamard, 8, 0).scale,
        SketchScale::Exact
    );
    assert!(close(FRAC_2_PI, 2.0 / PI));
}
