//! The norm of the reconstruction and the MSE-optimal shrinkage (math.md §3).

mod common;

use common::{
    UNIT_ROUNDOFF, Z, apply_steps, mean, norm_sq, ordered_samples, proptest_config, rounding_gamma,
    samples_to_detect, to_f32, unit_vector,
};
use proptest::prelude::*;
use std::f64::consts::{FRAC_2_PI, FRAC_PI_2, PI};
use tq_qjl::{QjlSketch, QjlSpec, SketchKind, SketchScale, asymptotic_bias_factor};

/// `(γ, r̂)` through the public API: encode, then reconstruct.
fn encode_and_reconstruct(sketch: &QjlSketch, r: &[f32]) -> (f32, Vec<f32>) {
    let (mut scratch, mut bits) = (vec![0.0; sketch.rows()], vec![0; sketch.words()]);
    let gamma = sketch
        .encode(r, &mut scratch, &mut bits)
        .expect("valid residual");
    let mut r_hat = vec![0.0; sketch.dim()];
    sketch
        .reconstruct(&bits, gamma, &mut scratch, &mut r_hat)
        .expect("valid code");
    (gamma, r_hat)
}

/// Relative error bound on `‖r̂‖²` for an orthogonal `S`, from f32 rounding only.
///
/// `r̂ = f32(α·γ·s)·fl(Sᵀz)`. Each coordinate of `fl(Sᵀz)` is off by at most
/// `γ_K·Σ_i |S_ij| ≤ γ_K·√d` (unit columns, `K = apply_steps(d)`), plus `u·√d` from storing a
/// Haar `S` in f32, so `‖fl(Sᵀz) − Sᵀz‖ ≤ (γ_K + u)·d` against `‖Sᵀz‖ = √d`: relative
/// `√d·(γ_K + u)`. The factor and the product add `3u`. Squaring doubles the relative error.
fn orthogonal_norm_tolerance(dim: usize) -> f64 {
    let relative = (dim as f64).sqrt() * (rounding_gamma(apply_steps(dim)) + UNIT_ROUNDOFF)
        + 3.0 * UNIT_ROUNDOFF;
    2.0 * relative + relative * relative
}

proptest! {
    #![proptest_config(proptest_config(96, 0x5EED_0001))]

    /// For every draw of an orthogonal `S`, `‖Sᵀz‖² = ‖z‖² = d`, so `‖r̂‖² = s²·d·γ²`:
    /// `(π/2)·γ²` with the asymptotic scale and α = 1, `(π/2)·γ²/κ²` with the exact scale.
    /// Deterministic, so no false failures; the tolerance (≤ 3.6e-4 at d = 130) is below the
    /// smallest wrong answer it must reject, the other scale (`κ² − 1 ≥ 3.9e-3` for d ≤ 130);
    /// a Gaussian `S` would give ≈ 2.55·γ² instead of 1.57·γ².
    #[test]
    fn orthogonal_sketch_norm_identity_holds_for_every_draw(
        seed in any::<u64>(),
        hadamard in any::<bool>(),
        dim in 1usize..=130,
        raw in proptest::collection::vec(-100.0f32..100.0, 130),
        exponent in -20i32..20,
    ) {
        let kind = if hadamard { SketchKind::Hadamard } else { SketchKind::Haar };
        let r: Vec<f32> = raw[..dim].iter().map(|v| v * 2f32.powi(exponent)).collect();
        prop_assume!(r.iter().any(|&v| v != 0.0));
        let sketch = QjlSpec::new(kind, dim, seed).with_scale(SketchScale::Asymptotic).build().unwrap();
        let tolerance = orthogonal_norm_tolerance(dim);

        let (gamma, r_hat) = encode_and_reconstruct(&sketch, &r);
        let gamma_sq = f64::from(gamma).powi(2);
        let ratio = norm_sq(&r_hat) / gamma_sq;
        prop_assert!((ratio / FRAC_PI_2 - 1.0).abs() <= tolerance, "asymptotic: {ratio}");

        let exact = sketch.with_scale(SketchScale::Exact);
        let (_, r_hat) = encode_and_reconstruct(&exact, &r);
        let kappa = asymptotic_bias_factor(dim);
        let ratio = norm_sq(&r_hat) / gamma_sq;
        prop_assert!((ratio * kappa * kappa / FRAC_PI_2 - 1.0).abs() <= tolerance, "exact: {ratio}");
    }
}

