//! Test support: an independent quadrature of the coordinate laws (adaptive Simpson on the
//! unnormalized density, sharing no code with the crate's series, Gauss–Legendre rule or
//! normalizing constant), and the fixed proptest configuration.
#![allow(dead_code)] // Each test binary uses a different part of this module.

use proptest::test_runner::{Config, RngSeed};
use tq_lloyd_max::CoordinateDistribution;

/// A proptest configuration with a fixed seed, so every run sees the same cases.
pub fn fixed_config(cases: u32, seed: u64) -> Config {
    Config {
        cases,
        rng_seed: RngSeed::Fixed(seed),
        failure_persistence: None,
        ..Config::default()
    }
}

/// The law in a variable `v` where its unnormalized weight is smooth on the whole support:
/// `Beta { dim }`: `t = sin v`, `f(t) dt ∝ cos^(dim−2) v dv` on `[−π/2, π/2]`;
/// `Gaussian { dim }`: `t = σ v`, `f(t) dt ∝ exp(−v²/2) dv`.
#[derive(Clone, Copy, Debug)]
pub struct Quadrature {
    distribution: CoordinateDistribution,
    /// Width of the weight in `v`: the weight falls at least like `exp(−Δ²/(2 scale²))`
    /// away from its maximum on any interval (log-concavity with curvature `>= 1/scale²`).
    scale: f64,
    /// Support of `v`.
    end: f64,
    /// Σ weight over the whole support, computed by the same quadrature.
    total: f64,
}

impl Quadrature {
    pub fn new(distribution: CoordinateDistribution) -> Self {
        let (scale, end) = match distribution {
            CoordinateDistribution::Beta { dim } => (
                1.0 / ((dim as f64 - 2.0).max(1.0)).sqrt(),
                std::f64::consts::FRAC_PI_2,
            ),
            CoordinateDistribution::Gaussian { .. } => (1.0, f64::INFINITY),
        };
        let mut quadrature = Self {
            distribution,
            scale,
            end,
            total: 1.0,
        };
        quadrature.total = quadrature.raw(f64::NEG_INFINITY, f64::INFINITY, &|_| 1.0);
        quadrature
    }

    fn weight(&self, v: f64) -> f64 {
        match self.distribution {
            // cos^(d−2) v = exp((d−2)/2 · ln(1 − sin² v)); ln_1p keeps the exponent exact for
            // small v, where a rounded cos v would put ~(d−2)·1e-16 of noise into it.
            CoordinateDistribution::Beta { dim } => {
                let sine = v.sin();
                (0.5 * (dim as f64 - 2.0) * (-sine * sine).ln_1p()).exp()
            }
            CoordinateDistribution::Gaussian { .. } => (-0.5 * v * v).exp(),
        }
    }

    fn coordinate_at(&self, v: f64) -> f64 {
        match self.distribution {
            CoordinateDistribution::Beta { .. } => v.sin(),
            CoordinateDistribution::Gaussian { dim } => v / (dim as f64).sqrt(),
        }
    }

    fn variable_at(&self, t: f64) -> f64 {
        match self.distribution {
            CoordinateDistribution::Beta { .. } => t.clamp(-1.0, 1.0).asin(),
            CoordinateDistribution::Gaussian { dim } => t * (dim as f64).sqrt(),
        }
    }

    /// The normalized density at `t`, from the quadrature's own total mass.
    pub fn density(&self, t: f64) -> f64 {
        match self.distribution {
            CoordinateDistribution::Beta { dim } => {
                if t.abs() > 1.0 {
                    return 0.0;
                }
                if dim == 3 {
                    return 1.0 / self.total;
                }
                (0.5 * (dim as f64 - 3.0) * (-t * t).ln_1p()).exp() / self.total
            }
            CoordinateDistribution::Gaussian { dim } => {
                let sqrt_dim = (dim as f64).sqrt();
                self.weight(t * sqrt_dim) * sqrt_dim / self.total
            }
        }
    }

    /// `E[g(X); lo < X <= hi]` (normalized by the quadrature's own total mass).
    pub fn expect(&self, lo: f64, hi: f64, g: impl Fn(f64) -> f64) -> f64 {
        self.raw(lo, hi, &g) / self.total
    }

    /// `P(lo < X <= hi)`.
    pub fn mass(&self, lo: f64, hi: f64) -> f64 {
        self.expect(lo, hi, |_| 1.0)
    }

