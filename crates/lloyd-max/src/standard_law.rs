//! A coordinate law in standard units `z = t/σ` (variance 1), restricted to what the solver
//! needs on the upper half line: density, survival function and upper partial first moment.
//! Working in standard units makes one tolerance (10⁻¹² σ) mean the same for every `dim`.

use crate::gaussian_law;
use crate::sphere_law::SphereCoordinateLaw;
use crate::{CoordinateDistribution, LloydMaxError};

/// A validated coordinate law, in standard deviations.
#[derive(Clone, Copy, Debug)]
pub(crate) enum StandardLaw {
    /// `N(0, 1)`.
    Gaussian,
    /// `Z = √d · T` with `T` the exact sphere-coordinate law.
    Sphere {
        /// The law of `T`.
        law: SphereCoordinateLaw,
        /// `√d`: `Z`'s upper end point and the factor between `t` and `z`.
        sqrt_dim: f64,
    },
}

impl StandardLaw {
    /// The standardized law of `distribution` (which must be valid).
    pub(crate) fn new(distribution: CoordinateDistribution) -> Result<Self, LloydMaxError> {
        distribution.validate()?;
        Ok(match distribution {
            CoordinateDistribution::Gaussian { .. } => Self::Gaussian,
            CoordinateDistribution::Beta { dim } => Self::Sphere {
                law: SphereCoordinateLaw::new(dim),
                sqrt_dim: (dim as f64).sqrt(),
            },
        })
    }

    /// The supremum of the support: `+∞` or `√d`.
    pub(crate) fn upper_end(&self) -> f64 {
        match self {
            Self::Gaussian => f64::INFINITY,
            Self::Sphere { sqrt_dim, .. } => *sqrt_dim,
        }
    }

    /// The density of `Z` at `z`.
    pub(crate) fn density(&self, z: f64) -> f64 {
        match self {
            Self::Gaussian => gaussian_law::density(z),
            Self::Sphere { law, sqrt_dim } => law.density(z / sqrt_dim) / sqrt_dim,
        }
    }

    /// `P(Z > z)` for `z >= 0`.
    pub(crate) fn survival(&self, z: f64) -> Result<f64, LloydMaxError> {
        match self {
            Self::Gaussian => gaussian_law::survival(z),
            Self::Sphere { law, sqrt_dim } => law.survival(z / sqrt_dim),
        }
    }

    /// `E[Z; Z > z] = ∫_z^∞ u f(u) du` for `z >= 0`, in closed form.
    pub(crate) fn tail_moment(&self, z: f64) -> f64 {
        match self {
            Self::Gaussian => gaussian_law::tail_moment(z),
            Self::Sphere { law, sqrt_dim } => sqrt_dim * law.tail_moment(z / sqrt_dim),
        }
    }
}
