//! Over seeds, the rotated coordinates of a fixed unit vector have mean 0 and the documented
//! variance: `1/d` for Haar (any `x`) and power-of-two Hadamard (any `x`), and `(P·x²)_j` for
//! overlapping-block Hadamard, with `P = E[Π∘Π]` built from the documented passes.
//!
//! Every check compares a sample mean over `N` seeds with its exact expectation, within
//! `Z = 5.5` standard errors (two-sided normal tail 3.8e-8; the sample means are of `N ≥ 4000`
//! bounded i.i.d. terms, where the CLT tail is accurate). Each test states its checks and its
//! false-failure bound (checks × 3.8e-8 < 1e-6), the variance behind its `N`, and the wrong
//! answer it still detects. f32 rounding moves each sample by < 1e-6 relative, under 1% of
//! every standard error used.

mod common;

use common::{
    Z, basis_vector, dense_unit_vector, flat_unit_vector, hadamard_passes, mean, per_seed,
};
use tq_rotation::RotationKind;

/// `|mean(samples) − expected| ≤ Z·√(variance/N)`.
fn assert_mean(samples: &[f64], expected: f64, variance: f64, what: &str) {
    let (got, bound) = (mean(samples), Z * (variance / samples.len() as f64).sqrt());
    assert!(
        (got - expected).abs() <= bound,
        "{what}: mean {got:e}, expected {expected:e} ± {bound:e}"
    );
}

/// Samples `(Πx)_j` over seeds `0..n` for every `x` in `inputs` and `j` in `coordinates`;
/// entry `[a][b]` holds the samples for `inputs[a]` and `coordinates[b]`, in seed order.
fn coordinate_samples(
    kind: RotationKind,
    dim: usize,
    n: u64,
    inputs: &[Vec<f64>],
    coordinates: &[usize],
) -> Vec<Vec<Vec<f64>>> {
    let rows = per_seed(kind, dim, 0..n, inputs, |_, outputs| {
        outputs
            .iter()
            .map(|y| coordinates.iter().map(|&j| y[j]).collect::<Vec<_>>())
            .collect::<Vec<_>>()
    });
    (0..inputs.len())
        .map(|a| {
            (0..coordinates.len())
                .map(|b| rows.iter().map(|row| row[a][b]).collect())
                .collect()
        })
        .collect()
}

fn squares(samples: &[f64]) -> Vec<f64> {
    samples.iter().map(|v| v * v).collect()
}

/// Haar: `Πx` is uniform on the unit sphere for every unit `x`, so `X = (Πx)_j` has mean 0,
/// `Var X = 1/d`, and `Var X² = E X⁴ − d⁻² = 3/(d(d+2)) − 1/d² = 2(d−1)/(d²(d+2))` (the
/// fourth moment of one coordinate, `(X+1)/2 ~ Beta((d−1)/2, (d−1)/2)`).
///
/// 8 checks (2 vectors × 2 coordinates × {mean, mean square}): false failure < 3.1e-7.
/// Detects: for `x = e₁`, the mean is `E Π_jj`-like, which a QR without the sign fix biases
/// by `−E|u₁|` (−0.20 at d = 16, −0.0997 at d = 64) against bounds of 0.0097 (N = 20 000)
/// and 0.011 (N = 4000); the mean square has relative tolerance
/// `Z·√(2(d−1)/(d+2))/√N` = 5.0% (d = 16) and 12% (d = 64), so a rotation that only mixes
/// half the coordinates (variance 2/d, +100%) fails, as does a normalization off by 5%
/// (d = 16; squares off by 10%).
fn haar_coordinates_have_variance_one_over_d(dim: usize, n: u64) {
    let d = dim as f64;
    let variance = 1.0 / d;
    let variance_of_square = 2.0 * (d - 1.0) / (d * d * (d + 2.0));
    let inputs = [basis_vector(dim), dense_unit_vector(dim)];
    let coordinates = [0, dim - 1];
    let samples = coordinate_samples(RotationKind::Haar, dim, n, &inputs, &coordinates);
    for (a, name) in ["e1", "dense"].iter().enumerate() {
        for (b, j) in coordinates.iter().enumerate() {
            let what = format!("Haar d={dim} x={name} j={j}");
            assert_mean(&samples[a][b], 0.0, variance, &what);
            assert_mean(
                &squares(&samples[a][b]),
                variance,
                variance_of_square,
                &what,
            );
        }
    }
}