    /// `E[X | lo < X <= hi]`.
    pub fn conditional_mean(&self, lo: f64, hi: f64) -> f64 {
        self.raw(lo, hi, &|t| t) / self.raw(lo, hi, &|_| 1.0)
    }

    /// `∫ g(t(v)) weight(v) dv` over the `v`-image of `(lo, hi]`, dropping what lies more
    /// than 12 scales from the interval's densest point (weight below `e^−72` of it).
    fn raw(&self, lo: f64, hi: f64, g: &dyn Fn(f64) -> f64) -> f64 {
        let (a, b) = (
            self.variable_at(lo).max(-self.end),
            self.variable_at(hi).min(self.end),
        );
        if a >= b {
            return 0.0;
        }
        let densest = 0.0_f64.clamp(a, b);
        let reach = 12.0 * self.scale;
        let (a, b) = (a.max(densest - reach), b.min(densest + reach));
        // Panels of half a scale, each integrated adaptively to 1e-14 of its own size.
        let panels = ((b - a) / (0.5 * self.scale)).ceil().max(1.0) as usize;
        let width = (b - a) / panels as f64;
        let f = |v: f64| g(self.coordinate_at(v)) * self.weight(v);
        (0..panels)
            .map(|p| {
                let (x0, x1) = (
                    a + p as f64 * width,
                    if p + 1 == panels {
                        b
                    } else {
                        a + (p + 1) as f64 * width
                    },
                );
                adaptive_simpson(&f, x0, x1, 1e-14)
            })
            .sum()
    }
}

/// Bisections allowed below a panel (half a scale wide): 2^-20 of a scale is far finer than
/// the 1e-14 tolerance needs for these smooth weights, and the cap keeps rounding noise from
/// recursing forever.
const MAX_DEPTH: u32 = 20;

/// Adaptive Simpson with Richardson correction, to `rel_tol` of the coarse estimate's scale.
fn adaptive_simpson(f: &dyn Fn(f64) -> f64, a: f64, b: f64, rel_tol: f64) -> f64 {
    let (fa, fm, fb) = (f(a), f(0.5 * (a + b)), f(b));
    let whole = (b - a) / 6.0 * (fa + 4.0 * fm + fb);
    let scale = (b - a) * (fa.abs() + fm.abs() + fb.abs()) / 3.0;
    simpson_step(
        f,
        a,
        b,
        fa,
        fm,
        fb,
        whole,
        (rel_tol * scale).max(f64::MIN_POSITIVE),
        MAX_DEPTH,
    )
}

#[allow(clippy::too_many_arguments)]
fn simpson_step(
    f: &dyn Fn(f64) -> f64,
    a: f64,
    b: f64,
    fa: f64,
    fm: f64,
    fb: f64,
    whole: f64,
    tol: f64,
    depth: u32,
) -> f64 {
    let m = 0.5 * (a + b);
    let (lm, rm) = (0.5 * (a + m), 0.5 * (m + b));
    let (flm, frm) = (f(lm), f(rm));
    let left = (m - a) / 6.0 * (fa + 4.0 * flm + fm);
    let right = (b - m) / 6.0 * (fm + 4.0 * frm + fb);
    let delta = left + right - whole;
    if depth == 0 || delta.abs() <= 15.0 * tol {
        left + right + delta / 15.0
    } else {
        simpson_step(f, a, m, fa, flm, fm, left, 0.5 * tol, depth - 1)
            + simpson_step(f, m, b, fm, frm, fb, right, 0.5 * tol, depth - 1)
    }
}

/// Cell boundaries of a codebook: `−∞, t_0, …, t_{n−2}, +∞`.
pub fn cell_bounds(thresholds: &[f64]) -> Vec<f64> {
    std::iter::once(f64::NEG_INFINITY)
        .chain(thresholds.iter().copied())
        .chain([f64::INFINITY])
        .collect()
}

/// `E[(X − Q(X))²]` of a codebook's centroids/thresholds under `quadrature`'s law, by
/// integrating `(t − c_k)²` over each cell (no cancellation).
pub fn distortion_under(quadrature: &Quadrature, centroids: &[f64], thresholds: &[f64]) -> f64 {
    let bounds = cell_bounds(thresholds);
    centroids
        .iter()
        .zip(bounds.windows(2))
        .map(|(&c, cell)| quadrature.expect(cell[0], cell[1], |t| (t - c) * (t - c)))
        .sum()
}

/// The dimensions every exhaustive test covers.
pub const DIMS: [usize; 7] = [3, 4, 5, 64, 128, 1024, 4096];