/// Exact variance of `‖r̂‖²/γ²` for Gaussian `S` (m = d) with the paper's scale.
///
/// Split each row `g_i` into its component along `e = r/γ` and the rest: `z_i·(g_i·e) = |g_i·e|`
/// and `z_i·g_i⊥ ~ N(0, I − eeᵀ)` independently (the sign depends only on `g_i·e`). So
/// `Sᵀz = A·e + W` with `A = Σ_i |g_i·e|` (a sum of m half-normals) and `‖W‖² ~ m·χ²_{d−1}`
/// independent of `A`, and `‖r̂‖²/γ² = (π/2)/m²·(A² + ‖W‖²)`. Its mean is
/// `π/2 + (d−1)/d` (m = d); its variance is `(π/2)²/m⁴·(Var A² + 2m²(d−1))`, with
/// `Var A² = κ₄ + 4κ₁κ₃ + 2κ₂² + 4κ₁²κ₂` in the cumulants `κ_n = m·k_n` of `A` and the
/// half-normal cumulants `k₁ = μ = √(2/π)`, `k₂ = 1 − μ²`, `k₃ = μ(2μ² − 1)`,
/// `k₄ = 3 − 2μ² − 3μ⁴ − 3k₂²` (from `E|g| = μ, E g² = 1, E|g|³ = 2μ, E g⁴ = 3`).
fn gaussian_norm_variance(dim: usize) -> f64 {
    let m = dim as f64;
    let mu = FRAC_2_PI.sqrt();
    let k2 = 1.0 - mu * mu;
    let k3 = mu * (2.0 * mu * mu - 1.0);
    let k4 = 3.0 - 2.0 * mu * mu - 3.0 * mu.powi(4) - 3.0 * k2 * k2;
    let (c1, c2, c3, c4) = (m * mu, m * k2, m * k3, m * k4);
    let var_a_sq = c4 + 4.0 * c1 * c3 + 2.0 * c2 * c2 + 4.0 * c1 * c1 * c2;
    FRAC_PI_2.powi(2) / m.powi(4) * (var_a_sq + 2.0 * m * m * (m - 1.0))
}

/// `E‖r̂‖² = (π/2 + (d−1)/d)·γ²` for Gaussian `S`, m = d = 64, paper scale (2.5552), not the
/// Haar identity's π/2. Per-sample variance: `gaussian_norm_variance` (0.1122 at d = 64).
/// Target: the `1/d` gap to the large-m value `π/2 + 1`, so `N = 100·0.1122·64² ≈ 45 900`.
/// One acceptance check: false failure 5.7e-7.
#[test]
fn gaussian_sketch_mean_squared_norm() {
    let dim = 64usize;
    let d = dim as f64;
    let expected = FRAC_PI_2 + (d - 1.0) / d;
    assert!(
        (expected - 2.5552).abs() < 1e-4,
        "math.md's value at d = 64"
    );
    let variance = gaussian_norm_variance(dim);
    let n = samples_to_detect(variance, 1.0 / d);
    let r = to_f32(&unit_vector(dim, 41));
    let ratios = ordered_samples(n, |i| {
        let sketch = QjlSpec::new(SketchKind::Gaussian, dim, 6_000_000 + i)
            .build()
            .unwrap();
        let (gamma, r_hat) = encode_and_reconstruct(&sketch, &r);
        norm_sq(&r_hat) / f64::from(gamma).powi(2)
    });
    let bound = Z * (variance / n as f64).sqrt();
    let error = mean(&ratios) - expected;
    assert!(
        error.abs() <= bound,
        "N={n}: mean - expected = {error:.3e}, bound {bound:.3e}"
    );
    // Its MMSE shrinkage is therefore 1/(π/2 + (d−1)/d) ≈ 0.391, not 2/π.
    let sketch = QjlSpec::new(SketchKind::Gaussian, dim, 0).build().unwrap();
    assert!((sketch.mmse_shrinkage().unwrap() - 1.0 / expected).abs() < 1e-12);
}

