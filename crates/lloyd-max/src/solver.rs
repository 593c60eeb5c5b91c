//! Newton's method on the Lloyd-Max fixed-point equations of a symmetric law.
//!
//! By symmetry only the `m = 2^b / 2` positive centroids `0 < c_1 < … < c_m` are unknowns;
//! cell `j` is `(s_{j-1}, s_j]` with `s_0 = 0`, `s_j = (c_j + c_{j+1})/2`, `s_m` = end of the
//! support. With the exact cell integrals `P_j = S(s_{j-1}) − S(s_j)` (survival function) and
//! `M_j = H(s_{j-1}) − H(s_j)` (`H(z) = E[Z; Z > z]`), we solve `g_j(c) = c_j P_j − M_j = 0`.
//! `g_j` depends on `c_{j-1}, c_j, c_{j+1}` only, so its Jacobian is tridiagonal:
//!
//! ```text
//! ∂g_j/∂c_{j+1} = ½ (c_j − s_j) f(s_j)
//! ∂g_j/∂c_{j-1} = −½ (c_j − s_{j-1}) f(s_{j-1})
//! ∂g_j/∂c_j     = P_j + ∂g_j/∂c_{j+1} + ∂g_j/∂c_{j-1}
//! ```
//!
//! (terms at the fixed boundaries `s_0`, `s_m` drop out). Plain Lloyd iteration is a
//! contraction with rate close to 1 at high `b`; Newton converges quadratically from the
//! companding guess, and falls back to halved steps and then to a Lloyd step when a step
//! does not reduce the residual.

use crate::LloydMaxError;
use crate::standard_law::StandardLaw;
use crate::tridiagonal::Tridiagonal;

/// Target of `max_j |c_j − M_j/P_j|`, in standard deviations.
const RESIDUAL_TOLERANCE: f64 = 1e-12;

/// Newton needs 4–8 iterations from the companding guess; the rest is headroom for the
/// Lloyd fallback.
const MAX_ITERATIONS: usize = 200;

/// Step halvings tried before falling back to a Lloyd step.
const MAX_HALVINGS: usize = 30;

/// Trapezoid intervals for the companding guess (its accuracy only affects the start).
const COMPANDING_GRID: usize = 1024;

/// `f^(1/3) ≤ e^(−z²/6)` is below 10⁻¹¹⁵ beyond this many standard deviations.
const COMPANDING_RANGE: f64 = 40.0;

/// The positive half of a Lloyd-Max quantizer, in standard deviations.
#[derive(Clone, Debug)]
pub(crate) struct HalfCodebook {
    /// `c_1 < … < c_m`, all positive.
    pub(crate) centroids: Vec<f64>,
    /// `E[(Z − Q(Z))²]` over the whole line.
    pub(crate) distortion: f64,
}

/// Cell boundaries and exact cell integrals for one set of half centroids.
struct Cells {
    /// `s_0 = 0, s_1, …, s_m = end`.
    bounds: Vec<f64>,
    /// `P_j`.
    mass: Vec<f64>,
    /// `M_j`.
    moment: Vec<f64>,
}

impl Cells {
    fn evaluate(law: &StandardLaw, centroids: &[f64]) -> Result<Self, LloydMaxError> {
        let m = centroids.len();
        let mut bounds = Vec::with_capacity(m + 1);
        bounds.push(0.0);
        bounds.extend(centroids.windows(2).map(|w| (w[0] + w[1]) / 2.0));
        bounds.push(law.upper_end());
        // S and H at the upper end are exactly zero; evaluating them there would only add
        // rounding (√d·(1−t²) with t = √d/√d) or infinities.
        let mut survival = Vec::with_capacity(m + 1);
        let mut tail = Vec::with_capacity(m + 1);
        for &s in &bounds[..m] {
            survival.push(law.survival(s)?);
            tail.push(law.tail_moment(s));
        }
        survival.push(0.0);
        tail.push(0.0);
        let mass = survival.windows(2).map(|w| w[0] - w[1]).collect();
        let moment = tail.windows(2).map(|w| w[0] - w[1]).collect();
        Ok(Self {
            bounds,
            mass,
            moment,
        })
    }

    /// `max_j |c_j − M_j/P_j|`, infinite if a cell has no mass.
    fn residual(&self, centroids: &[f64]) -> f64 {
        centroids
            .iter()
            .zip(self.mass.iter().zip(&self.moment))
            .fold(0.0, |worst, (c, (p, m))| {
                if *p > 0.0 {
                    f64::max(worst, (c - m / p).abs())
                } else {
                    f64::INFINITY
                }
            })
    }

    /// `1 − 2 Σ_j (2 c_j M_j − c_j² P_j)`: `E[(Z − Q(Z))²]` for unit variance, exact for any
    /// `c` (not only at the fixed point), so the 10⁻¹² residual enters only quadratically.
    fn distortion(&self, centroids: &[f64]) -> f64 {
        let half: f64 = centroids
            .iter()
            .zip(self.mass.iter().zip(&self.moment))
            .map(|(c, (p, m))| c * (2.0 * m - c * p))
            .sum();
        1.0 - 2.0 * half
    }
}