#[test]
fn haar_coordinates_have_variance_one_over_d_at_16() {
    haar_coordinates_have_variance_one_over_d(16, 20_000);
}

#[test]
fn haar_coordinates_have_variance_one_over_d_at_64() {
    haar_coordinates_have_variance_one_over_d(64, 4_000);
}

/// Power-of-two Hadamard: `X = (Πx)_j = D₂_j·Σ_i H_ji·D₁_i·x_i/√d` is a Rademacher sum with
/// weights of magnitude `|x_i|/√d`, so over seeds `E X = 0` and `Var X = ‖x‖²/d = 1/d` for
/// EVERY unit `x`, and `E X⁴ = (3(Σa²)² − 2Σa⁴)` gives `Var X² = (2 − 2Σ x_i⁴)/d²` exactly.
/// For `x = e₁` that is 0: every sample is exactly `±1/√d`.
///
/// 6 statistical checks (e₁: 2 means; dense: 2 × {mean, mean square}): false failure
/// < 2.3e-7. N = 100 000: the mean's bound is `Z/√(dN)` = 0.0022, so signs that are not
/// random (all-plus signs make `(Πe₁)_j ≡ 1/√d = 0.125`) fail; the mean square's relative
/// tolerance is `Z·√(2 − 2Σx⁴)/√N` = 2.4%, so a normalization off by 2.5% (squares off by
/// 5%) fails.
#[test]
fn power_of_two_hadamard_coordinates_have_variance_one_over_d_for_any_x() {
    let (dim, n) = (64usize, 100_000u64);
    let d = dim as f64;
    let inputs = [basis_vector(dim), dense_unit_vector(dim)];
    let coordinates = [0, dim - 1];
    let samples = coordinate_samples(RotationKind::Hadamard, dim, n, &inputs, &coordinates);
    for (b, j) in coordinates.iter().enumerate() {
        let e1 = &samples[0][b];
        assert_mean(e1, 0.0, 1.0 / d, &format!("Hadamard d={dim} x=e1 j={j}"));
        assert!(
            e1.iter().all(|&v| v.abs() == 1.0 / d.sqrt()),
            "e1 j={j}: not ±1/√d"
        );

        let dense = &samples[1][b];
        let fourth: f64 = inputs[1].iter().map(|v| v.powi(4)).sum();
        let what = format!("Hadamard d={dim} x=dense j={j}");
        assert_mean(dense, 0.0, 1.0 / d, &what);
        assert_mean(
            &squares(dense),
            1.0 / d,
            (2.0 - 2.0 * fourth) / (d * d),
            &what,
        );
    }
}

/// `P = E[Π∘Π]` of the documented Hadamard passes: each normalized B-point pass contributes
/// `1/B` between coordinates of its block and the identity outside it (cross terms vanish
/// because the ±1 diagonal between passes is independent), so `P` is the product of those
/// matrices, last pass on the left. Row-major.
fn expected_square_profile(dim: usize) -> Vec<f64> {
    let (passes, block) = hadamard_passes(dim);
    let whole = 0..dim;
    let blocks = if passes == 1 {
        vec![whole]
    } else {
        vec![0..block, dim - block..dim, 0..block]
    };
    let mut p: Vec<f64> = (0..dim * dim)
        .map(|k| if k / dim == k % dim { 1.0 } else { 0.0 })
        .collect();
    for range in blocks {
        let step = |r: usize, c: usize| {
            if range.contains(&r) && range.contains(&c) {
                1.0 / block as f64
            } else if r == c && !range.contains(&r) {
                1.0
            } else {
                0.0
            }
        };
        let mut next = vec![0.0; dim * dim];
        for r in 0..dim {
            for c in 0..dim {
                next[r * dim + c] = (0..dim).map(|k| step(r, k) * p[k * dim + c]).sum();
            }
        }
        p = next;
    }
    p
}