/// The MSE curve over α for Haar `S` with the **exact** scale at d = 64.
///
/// Per draw, `‖α·r̂ − r‖² = α²·a − 2α·b + γ²` with `a = ‖r̂‖²` and `b = ⟨r̂, r⟩`, so the mean
/// curve is the quadratic `α²·E a − 2α·E b + γ²`, minimised at `α* = E b/E a`. With the exact
/// scale `a = (π/2)γ²/κ²` on every draw and `E b = γ²`, so `α* = 2κ²/π` (0.64160 at d = 64;
/// with the asymptotic scale it would be `2κ/π`; both tend to 2/π = 0.63662), and
/// `MSE(α)/γ² = α²·π/(2κ²) − 2α + 1`: `MSE(1) = π/(2κ²) − 1 ≈ π/2 − 1` and
/// `MSE(2/π) = 2/(πκ²) − 4/π + 1 ≈ 1 − 2/π`.
///
/// Only `b̄` is random (a is deterministic up to rounding): `α̂* = b̄/ā` has relative standard
/// error `√(v/N)` with `v = haar_relative_variance(64)`. N is chosen to separate `2κ²/π` from
/// `2κ/π` (relative gap κ − 1) at Z = 5 each way: `N = 100·v/(κ − 1)² = 6 970`. The MSE checks
/// are deterministic functions of the same `b̄ − 1` (`MSE(α) − exact = −2α(b̄ − 1)γ²`), so they
/// hold whenever the argmin check does: one false-failure event, 5.7e-7.
#[test]
fn haar_mse_curve_is_minimised_at_the_mmse_shrinkage() {
    let dim = 64usize;
    let kappa = asymptotic_bias_factor(dim);
    let alpha_star = 2.0 * kappa * kappa / PI;
    let variance = common::haar_relative_variance(dim);
    let n = samples_to_detect(variance, kappa - 1.0);
    let r = to_f32(
        &unit_vector(dim, 51)
            .iter()
            .map(|x| 7.0 * x)
            .collect::<Vec<_>>(),
    );
    let tolerance = orthogonal_norm_tolerance(dim);

    let draws = ordered_samples(n, |i| {
        let sketch = QjlSpec::new(SketchKind::Haar, dim, 7_000_000 + i)
            .build()
            .unwrap();
        let (gamma, r_hat) = encode_and_reconstruct(&sketch, &r);
        let gamma_sq = f64::from(gamma).powi(2);
        (
            norm_sq(&r_hat) / gamma_sq,
            common::dot(&r_hat, &r) / gamma_sq,
        )
    });
    let (a, b): (Vec<f64>, Vec<f64>) = draws.into_iter().unzip();
    for &a_i in &a {
        assert!((a_i * kappa * kappa / FRAC_PI_2 - 1.0).abs() <= tolerance);
    }
    let (a_mean, b_mean) = (mean(&a), mean(&b));
    let standard_error = (variance / n as f64).sqrt();

    let fitted = b_mean / a_mean;
    assert!(
        (fitted / alpha_star - 1.0).abs() <= Z * standard_error + tolerance,
        "argmin {fitted} vs 2κ²/π = {alpha_star} (N={n})"
    );
    // The derived interval around 2/π: the finite-d offset 2(κ² − 1)/π plus the same bound.
    let offset = 2.0 * (kappa * kappa - 1.0) / PI;
    assert!((fitted - 2.0 / PI).abs() <= offset + alpha_star * (Z * standard_error + tolerance));
    let sketch = QjlSpec::new(SketchKind::Haar, dim, 0).build().unwrap();
    assert!((sketch.mmse_shrinkage().unwrap() - alpha_star).abs() < 1e-12);

    let mse = |alpha: f64| alpha * alpha * a_mean - 2.0 * alpha * b_mean + 1.0;
    let exact_mse = |alpha: f64| alpha * alpha * FRAC_PI_2 / (kappa * kappa) - 2.0 * alpha + 1.0;
    for alpha in [1.0, 2.0 / PI, alpha_star] {
        let bound = 2.0 * alpha * (Z * standard_error + tolerance);
        assert!(
            (mse(alpha) - exact_mse(alpha)).abs() <= bound,
            "MSE({alpha})"
        );
    }
    // MSE(2/π) ≈ 1 − 2/π = 0.363 against MSE(1) ≈ π/2 − 1 = 0.571: a gap of 0.2, ~150 times
    // the bound above, and the fitted minimum is below both.
    assert!(mse(2.0 / PI) < mse(1.0));
    assert!(mse(fitted) <= mse(2.0 / PI) && mse(fitted) <= mse(alpha_star));
    assert!((exact_mse(1.0) - (FRAC_PI_2 - 1.0)).abs() < 0.02);
    assert!((exact_mse(2.0 / PI) - (1.0 - 2.0 / PI)).abs() < 0.01);
}

