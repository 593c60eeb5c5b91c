//! `turboquant.Rotation`.

use numpy::PyArrayDyn;
use pyo3::prelude::*;
use tq_rotation::{Rotation, RotationKind};

use crate::convert::{Input, error, output};

/// The rotation kind used in Python: `"haar"` or `"hadamard"`.
pub(crate) fn rotation_kind(name: &str) -> PyResult<RotationKind> {
    match name {
        "haar" => Ok(RotationKind::Haar),
        "hadamard" => Ok(RotationKind::Hadamard),
        other => Err(error(format!(
            "unknown rotation kind {other:?}: expected \"haar\" or \"hadamard\""
        ))),
    }
}

/// The Python name of a rotation kind.
pub(crate) fn kind_name(kind: RotationKind) -> &'static str {
    match kind {
        RotationKind::Haar => "haar",
        RotationKind::Hadamard => "hadamard",
    }
}

/// A seeded random orthogonal `dim × dim` matrix Π, a pure function of `(kind, dim, seed)`.
///
/// `Rotation(kind, dim, seed)` with `kind` `"haar"` (dense, uniformly distributed, O(d²) per
/// vector) or `"hadamard"` (randomized Walsh–Hadamard, O(d log d)).
#[pyclass(name = "Rotation", module = "turboquant", frozen)]
pub struct PyRotation {
    inner: Rotation,
}

impl PyRotation {
    /// Wraps a rotation built elsewhere (a codec's).
    pub(crate) fn wrap(inner: Rotation) -> Self {
        Self { inner }
    }

    fn run<'py>(
        &self,
        py: Python<'py>,
        x: &Bound<'py, PyAny>,
        inverse: bool,
    ) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
        let input = Input::<f32>::new(x, "x")?;
        let n = input.rows(self.inner.dim())?;
        input.require_finite(true)?;
        let xs = input.slice()?;
        let mut out = vec![0.0f32; xs.len()];
        let rotation = &self.inner;
        py.detach(|| {
            if inverse {
                rotation.apply_inverse_batch(xs, &mut out)
            } else {
                rotation.apply_batch(xs, &mut out)
            }
        })
        .map_err(error)?;
        output(py, out, &[n, self.inner.dim()])
    }
}

#[pymethods]
impl PyRotation {
    #[new]
    #[pyo3(signature = (kind, dim, seed))]
    fn new(py: Python<'_>, kind: &str, dim: usize, seed: u64) -> PyResult<Self> {
        let kind = rotation_kind(kind)?;
        let inner = py
            .detach(|| Rotation::new(kind, dim, seed))
            .map_err(error)?;
        Ok(Self { inner })
    }

    /// `"haar"` or `"hadamard"`.
    #[getter]
    fn kind(&self) -> &'static str {
        kind_name(self.inner.kind())
    }

    /// The dimension d.
    #[getter]
    fn dim(&self) -> usize {
        self.inner.dim()
    }

    /// The seed it was drawn from.
    #[getter]
    fn seed(&self) -> u64 {
        self.inner.seed()
    }

    /// `Π·x` for every row of a float32 `[n, dim]` array (finite values only).
    fn apply<'py>(
        &self,
        py: Python<'py>,
        x: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
        self.run(py, x, false)
    }

    /// `Πᵀ·x`, the exact inverse of `apply`, for every row of a float32 `[n, dim]` array.
    fn apply_inverse<'py>(
        &self,
        py: Python<'py>,
        x: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
        self.run(py, x, true)
    }

    /// Π as a dense row-major float64 `[dim, dim]` matrix (8·dim² bytes; for tests and
    /// moderate dimensions).
    fn to_dense<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArrayDyn<f64>>> {
        let d = self.inner.dim();
        if d > 8192 {
            return Err(error(format!(
                "to_dense: dimension {d} is too large for a dense matrix (at most 8192)"
            )));
        }
        let rotation = &self.inner;
        let dense = py.detach(|| rotation.to_dense_f64());
        output(py, dense, &[d, d])
    }

    fn __repr__(&self) -> String {
        format!(
            "Rotation(kind={:?}, dim={}, seed={})",
            self.kind(),
            self.dim(),
            self.seed()
        )
    }
}
