//! The Haar rotation: the Q factor of a Gaussian matrix, sign-fixed, kept dense.

use std::fmt;

use nalgebra::DMatrix;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use rand_distr::StandardNormal;

use crate::matvec::matvec;

/// A Haar-distributed orthogonal matrix, in f64 for reference and in f32 as both Π and Πᵀ
/// stored column-major, the layout the blocked [`matvec`] streams through.
#[derive(Clone)]
pub(crate) struct HaarMatrix {
    dim: usize,
    /// Π, row-major, (dim, dim).
    dense: Vec<f64>,
    /// Π rounded to f32, column-major, (dim, dim).
    forward: Vec<f32>,
    /// Πᵀ rounded to f32, column-major, (dim, dim).
    inverse: Vec<f32>,
}

impl fmt::Debug for HaarMatrix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HaarMatrix")
            .field("dim", &self.dim)
            .finish_non_exhaustive()
    }
}

/// Q of `A = QR` for a d×d matrix `A` of i.i.d. N(0, 1) entries, with every column of Q
/// multiplied by `sign(R_jj)`; returned row-major.
///
/// The entries are drawn row by row from `ChaCha20Rng::seed_from_u64(seed)`. The sign fix
/// makes the factorization the unique one with a positive diagonal of R, and only that Q is
/// Haar-distributed (Mezzadri 2007); a Householder QR on its own leaves Q's column signs
/// tied to A (LAPACK's convention makes every `Q_00` negative). `R_jj = q_jᵀ a_j` is
/// recomputed from Q rather than read from the library's R, so the fix holds whatever
/// sign convention the QR implementation follows (nalgebra 0.34's `QR::q()` happens to
/// return the positive-diagonal factor already; this keeps the guarantee if that changes).
pub(crate) fn haar_orthogonal(dim: usize, seed: u64) -> Vec<f64> {
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    let entries: Vec<f64> = (0..dim * dim).map(|_| rng.sample(StandardNormal)).collect();
    let gaussian = DMatrix::from_row_slice(dim, dim, &entries);
    let mut q = gaussian.clone().qr().q();
    for j in 0..dim {
        let r_jj = q.column(j).dot(&gaussian.column(j));
        if r_jj < 0.0 {
            q.column_mut(j).neg_mut();
        }
    }
    // nalgebra stores column-major; the transpose's storage is Q row-major.
    q.transpose().as_slice().to_vec()
}

impl HaarMatrix {
    /// Draws Π for `(dim, seed)`; `1 ≤ dim ≤ 8192` is checked by the caller.
    pub(crate) fn new(dim: usize, seed: u64) -> Self {
        let dense = haar_orthogonal(dim, seed);
        // Π row-major is Πᵀ column-major, and Πᵀ row-major is Π column-major.
        let inverse: Vec<f32> = dense.iter().map(|&v| v as f32).collect();
        let mut forward = vec![0.0f32; dim * dim];
        for (i, row) in inverse.chunks_exact(dim).enumerate() {
            for (j, &value) in row.iter().enumerate() {
                forward[j * dim + i] = value;
            }
        }
        HaarMatrix {
            dim,
            dense,
            forward,
            inverse,
        }
    }

    /// `output = Π·input`; lengths are checked by the caller.
    #[inline]
    pub(crate) fn apply(&self, input: &[f32], output: &mut [f32]) {
        matvec(&self.forward, input, output);
    }

    /// `output = Πᵀ·input`; lengths are checked by the caller.
    #[inline]
    pub(crate) fn apply_inverse(&self, input: &[f32], output: &mut [f32]) {
        matvec(&self.inverse, input, output);
    }

    /// Floating-point work per vector, for sizing parallel tasks.
    pub(crate) fn cost(&self) -> usize {
        2 * self.dim * self.dim
    }

    /// Π in f64, row-major.
    pub(crate) fn to_dense_f64(&self) -> Vec<f64> {
        self.dense.clone()
    }
}
