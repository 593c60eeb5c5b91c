//! The law of one coordinate of a randomly rotated unit vector, and its exact integrals.

use serde::{Deserialize, Serialize};

use crate::LloydMaxError;
use crate::sphere_law::SphereCoordinateLaw;
use crate::standard_law::StandardLaw;

/// The law of one coordinate of a randomly rotated unit vector.
///
/// All methods work in unit-vector coordinates `t` (variance `1/dim`).
///
/// ```
/// use tq_lloyd_max::CoordinateDistribution;
///
/// let exact = CoordinateDistribution::Beta { dim: 128 };
/// assert_eq!(exact.variance(), 1.0 / 128.0);
/// // Symmetric: half of the mass lies above zero.
/// assert!((exact.cdf(0.0)? - 0.5).abs() < 1e-15);
/// // The Gaussian limit has the same variance.
/// let limit = CoordinateDistribution::Gaussian { dim: 128 };
/// assert!((exact.cdf(0.1)? - limit.cdf(0.1)?).abs() < 1e-3);
/// # Ok::<(), tq_lloyd_max::LloydMaxError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum CoordinateDistribution {
    /// Exact law: `f(t) ∝ (1−t²)^((dim−3)/2)` on `[−1, 1]`, i.e.
    /// `(t+1)/2 ~ Beta((dim−1)/2, (dim−1)/2)`. Needs `dim >= 3` (`dim = 3` is uniform).
    Beta {
        /// Dimension of the rotated vectors.
        dim: usize,
    },
    /// Gaussian limit `N(0, 1/dim)` (`dim >= 1`; `dim = 1` is the standard normal).
    Gaussian {
        /// Dimension of the rotated vectors (sets the variance `1/dim`).
        dim: usize,
    },
}

impl CoordinateDistribution {
    /// The dimension `dim`.
    pub fn dim(&self) -> usize {
        match *self {
            Self::Beta { dim } | Self::Gaussian { dim } => dim,
        }
    }

    /// The variance `1/dim` (infinite for the invalid `dim = 0`).
    pub fn variance(&self) -> f64 {
        1.0 / self.dim() as f64
    }

    /// The standard deviation `σ = 1/√dim`.
    pub fn std_dev(&self) -> f64 {
        1.0 / (self.dim() as f64).sqrt()
    }

    /// Checks the dimension: `Beta` needs `dim >= 3`, `Gaussian` needs `dim >= 1`.
    pub fn validate(&self) -> Result<(), LloydMaxError> {
        let (law, min) = match self {
            Self::Beta { .. } => ("beta", 3),
            Self::Gaussian { .. } => ("gaussian", 1),
        };
        if self.dim() < min {
            return Err(LloydMaxError::DimensionTooSmall {
                law,
                dim: self.dim(),
                min,
            });
        }
        Ok(())
    }

    /// The density `f(t)`.
    pub fn pdf(&self, t: f64) -> Result<f64, LloydMaxError> {
        let t = self.checked(t)?;
        Ok(match self {
            Self::Beta { dim } => SphereCoordinateLaw::new(*dim).density(t),
            Self::Gaussian { .. } => {
                let sigma = self.std_dev();
                StandardLaw::Gaussian.density(t / sigma) / sigma
            }
        })
    }

    /// The distribution function `P(X <= t)`.
    pub fn cdf(&self, t: f64) -> Result<f64, LloydMaxError> {
        let t = self.checked(t)?;
        // Evaluating the tail that is smaller keeps the relative error small in both tails.
        if t >= 0.0 {
            Ok(1.0 - self.upper_tail(t)?)
        } else {
            self.upper_tail(-t)
        }
    }

    /// The survival function `P(X > t)`, accurate in relative terms deep in the upper tail.
    pub fn survival(&self, t: f64) -> Result<f64, LloydMaxError> {
        let t = self.checked(t)?;
        if t >= 0.0 {
            self.upper_tail(t)
        } else {
            Ok(1.0 - self.upper_tail(-t)?)
        }
    }

    /// The partial first moment `∫_a^b t f(t) dt` (negated when `b < a`), in closed form:
    /// `σ² f` for the Gaussian and `−(1−t²)^((dim−1)/2) / ((dim−1) B(½, (dim−1)/2))` as the
    /// antiderivative for `Beta`.
    ///
    /// ```
    /// use tq_lloyd_max::CoordinateDistribution;
    ///
    /// let law = CoordinateDistribution::Gaussian { dim: 1 };
    /// // E[X; X > 0] = φ(0) = 1/√(2π).
    /// let half = law.partial_mean(0.0, f64::INFINITY)?;
    /// assert!((half - 0.398_942_280_401_432_7).abs() < 1e-15);
    /// # Ok::<(), tq_lloyd_max::LloydMaxError>(())
    /// ```
    pub fn partial_mean(&self, a: f64, b: f64) -> Result<f64, LloydMaxError> {
        let (a, b) = (self.checked(a)?, self.checked(b)?);
        // E[X; X > t] is even in t because ∫_{-t}^{t} u f(u) du = 0.
        Ok(self.upper_moment(a.abs()) - self.upper_moment(b.abs()))
    }

    /// `P(X > t)` for `t >= 0`.
    fn upper_tail(&self, t: f64) -> Result<f64, LloydMaxError> {
        match self {
            Self::Beta { dim } => SphereCoordinateLaw::new(*dim).survival(t),
            Self::Gaussian { .. } => StandardLaw::Gaussian.survival(t / self.std_dev()),
        }
    }

    /// `E[X; X > t]` for `t >= 0`.
    fn upper_moment(&self, t: f64) -> f64 {
        match self {
            Self::Beta { dim } => SphereCoordinateLaw::new(*dim).tail_moment(t),
            Self::Gaussian { .. } => {
                let sigma = self.std_dev();
                sigma * StandardLaw::Gaussian.tail_moment(t / sigma)
            }
        }
    }

    /// Validates `self` and rejects NaN arguments.
    fn checked(&self, t: f64) -> Result<f64, LloydMaxError> {
        self.validate()?;
        if t.is_nan() {
            Err(LloydMaxError::NanArgument)
        } else {
            Ok(t)
        }
    }
}
