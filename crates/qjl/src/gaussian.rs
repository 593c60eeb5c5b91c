//! The paper's sketch: an m×d matrix of i.i.d. N(0, 1) entries (m = d), stored row-major in f32.

use rand::Rng;
use rand_chacha::ChaCha20Rng;
use rand_distr::StandardNormal;

use crate::QjlError;

/// Dense Gaussian matrix; `entries[i * dim + j] = S_ij` (shape (rows, dim)).
#[derive(Clone, Debug)]
pub(crate) struct GaussianMatrix {
    rows: usize,
    dim: usize,
    entries: Vec<f32>,
}

impl GaussianMatrix {
    /// Draws `rows × dim` N(0, 1) entries, row by row, from `rng`.
    pub(crate) fn draw(rows: usize, dim: usize, rng: &mut ChaCha20Rng) -> Result<Self, QjlError> {
        let len = rows
            .checked_mul(dim)
            .ok_or(QjlError::SketchTooLarge { dim })?;
        let mut entries = Vec::new();
        // A failed allocation becomes an error instead of aborting the process.
        entries
            .try_reserve_exact(len)
            .map_err(|_| QjlError::SketchTooLarge { dim })?;
        // Sampled in f64 and rounded once, so the f32 matrix is the f64 one to half an ulp.
        entries.extend((0..len).map(|_| rng.sample::<f64, _>(StandardNormal) as f32));
        Ok(Self { rows, dim, entries })
    }

    /// `out = S·y`; lengths are checked by the caller.
    pub(crate) fn project(&self, y: &[f32], out: &mut [f32]) {
        for (o, row) in out.iter_mut().zip(self.entries.chunks_exact(self.dim)) {
            *o = dot(row, y);
        }
    }

    /// `out = Sᵀ·z`; lengths are checked by the caller. Row-by-row axpy keeps the access
    /// pattern contiguous in the row-major storage.
    pub(crate) fn transpose_apply(&self, z: &[f32], out: &mut [f32]) {
        out.fill(0.0);
        for (&zi, row) in z.iter().zip(self.entries.chunks_exact(self.dim)) {
            for (o, &s) in out.iter_mut().zip(row) {
                *o += zi * s;
            }
        }
    }

    /// The matrix widened to f64, row-major (exactly the values `project` uses).
    pub(crate) fn to_dense_f64(&self) -> Vec<f64> {
        debug_assert_eq!(self.entries.len(), self.rows * self.dim);
        self.entries.iter().map(|&v| f64::from(v)).collect()
    }
}

/// Dot product with eight accumulators summed in a fixed order (vectorizable, deterministic).
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 8];
    let mut a_chunks = a.chunks_exact(8);
    let mut b_chunks = b.chunks_exact(8);
    for (ca, cb) in (&mut a_chunks).zip(&mut b_chunks) {
        for k in 0..8 {
            lanes[k] += ca[k] * cb[k];
        }
    }
    for (k, (&x, &y)) in a_chunks
        .remainder()
        .iter()
        .zip(b_chunks.remainder())
        .enumerate()
    {
        lanes[k] += x * y;
    }
    let quads = [
        lanes[0] + lanes[4],
        lanes[1] + lanes[5],
        lanes[2] + lanes[6],
        lanes[3] + lanes[7],
    ];
    (quads[0] + quads[2]) + (quads[1] + quads[3])
}
