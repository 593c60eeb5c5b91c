//! Moments of a uniform point on the unit sphere, which fix the scale of an orthogonal sketch.
//!
//! With an orthogonal `S`, `S·r/‖r‖` is a uniform point `u` on `S^{d−1}` (for Haar `S`), and the
//! reconstruction's mean is `γ·s·d·E|u₁|·r/‖r‖`. Everything about the bias of a scale choice
//! therefore reduces to `E|u₁|`.

use statrs::function::gamma::ln_gamma;

/// `E|u₁|` for `u` uniform on the unit sphere `S^{d−1}` in `R^d`:
/// `Γ(d/2) / (√π · Γ((d+1)/2))`.
///
/// Computed through `ln Γ` so it stays finite for any `d`; it behaves like `√(2/(π·d))` for
/// large `d`. Exact small cases: `d = 1` gives 1, `d = 2` gives `2/π`, `d = 3` gives `1/2`
/// (Archimedes: `u₁` is uniform on `[−1, 1]`). Returns NaN for `dim = 0`, which has no sphere.
///
/// ```
/// let e = tq_qjl::expected_abs_coordinate(3);
/// assert!((e - 0.5).abs() < 1e-12);
/// ```
pub fn expected_abs_coordinate(dim: usize) -> f64 {
    if dim == 0 {
        return f64::NAN;
    }
    let d = dim as f64;
    (ln_gamma(d / 2.0) - ln_gamma((d + 1.0) / 2.0)).exp() / std::f64::consts::PI.sqrt()
}

/// The bias factor `κ = √(d/2) · Γ(d/2) / Γ((d+1)/2)` of the asymptotic scale `√(π/2)/√d`
/// applied to a Haar sketch: `E⟨y, r̂⟩ = κ·⟨y, r⟩`.
///
/// `κ ≈ 1 + 1/(4d)`: 1.003914 at `d = 64`, 1.001955 at `d = 128`. Returns NaN for `dim = 0`.
///
/// ```
/// let kappa = tq_qjl::asymptotic_bias_factor(128);
/// assert!((kappa - 1.001955).abs() < 1e-6);
/// ```
pub fn asymptotic_bias_factor(dim: usize) -> f64 {
    if dim == 0 {
        return f64::NAN;
    }
    let d = dim as f64;
    (d / 2.0).sqrt() * (ln_gamma(d / 2.0) - ln_gamma((d + 1.0) / 2.0)).exp()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::f64::consts::PI;

    /// `R(d) = Γ(d/2)/Γ((d+1)/2)` obeys the exact recurrence `R(d+2) = R(d)·d/(d+1)` from
    /// `Γ(x+1) = x·Γ(x)`, starting at `R(1) = √π` and `R(2) = 2/√π`. Iterating it in `f64` loses
    /// about one ulp per step, so after 512 steps agreement to 1e-12 relative checks `ln_gamma`
    /// independently; an off-by-one in either Gamma argument is off by ~1/(2d) ≥ 1e-3.
    #[test]
    fn matches_exact_gamma_recurrence() {
        let mut ratio = [PI.sqrt(), 2.0 / PI.sqrt()];
        for dim in 1..=512usize {
            let r = ratio[(dim - 1) % 2];
            let expected = r / PI.sqrt();
            let got = expected_abs_coordinate(dim);
            assert!(
                ((got - expected) / expected).abs() < 1e-12,
                "d={dim}: {got} vs {expected}"
            );
            let kappa = (dim as f64 / 2.0).sqrt() * r;
            let got_kappa = asymptotic_bias_factor(dim);
            assert!(((got_kappa - kappa) / kappa).abs() < 1e-12, "d={dim}");
            ratio[(dim - 1) % 2] = r * dim as f64 / (dim as f64 + 1.0);
        }
    }

    #[test]
    fn exact_small_dimensions_and_reference_values() {
        assert!((expected_abs_coordinate(1) - 1.0).abs() < 1e-14);
        assert!((expected_abs_coordinate(2) - 2.0 / PI).abs() < 1e-14);
        assert!((expected_abs_coordinate(3) - 0.5).abs() < 1e-14);
        // math.md reference values (6 printed digits): the exact scale 1/(d·E|u₁|) at d = 128,
        // and κ at d = 64 and 128.
        let exact_scale_128 = 1.0 / (128.0 * expected_abs_coordinate(128));
        assert!((exact_scale_128 - 0.110562).abs() < 5e-7);
        assert!((asymptotic_bias_factor(64) - 1.003914).abs() < 5e-7);
        assert!((asymptotic_bias_factor(128) - 1.001955).abs() < 5e-7);
        assert!(expected_abs_coordinate(0).is_nan());
        assert!(asymptotic_bias_factor(0).is_nan());
    }

    /// κ = 1 + 1/(4d) + 1/(32d²) − 5/(128d³) + O(d⁻⁴) (Stirling series of the Gamma ratio),
    /// so the remainder after three terms is within 0.05/d³ for d ≥ 8. At d = 10⁵ the check is
    /// against ln Γ's own precision (|ln Γ| ≈ 5·10⁵, so ~1e-10 absolute in the difference).
    #[test]
    fn kappa_follows_its_asymptotic_series() {
        for dim in [8usize, 16, 64, 128, 1000] {
            let d = dim as f64;
            let series = 1.0 + 1.0 / (4.0 * d) + 1.0 / (32.0 * d * d);
            let remainder = asymptotic_bias_factor(dim) - series;
            assert!(
                remainder < 0.0 && remainder.abs() < 0.05 / (d * d * d),
                "d={dim}"
            );
        }
        let d = 1e5;
        assert!((asymptotic_bias_factor(100_000) - 1.0 - 1.0 / (4.0 * d)).abs() < 1e-9);
    }
}