/// Solves the `levels`-level quantizer (`levels` even, ≥ 2) of a symmetric standardized law.
pub(crate) fn solve(law: &StandardLaw, levels: usize) -> Result<HalfCodebook, LloydMaxError> {
    let end = law.upper_end();
    let mut centroids = companding_guess(law, levels / 2);
    let mut cells = Cells::evaluate(law, &centroids)?;
    let mut residual = cells.residual(&centroids);
    for _ in 0..MAX_ITERATIONS {
        if residual <= RESIDUAL_TOLERANCE {
            let distortion = cells.distortion(&centroids);
            return Ok(HalfCodebook {
                centroids,
                distortion,
            });
        }
        let step = match newton_step(law, &centroids, &cells, residual, end)? {
            Some(step) => step,
            None => lloyd_step(law, &cells)?,
        };
        (centroids, cells, residual) = step;
    }
    Err(LloydMaxError::NotConverged {
        iterations: MAX_ITERATIONS,
        residual,
    })
}

type Step = (Vec<f64>, Cells, f64);

/// A Newton step, halved until it stays ordered inside the support and lowers the residual.
fn newton_step(
    law: &StandardLaw,
    centroids: &[f64],
    cells: &Cells,
    residual: f64,
    end: f64,
) -> Result<Option<Step>, LloydMaxError> {
    let m = centroids.len();
    let mut jacobian = Tridiagonal::zeros(m);
    jacobian.diag.copy_from_slice(&cells.mass);
    // Right-hand side −g_j = M_j − c_j P_j.
    let mut delta: Vec<f64> = (cells.moment.iter().zip(&cells.mass).zip(centroids))
        .map(|((moment, mass), c)| moment - c * mass)
        .collect();
    for j in 0..m - 1 {
        let s = cells.bounds[j + 1];
        let half_density = 0.5 * law.density(s);
        jacobian.upper[j] = half_density * (centroids[j] - s);
        jacobian.lower[j + 1] = -half_density * (centroids[j + 1] - s);
        jacobian.diag[j] += jacobian.upper[j];
        jacobian.diag[j + 1] += jacobian.lower[j + 1];
    }
    if jacobian.solve_in_place(&mut delta).is_none() {
        return Ok(None);
    }
    let mut scale = 1.0;
    for _ in 0..MAX_HALVINGS {
        let trial: Vec<f64> = centroids
            .iter()
            .zip(&delta)
            .map(|(c, d)| c + scale * d)
            .collect();
        if is_admissible(&trial, end) {
            let trial_cells = Cells::evaluate(law, &trial)?;
            let trial_residual = trial_cells.residual(&trial);
            if trial_residual < residual {
                return Ok(Some((trial, trial_cells, trial_residual)));
            }
        }
        scale *= 0.5;
    }
    Ok(None)
}

/// One Lloyd step `c_j ← M_j / P_j`: never increases the distortion and keeps the order,
/// since every conditional mean lies inside its own cell.
fn lloyd_step(law: &StandardLaw, cells: &Cells) -> Result<Step, LloydMaxError> {
    let next: Vec<f64> = cells
        .moment
        .iter()
        .zip(&cells.mass)
        .map(|(m, p)| m / p)
        .collect();
    let next_cells = Cells::evaluate(law, &next)?;
    let residual = next_cells.residual(&next);
    Ok((next, next_cells, residual))
}

/// `0 < c_1 < … < c_m < end`, all finite.
fn is_admissible(centroids: &[f64], end: f64) -> bool {
    centroids.first().is_some_and(|&c| c > 0.0)
        && centroids.last().is_some_and(|&c| c.is_finite() && c < end)
        && centroids.windows(2).all(|w| w[0] < w[1])
}

/// High-resolution start: the optimal point density of a fine quantizer is `∝ f^(1/3)`
/// (Panter–Dite), so place `c_j` at the `(j − ½)/m` quantile of that density on `[0, end)`.
/// Exact for the uniform law (`Beta { dim: 3 }`).
fn companding_guess(law: &StandardLaw, m: usize) -> Vec<f64> {
    let span = law.upper_end().min(COMPANDING_RANGE);
    let h = span / COMPANDING_GRID as f64;
    let point_density = |i: usize| law.density(i as f64 * h).cbrt();
    let mut cumulative = Vec::with_capacity(COMPANDING_GRID + 1);
    cumulative.push(0.0);
    let mut previous = point_density(0);
    for i in 1..=COMPANDING_GRID {
        let next = point_density(i);
        let last = cumulative[i - 1];
        cumulative.push(last + 0.5 * h * (previous + next));
        previous = next;
    }
    let total = cumulative[COMPANDING_GRID];
    let mut guess = Vec::with_capacity(m);
    let mut i = 1;
    for j in 0..m {
        let target = (j as f64 + 0.5) / m as f64 * total;
        while i < COMPANDING_GRID && cumulative[i] < target {
            i += 1;
        }
        let (lo, hi) = (cumulative[i - 1], cumulative[i]);
        let fraction = if hi > lo {
            (target - lo) / (hi - lo)
        } else {
            0.5
        };
        guess.push((i as f64 - 1.0 + fraction) * h);
    }
    guess
}
