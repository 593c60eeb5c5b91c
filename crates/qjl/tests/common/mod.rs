//! Statistics shared by the Monte-Carlo tests: the z level, sample sizes, ordered parallel maps.
//!
//! Every test binary compiles this module and uses a different part of it.
#![allow(dead_code)]

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use rand_distr::StandardNormal;
use rayon::prelude::*;

/// Acceptance bound and power quantile, in standard errors. `P(|Z| > 5) = 5.7e-7` is the
/// false-failure probability of a two-sided check of a true mean; `P(Z > 5) = 2.9e-7` is the
/// probability of missing a shift of `2·Z` standard errors. A test that makes one acceptance
/// check and one detection check therefore fails falsely with probability < 8.6e-7 < 1e-6
/// (math.md's 4.89 gives 1.008e-6 two-sided, just above the target, hence 5).
pub const Z: f64 = 5.0;

/// Smallest `N` for which a mean with per-sample variance `variance` detects a shift of
/// `shift` with the bounds above: `shift ≥ 2·Z·√(variance/N)`, i.e. `N ≥ (2Z)²·variance/shift²`.
pub fn samples_to_detect(variance: f64, shift: f64) -> usize {
    ((2.0 * Z).powi(2) * variance / (shift * shift)).ceil() as usize
}

/// `f(0), …, f(n−1)` computed on rayon's pool and returned in index order, so any sum taken
/// over the result afterwards is independent of the thread count.
pub fn ordered_samples<T: Send, F: Fn(u64) -> T + Sync + Send>(n: usize, f: F) -> Vec<T> {
    (0..n as u64).into_par_iter().map(f).collect()
}

/// Sequential mean, in index order.
pub fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len() as f64
}

/// Unbiased sample variance, sequential.
pub fn sample_variance(values: &[f64]) -> f64 {
    let m = mean(values);
    values.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / (values.len() as f64 - 1.0)
}

/// A fixed unit vector: a normalized Gaussian draw from `seed`. Its direction is irrelevant
/// for Gaussian and Haar sketches (their laws are rotation invariant), so one vector suffices.
pub fn unit_vector(dim: usize, seed: u64) -> Vec<f64> {
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    let v: Vec<f64> = (0..dim).map(|_| rng.sample(StandardNormal)).collect();
    let norm = v.iter().map(|x| x * x).sum::<f64>().sqrt();
    v.into_iter().map(|x| x / norm).collect()
}

/// Converts to f32 (the sketch's input type).
pub fn to_f32(v: &[f64]) -> Vec<f32> {
    v.iter().map(|&x| x as f32).collect()
}

/// `Σ a_i·b_i` in f64.
pub fn dot(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| f64::from(x) * f64::from(y))
        .sum()
}

/// `Σ a_i²` in f64.
pub fn norm_sq(a: &[f32]) -> f64 {
    dot(a, a)
}

/// Exact `Var(s·‖u‖₁)` for `u` uniform on `S^{d−1}` and the exact scale `s = 1/(d·E|u₁|)`:
/// the per-sample relative variance of a Haar sketch's `⟨r, r̂⟩/γ²`.
///
/// `E‖u‖₁² = d·E[u₁²] + d(d−1)·E|u₁u₂| = 1 + 2(d−1)/π`, because `u = g/‖g‖` with `‖g‖`
/// independent of `u`, so `E|u₁u₂| = E|g₁g₂|/E‖g‖² = (2/π)/d`. The mean is 1 by the choice of
/// `s`, so the variance is `s²·(1 + 2(d−1)/π) − 1` (≈ (π/2 − 3/2)/d, e.g. 5.50e-4 at d = 128).
pub fn haar_relative_variance(dim: usize) -> f64 {
    let d = dim as f64;
    let s = 1.0 / (d * tq_qjl::expected_abs_coordinate(dim));
    s * s * (1.0 + 2.0 * (d - 1.0) / std::f64::consts::PI) - 1.0
}

#[test]
fn z_levels_are_what_the_comments_say() {
    let two_sided = statrs::function::erf::erfc(Z / std::f64::consts::SQRT_2);
    assert!(two_sided < 5.8e-7 && two_sided / 2.0 < 2.9e-7);
    assert!(two_sided + two_sided / 2.0 < 1e-6);
}

/// Unit roundoff of f32, `2^−24`.
pub const UNIT_ROUNDOFF: f64 = f32::EPSILON as f64 / 2.0;

/// Higham's `γ_n = n·u/(1 − n·u)`: the relative error bound of an `n`-step f32 computation.
pub fn rounding_gamma(n: usize) -> f64 {
    let nu = n as f64 * UNIT_ROUNDOFF;
    nu / (1.0 - nu)
}

/// Operation count used in rounding bounds for applying an m×d sketch to a vector in f32: a
/// dense dot product takes `d` steps; the Hadamard schedule takes at most three passes of
/// `log₂ d` butterfly stages plus four sign/scale multiplies, `3·log₂ d + 4 ≤ 2d + 8`.
pub fn apply_steps(dim: usize) -> usize {
    2 * dim + 8
}

/// The ProptestConfig every property test uses: fixed seed, explicit case count, no files.
pub fn proptest_config(cases: u32, seed: u64) -> proptest::test_runner::Config {
    proptest::test_runner::Config {
        cases,
        rng_seed: proptest::test_runner::RngSeed::Fixed(seed),
        failure_persistence: None,
        ..proptest::test_runner::Config::default()
    }
}
