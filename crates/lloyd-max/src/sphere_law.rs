//! The exact law of one coordinate `T` of a uniformly random unit vector in `R^d`:
//! `f(t) = K (1 - t²)^(a-1)` on `[-1, 1]` with `a = (d-1)/2` and `K = 1/B(1/2, a)`,
//! so that `(T+1)/2 ~ Beta(a, a)`.
//!
//! Why not `statrs::function::beta::beta_reg`: it forms its prefactor as
//! `exp(lnΓ(2a) − 2 lnΓ(a) + a ln x + a ln(1−x))`; at `d = 4096` those terms are ~3·10⁴ and
//! ~1.4·10³, so one rounding is a relative error of 10⁻¹³–10⁻¹¹ that varies with `x`;
//! differenced over the narrow cells of an 8-bit codebook it moves conditional means by
//! ~10⁻¹¹ σ, above the solver's 10⁻¹² σ target. (A continued fraction in `x = (1−t)/2` fares
//! no better for huge `d`: it is evaluated next to its convergence boundary `x = ½`, where
//! rounding `x` alone costs `ε√d` σ.) So here:
//!
//! - `ln K` comes from an asymptotic series for `ln(Γ(a+½)/Γ(a))`, which does not cancel;
//! - near the centre, `P(0 < T <= t) = K t (1−t²)^a ₂F₁(1, a+½; 3/2; t²)`, a series of
//!   positive terms;
//! - in the tail, `P(T > t) = K ∫_{asin t}^{π/2} cos^(d−2) θ dθ` (the substitution
//!   `u = sin θ` makes the integrand smooth at `t = 1` for every `d`) by Gauss–Legendre.
//!
//! The tests check the result against `beta_reg` where that is accurate, against
//! independent adaptive quadrature, and against 50-digit mpmath references.

use crate::LloydMaxError;
use crate::tail_quadrature::tail_integral;

/// Term cap of the central series: it needs < 100 terms wherever it is used.
const MAX_TERMS: usize = 10_000;

/// Below this `x` the Lanczos `lnΓ` values are small enough that their difference is exact
/// to ~10⁻¹⁵; above it the asymptotic series of `ln(Γ(x+½)/Γ(x))` is exact to 2·10⁻¹⁷.
const ASYMPTOTIC_FROM: f64 = 20.0;

/// `ln Γ(x + 1/2) - ln Γ(x)` for `x > 0`, accurate to a few ulps even for huge `x`.
pub(crate) fn ln_gamma_half_ratio(x: f64) -> f64 {
    // Shift x up with Γ(x+3/2)/Γ(x+1) = (x+1/2)/x · Γ(x+1/2)/Γ(x) until the asymptotic
    // expansion is accurate; the product of < 20 factors costs < 20 ulps.
    let mut shifted = x;
    let mut factor = 1.0;
    while shifted < ASYMPTOTIC_FROM {
        factor *= shifted / (shifted + 0.5);
        shifted += 1.0;
    }
    // ln(Γ(x+½)/Γ(x)) ~ ½ ln x + Σ (-1)^n (B_n(½) - B_n) / (n(n-1) x^(n-1)).
    let inv = 1.0 / shifted;
    let inv2 = inv * inv;
    let series = inv
        * (-1.0 / 8.0
            + inv2
                * (1.0 / 192.0
                    + inv2 * (-1.0 / 640.0 + inv2 * (17.0 / 14336.0 + inv2 * (-31.0 / 18432.0)))));
    0.5 * shifted.ln() + series + factor.ln()
}

/// The coordinate law of a random unit vector in `R^dim`, `dim >= 3`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SphereCoordinateLaw {
    /// `a = (dim - 1)/2`.
    a: f64,
    /// `ln K`, `K = 1/B(1/2, a) = Γ(a+½)/(√π Γ(a))`.
    ln_norm: f64,
}

impl SphereCoordinateLaw {
    /// The law for `dim >= 3` (the caller validates `dim`).
    pub(crate) fn new(dim: usize) -> Self {
        let a = (dim as f64 - 1.0) / 2.0;
        let ln_norm = ln_gamma_half_ratio(a) - 0.5 * std::f64::consts::PI.ln();
        Self { a, ln_norm }
    }

    /// `f(t)`; zero outside `[-1, 1]`.
    pub(crate) fn density(&self, t: f64) -> f64 {
        let t2 = t * t;
        if t2 > 1.0 {
            0.0
        } else if self.a == 1.0 {
            // d = 3: the uniform law, (1-t²)^0 = 1 up to and including the end points.
            self.ln_norm.exp()
        } else if t2 == 1.0 {
            0.0
        } else {
            (self.ln_norm + (self.a - 1.0) * (-t2).ln_1p()).exp()
        }
    }

