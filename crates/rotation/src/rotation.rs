//! [`Rotation`]: the public face of both kinds, with length checks and rayon batches.

use rayon::prelude::*;

use crate::haar::HaarMatrix;
use crate::hadamard::RandomizedHadamard;
use crate::{RotationError, RotationKind, RotationSpec};

/// Floating-point work a rayon task should get at least: below this, scheduling a task
/// costs more than the vectors in it.
const TASK_FLOPS: usize = 1 << 16;

#[derive(Clone, Debug)]
enum Map {
    Haar(HaarMatrix),
    Hadamard(RandomizedHadamard),
}

/// A seeded random orthogonal d×d matrix Π; a pure function of `(kind, dim, seed)`.
///
/// `apply` computes Π·x and `apply_inverse` computes Πᵀ·x, its exact inverse, in f32 without
/// allocating; the batch forms run the same per-vector code over rayon, so their results are
/// bit-identical to per-vector calls whatever the thread count.
///
/// ```
/// use tq_rotation::{Rotation, RotationKind};
///
/// let rotation = Rotation::new(RotationKind::Hadamard, 6, 7)?;
/// let x = [3.0f32, 0.0, 4.0, 0.0, 0.0, 0.0];
/// let mut y = [0.0f32; 6];
/// rotation.apply(&x, &mut y)?;
/// let norm = y.iter().map(|v| v * v).sum::<f32>().sqrt();
/// assert!((norm - 5.0).abs() < 1e-5);
///
/// let mut back = [0.0f32; 6];
/// rotation.apply_inverse(&y, &mut back)?;
/// assert!(x.iter().zip(&back).all(|(a, b)| (a - b).abs() < 1e-5));
/// # Ok::<(), tq_rotation::RotationError>(())
/// ```
#[derive(Clone, Debug)]
pub struct Rotation {
    spec: RotationSpec,
    map: Map,
}

impl Rotation {
    /// Draws the rotation of kind `kind` and dimension `dim` from `seed`.
    ///
    /// # Errors
    /// [`RotationError::ZeroDimension`] if `dim` is 0, [`RotationError::DimensionTooLarge`]
    /// if it exceeds [`RotationKind::max_dim`].
    pub fn new(kind: RotationKind, dim: usize, seed: u64) -> Result<Self, RotationError> {
        if dim == 0 {
            return Err(RotationError::ZeroDimension);
        }
        if dim > kind.max_dim() {
            return Err(RotationError::DimensionTooLarge {
                kind,
                dim,
                max: kind.max_dim(),
            });
        }
        let map = match kind {
            RotationKind::Haar => Map::Haar(HaarMatrix::new(dim, seed)),
            RotationKind::Hadamard => Map::Hadamard(RandomizedHadamard::new(dim, seed)),
        };
        Ok(Rotation {
            spec: RotationSpec { kind, dim, seed },
            map,
        })
    }

    /// The family this rotation was drawn from.
    pub fn kind(&self) -> RotationKind {
        self.spec.kind
    }

    /// The dimension d.
    pub fn dim(&self) -> usize {
        self.spec.dim
    }

    /// The seed it was drawn from.
    pub fn seed(&self) -> u64 {
        self.spec.seed
    }

    /// The recipe that rebuilds this exact rotation.
    pub fn spec(&self) -> RotationSpec {
        self.spec
    }

    fn check(&self, input: &[f32], output: &[f32]) -> Result<(), RotationError> {
        for actual in [input.len(), output.len()] {
            if actual != self.dim() {
                return Err(RotationError::DimensionMismatch {
                    expected: self.dim(),
                    actual,
                });
            }
        }
        Ok(())
    }

    /// `output = Π·input`, without allocating.
    ///
    /// # Errors
    /// [`RotationError::DimensionMismatch`] if either slice's length is not `dim`.
    pub fn apply(&self, input: &[f32], output: &mut [f32]) -> Result<(), RotationError> {
        self.check(input, output)?;
        self.forward_unchecked(input, output);
        Ok(())
    }