/// Overlapping-block Hadamard (d not a power of two): `Var (Πx)_j = Σ_i P_ji·x_i²`. `P` is
/// doubly stochastic, so this is exactly `1/d` for a flat `x` (all `|x_i| = 1/√d`) but not
/// for every `x`: for `e₁` at d = 96 it is 3/256 at j = 0 and 1/128 at j = 95.
///
/// `X` is a multilinear form in three independent ±1 vectors (D₁, D₂, D₃; D₄ only flips its
/// sign), so conditioning on one vector at a time and Khintchine's `E(Σεa)⁴ ≤ 3(Σa²)²` give
/// `E X⁴ ≤ 3³·(E X²)²`: `Var X² ≤ 26σ⁴`, used as the variance of each square.
///
/// Per dimension 12 checks (3 vectors × 2 coordinates × {mean, mean square}): false failure
/// < 4.6e-7. N = 100 000 makes the mean square's relative tolerance `Z·√26/√N` = 8.9%; the
/// two-pass scheme `D₃·Ĥ_tail·D₂·Ĥ_head·D₁` gives 1/64 instead of 3/256 for `e₁` at j = 0
/// (+33%) and a block-diagonal scheme 1/64 there and 0 at j = 95, so both fail.
fn overlapping_hadamard_coordinates_follow_the_profile(dim: usize) {
    let n = 100_000u64;
    let p = expected_square_profile(dim);
    let inputs = [
        basis_vector(dim),
        dense_unit_vector(dim),
        flat_unit_vector(dim),
    ];
    let coordinates = [0, dim - 1];
    let samples = coordinate_samples(RotationKind::Hadamard, dim, n, &inputs, &coordinates);
    for (a, name) in ["e1", "dense", "flat"].iter().enumerate() {
        for (b, &j) in coordinates.iter().enumerate() {
            let variance: f64 = (0..dim)
                .map(|i| p[j * dim + i] * inputs[a][i].powi(2))
                .sum();
            if *name == "flat" {
                assert!(
                    (variance * dim as f64 - 1.0).abs() < 1e-12,
                    "flat: {variance}"
                );
            }
            let what = format!("Hadamard d={dim} x={name} j={j}");
            assert_mean(&samples[a][b], 0.0, variance, &what);
            assert_mean(
                &squares(&samples[a][b]),
                variance,
                26.0 * variance * variance,
                &what,
            );
        }
    }
}

#[test]
fn overlapping_hadamard_coordinates_follow_the_profile_at_96() {
    let p = expected_square_profile(96);
    assert!((p[0] - 3.0 / 256.0).abs() < 1e-15 && (p[95 * 96] - 1.0 / 128.0).abs() < 1e-15);
    overlapping_hadamard_coordinates_follow_the_profile(96);
}

#[test]
fn overlapping_hadamard_coordinates_follow_the_profile_at_100() {
    overlapping_hadamard_coordinates_follow_the_profile(100);
}

/// The profile is doubly stochastic and strictly positive for every non-power-of-two d up
/// to 300: each input reaches each output, and flat vectors get variance exactly 1/d.
/// Deterministic. The two-pass scheme has zero entries (outputs before `d − B` never see
/// inputs from `B` on), so it would fail.
#[test]
fn square_profile_is_doubly_stochastic_and_positive() {
    for dim in (3..=300)
        .filter(|d: &usize| !d.is_power_of_two())
        .step_by(7)
    {
        let p = expected_square_profile(dim);
        for k in 0..dim {
            let row: f64 = (0..dim).map(|i| p[k * dim + i]).sum();
            let column: f64 = (0..dim).map(|j| p[j * dim + k]).sum();
            assert!(
                (row - 1.0).abs() < 1e-12 && (column - 1.0).abs() < 1e-12,
                "d={dim} k={k}"
            );
        }
        assert!(
            p.iter().all(|&v| v > 0.0),
            "d={dim}: some input never reaches some output"
        );
    }
}