    /// `∫_t^1 u f(u) du = K (1-t²)^a / (2a)` for `|t| <= 1` (an even function of `t`).
    pub(crate) fn tail_moment(&self, t: f64) -> f64 {
        let t2 = t * t;
        if t2 >= 1.0 {
            0.0
        } else {
            (self.ln_norm + self.a * (-t2).ln_1p()).exp() / (2.0 * self.a)
        }
    }

    /// `P(T > t)` for `t >= 0`, with small relative error also deep in the tail.
    pub(crate) fn survival(&self, t: f64) -> Result<f64, LloydMaxError> {
        if t >= 1.0 {
            return Ok(0.0);
        }
        if t <= 0.0 {
            return Ok(0.5);
        }
        let t2 = t * t;
        // a·t² ≈ z²/2 in standard deviations: up to z ≈ 2 the series needs ≤ 25 terms and
        // S ≥ 0.02, so ½ − C keeps full relative accuracy; t² <= ½ bounds the term ratio.
        if t2 <= 0.5 && self.a * t2 <= 2.0 {
            return Ok(0.5 - self.central_mass(t)?);
        }
        Ok(self.tail_mass(t))
    }

    /// `P(T > t) = K ∫_{asin t}^{π/2} cos^(d−2) θ dθ` for `0 <= t < 1`.
    fn tail_mass(&self, t: f64) -> f64 {
        // log of cos^(d−2) θ = (a − ½)·ln(1 − sin²θ): ln_1p keeps it exact for small θ.
        let power = self.a - 0.5;
        let theta = t.asin();
        let integral = tail_integral(
            |angle: f64| {
                let sine = angle.sin();
                power * (-sine * sine).ln_1p()
            },
            theta,
            std::f64::consts::FRAC_PI_2,
            2.0 * power * theta.tan(),
            2.0 * power,
        );
        self.ln_norm.exp() * integral
    }

    /// `P(0 < T <= t) = K t (1−t²)^a ₂F₁(1, a+½; 3/2; t²)`, a series of positive terms.
    fn central_mass(&self, t: f64) -> Result<f64, LloydMaxError> {
        let t2 = t * t;
        let mut term = 1.0;
        let mut sum = 1.0;
        for n in 0..MAX_TERMS {
            let n = n as f64;
            term *= (self.a + 0.5 + n) / (1.5 + n) * t2;
            sum += term;
            if term <= f64::EPSILON * 0.5 * sum {
                let prefactor = (self.ln_norm + self.a * (-t2).ln_1p()).exp();
                return Ok(prefactor * t * sum);
            }
        }
        Err(LloydMaxError::SpecialFunctionNotConverged {
            function: "incomplete beta series",
            argument: t,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{SphereCoordinateLaw, ln_gamma_half_ratio};

    /// 20-digit values of `lnΓ(x+½) − lnΓ(x)` from mpmath (30 significant digits).
    #[test]
    #[allow(clippy::excessive_precision)] // The reference digits are kept as printed.
    fn gamma_ratio_matches_mpmath() {
        let cases = [
            (1.0, -0.120_782_237_635_245_222_35),
            (1.5, 0.120_782_237_635_245_222_35),
            (2.0, 0.284_682_870_472_919_159_63),
            (19.5, 1.478_797_678_238_397_044_5),
            (20.0, 1.491_616_787_331_304_073_6),
            (31.5, 1.721_025_685_532_536_368_2),
            (63.5, 2.073_551_469_352_050_032_2),
            (2047.5, 3.812_126_357_803_168_957_6),
            (49_999_999.5, 8.863_766_774_196_210_031_4),
        ];
        for (x, exact) in cases {
            let got = ln_gamma_half_ratio(x);
            assert!(
                (got - exact).abs() <= 4.0 * f64::EPSILON * exact.abs().max(1.0),
                "x={x}: {got} vs {exact}"
            );
        }
    }

    /// The series (centre) and the quadrature (tail) agree where `survival` switches
    /// between them (a·t² = 2, z ≈ 2), and on both sides of it.
    #[test]
    fn series_and_tail_quadrature_agree_at_the_switch() {
        for dim in [4usize, 64, 4096, 1 << 24] {
            let law = SphereCoordinateLaw::new(dim);
            let a = (dim as f64 - 1.0) / 2.0;
            for factor in [0.7, 1.0, 1.3] {
                let t = factor * (2.0 / a).sqrt();
                if t * t > 0.5 {
                    continue;
                }
                let series = 0.5 - law.central_mass(t).expect("series converges");
                let quadrature = law.tail_mass(t);
                // ½ − C carries a few ulps of ½, i.e. ~4ε·(½/S) relative; the quadrature ~4ε.
                let tolerance = 4.0 * f64::EPSILON * (0.5 / quadrature + 1.0);
                assert!(
                    ((series - quadrature) / quadrature).abs() < tolerance,
                    "d={dim} t={t}: {series} vs {quadrature}"
                );
            }
        }
    }
}