    /// `output = Πᵀ·input`, the exact inverse of [`apply`](Self::apply), without allocating.
    ///
    /// # Errors
    /// [`RotationError::DimensionMismatch`] if either slice's length is not `dim`.
    pub fn apply_inverse(&self, input: &[f32], output: &mut [f32]) -> Result<(), RotationError> {
        self.check(input, output)?;
        self.inverse_unchecked(input, output);
        Ok(())
    }

    /// [`apply`](Self::apply) to each row of `inputs`, a row-major (n, dim) batch, into the
    /// same rows of `outputs`, in parallel over vectors.
    ///
    /// # Errors
    /// [`RotationError::BatchLength`] if `inputs.len()` is not a multiple of `dim`;
    /// [`RotationError::DimensionMismatch`] (expected `inputs.len()`) if `outputs` differs.
    pub fn apply_batch(&self, inputs: &[f32], outputs: &mut [f32]) -> Result<(), RotationError> {
        self.batch(inputs, outputs, Self::forward_unchecked)
    }

    /// [`apply_inverse`](Self::apply_inverse) to each row of a row-major (n, dim) batch.
    ///
    /// # Errors
    /// As for [`apply_batch`](Self::apply_batch).
    pub fn apply_inverse_batch(
        &self,
        inputs: &[f32],
        outputs: &mut [f32],
    ) -> Result<(), RotationError> {
        self.batch(inputs, outputs, Self::inverse_unchecked)
    }

    /// Π as a dense row-major f64 matrix (`dim²` entries; entry `(i, j)` at `i·dim + j`).
    ///
    /// Haar rotations return the matrix they were drawn as; Hadamard rotations apply their
    /// factors in f64 to each basis vector, O(d² log d). This allocates `8·dim²` bytes, so it
    /// is meant for tests and moderate dimensions, not for a 2²⁴-dimensional Hadamard.
    pub fn to_dense_f64(&self) -> Vec<f64> {
        match &self.map {
            Map::Haar(haar) => haar.to_dense_f64(),
            Map::Hadamard(hadamard) => hadamard.to_dense_f64(),
        }
    }

    fn forward_unchecked(&self, input: &[f32], output: &mut [f32]) {
        match &self.map {
            Map::Haar(haar) => haar.apply(input, output),
            Map::Hadamard(hadamard) => hadamard.apply(input, output),
        }
    }

    fn inverse_unchecked(&self, input: &[f32], output: &mut [f32]) {
        match &self.map {
            Map::Haar(haar) => haar.apply_inverse(input, output),
            Map::Hadamard(hadamard) => hadamard.apply_inverse(input, output),
        }
    }

    fn batch(
        &self,
        inputs: &[f32],
        outputs: &mut [f32],
        each: fn(&Self, &[f32], &mut [f32]),
    ) -> Result<(), RotationError> {
        let dim = self.dim();
        if !inputs.len().is_multiple_of(dim) {
            return Err(RotationError::BatchLength {
                len: inputs.len(),
                dim,
            });
        }
        if outputs.len() != inputs.len() {
            return Err(RotationError::DimensionMismatch {
                expected: inputs.len(),
                actual: outputs.len(),
            });
        }
        let cost = match &self.map {
            Map::Haar(haar) => haar.cost(),
            Map::Hadamard(hadamard) => hadamard.cost(),
        };
        // Tasks only group whole vectors, and each vector runs the same sequential code, so
        // the grouping (and the thread count) cannot change a bit of the result.
        let task = dim * (TASK_FLOPS / cost).max(1);
        inputs
            .par_chunks(task)
            .zip(outputs.par_chunks_mut(task))
            .for_each(|(xs, ys)| {
                for (x, y) in xs.chunks_exact(dim).zip(ys.chunks_exact_mut(dim)) {
                    each(self, x, y);
                }
            });
        Ok(())
    }
}
