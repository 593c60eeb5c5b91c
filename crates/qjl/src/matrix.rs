//! The sketch matrix `S` behind one interface: dense Gaussian here, orthogonal from `tq-rotation`.

use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;
use tq_rotation::{Rotation, RotationKind};

use crate::gaussian::GaussianMatrix;
use crate::{QjlError, SketchKind};

/// ChaCha stream reserved for QJL sketches ("QJL" in ASCII). A cache that seeds its rotation Π
/// and its sketch S with the same number must still get independent matrices: with `S = Π` the
/// residual `r = x − Πᵀc` is not independent of `S` and the estimator is no longer unbiased.
const QJL_STREAM: u64 = 0x004C_4A51;

/// The matrix `S` (m = d rows).
#[derive(Clone, Debug)]
pub(crate) enum SketchMatrix {
    Gaussian(GaussianMatrix),
    Orthogonal(Rotation),
}

impl SketchMatrix {
    /// Draws `S` as a pure function of `(kind, dim, seed)`.
    pub(crate) fn draw(kind: SketchKind, dim: usize, seed: u64) -> Result<Self, QjlError> {
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        rng.set_stream(QJL_STREAM);
        Ok(match kind {
            SketchKind::Gaussian => Self::Gaussian(GaussianMatrix::draw(dim, dim, &mut rng)?),
            SketchKind::Haar => {
                Self::Orthogonal(Rotation::new(RotationKind::Haar, dim, rng.next_u64())?)
            }
            SketchKind::Hadamard => {
                Self::Orthogonal(Rotation::new(RotationKind::Hadamard, dim, rng.next_u64())?)
            }
        })
    }

    /// `out = S·y`; lengths are checked by the caller.
    pub(crate) fn project(&self, y: &[f32], out: &mut [f32]) -> Result<(), QjlError> {
        match self {
            Self::Gaussian(g) => g.project(y, out),
            Self::Orthogonal(rotation) => rotation.apply(y, out)?,
        }
        Ok(())
    }

    /// `out = Sᵀ·z`; lengths are checked by the caller.
    pub(crate) fn transpose_apply(&self, z: &[f32], out: &mut [f32]) -> Result<(), QjlError> {
        match self {
            Self::Gaussian(g) => g.transpose_apply(z, out),
            Self::Orthogonal(rotation) => rotation.apply_inverse(z, out)?,
        }
        Ok(())
    }

    /// `S` in f64, row-major (m×d).
    pub(crate) fn to_dense_f64(&self) -> Vec<f64> {
        match self {
            Self::Gaussian(g) => g.to_dense_f64(),
            Self::Orthogonal(rotation) => rotation.to_dense_f64(),
        }
    }
}