proptest! {
    #![proptest_config(proptest_config(48, 0x5EED_0002))]

    /// Shrinkage α multiplies the reconstruction and the estimate by α and nothing else, so the
    /// per-draw MSE really is the quadratic used above. `r̂_α = f32(α·s·γ)·w` and
    /// `α·r̂_1 = α·f32(s·γ)·w` for the same `w = fl(Sᵀz)`: two factor roundings and two products,
    /// at most `4u` relative; the estimates differ by two final roundings, `2u` (use `4u`).
    #[test]
    fn shrinkage_scales_outputs_by_alpha(
        seed in any::<u64>(),
        kind_index in 0usize..3,
        dim in 1usize..=96,
        alpha in 0.05f32..4.0,
        raw in proptest::collection::vec(-10.0f32..10.0, 96),
        query in proptest::collection::vec(-10.0f32..10.0, 96),
    ) {
        let kind = [SketchKind::Gaussian, SketchKind::Haar, SketchKind::Hadamard][kind_index];
        let (r, y) = (&raw[..dim], &query[..dim]);
        let plain = QjlSpec::new(kind, dim, seed).build().unwrap();
        let shrunk = plain.clone().with_shrinkage(alpha).unwrap();
        prop_assert_eq!(shrunk.to_dense_f64(), QjlSpec::new(kind, dim, seed).with_shrinkage(alpha).build().unwrap().to_dense_f64());
        let a = f64::from(alpha);
        let (gamma, r_hat) = encode_and_reconstruct(&plain, r);
        let (gamma_s, r_hat_s) = encode_and_reconstruct(&shrunk, r);
        prop_assert_eq!(gamma, gamma_s);
        for (&s, &p) in r_hat_s.iter().zip(&r_hat) {
            let scaled = a * f64::from(p);
            prop_assert!((f64::from(s) - scaled).abs() <= 4.0 * UNIT_ROUNDOFF * scaled.abs());
        }
        let mut projected = vec![0.0; plain.rows()];
        plain.project(y, &mut projected).unwrap();
        let (mut scratch, mut bits) = (vec![0.0; plain.rows()], vec![0; plain.words()]);
        plain.encode(r, &mut scratch, &mut bits).unwrap();
        let scaled = a * f64::from(plain.estimate_inner_product(&projected, &bits, gamma));
        let estimate = f64::from(shrunk.estimate_inner_product(&projected, &bits, gamma));
        prop_assert!((estimate - scaled).abs() <= 4.0 * UNIT_ROUNDOFF * scaled.abs());
    }
}
