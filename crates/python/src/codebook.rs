//! `turboquant.LloydMaxCodebook`.

use std::sync::Arc;

use numpy::PyArrayDyn;
use pyo3::prelude::*;
use tq_lloyd_max::{CoordinateDistribution, LloydMaxCodebook};

use crate::batch;
use crate::convert::{Input, error, output};

/// The law name used in Python: `"beta"` (exact) or `"gaussian"` (limit).
pub(crate) fn law(name: &str, dim: usize) -> PyResult<CoordinateDistribution> {
    match name {
        "beta" => Ok(CoordinateDistribution::Beta { dim }),
        "gaussian" => Ok(CoordinateDistribution::Gaussian { dim }),
        other => Err(error(format!(
            "unknown law {other:?}: expected \"beta\" or \"gaussian\""
        ))),
    }
}

/// An MSE-optimal scalar quantizer for one coordinate of a randomly rotated unit vector.
///
/// `LloydMaxCodebook(dim, bits, law="beta")` solves (or fetches from the process-wide cache) the
/// `bits`-bit Lloyd-Max quantizer of the exact rotated-coordinate law `(1−t²)^((dim−3)/2)`
/// (`law="beta"`, `dim >= 3`) or its Gaussian limit `N(0, 1/dim)` (`law="gaussian"`), for
/// `bits` in 1..=8.
#[pyclass(name = "LloydMaxCodebook", module = "turboquant", frozen)]
pub struct PyLloydMaxCodebook {
    pub(crate) inner: Arc<LloydMaxCodebook>,
}

#[pymethods]
impl PyLloydMaxCodebook {
    #[new]
    #[pyo3(signature = (dim, bits, law = "beta"))]
    fn new(py: Python<'_>, dim: usize, bits: u8, law: &str) -> PyResult<Self> {
        let distribution = self::law(law, dim)?;
        let inner = py
            .detach(|| LloydMaxCodebook::cached(distribution, bits))
            .map_err(error)?;
        Ok(Self { inner })
    }

    /// The dimension of the rotated vectors the law is for.
    #[getter]
    fn dim(&self) -> usize {
        self.inner.distribution().dim()
    }

    /// Bits per coordinate.
    #[getter]
    fn bits(&self) -> u8 {
        self.inner.bits()
    }

    /// `"beta"` or `"gaussian"`.
    #[getter]
    fn law(&self) -> &'static str {
        match self.inner.distribution() {
            CoordinateDistribution::Beta { .. } => "beta",
            CoordinateDistribution::Gaussian { .. } => "gaussian",
        }
    }

    /// Number of centroids, `2**bits`.
    #[getter]
    fn levels(&self) -> usize {
        self.inner.levels()
    }

    /// The `2**bits` centroids (float64), strictly increasing and symmetric about 0.
    #[getter]
    fn centroids<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArrayDyn<f64>>> {
        let c = self.inner.centroids().to_vec();
        let n = c.len();
        output(py, c, &[n])
    }

    /// The `2**bits − 1` interior thresholds (float64), midpoints of adjacent centroids.
    #[getter]
    fn thresholds<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArrayDyn<f64>>> {
        let t = self.inner.thresholds().to_vec();
        let n = t.len();
        output(py, t, &[n])
    }

    /// The centroids rounded to float32: what `dequantize` returns.
    #[getter]
    fn centroids_f32<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
        let c = self.inner.centroids_f32().to_vec();
        let n = c.len();
        output(py, c, &[n])
    }

    /// The thresholds rounded down to float32: `x > thresholds_f32[k]` exactly when
    /// `float(x) > thresholds[k]`, so `searchsorted(thresholds_f32, x, side="left")` is the code.
    #[getter]
    fn thresholds_f32<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
        let t = self.inner.thresholds_f32().to_vec();
        let n = t.len();
        output(py, t, &[n])
    }

    /// `C = E[(X − Q(X))²]` per coordinate under the law.
    #[getter]
    fn mse_per_coordinate(&self) -> f64 {
        self.inner.mse_per_coordinate()
    }

    /// `D_mse = dim · C`: the expected squared error of a whole unit vector.
    #[getter]
    fn unit_vector_distortion(&self) -> f64 {
        self.inner.unit_vector_distortion()
    }

    /// Codes (uint8, same shape as `x`) of every element of a float32 array: the index of the
    /// nearest centroid. NaN is an error; ±inf map to the outermost codes.
    fn quantize<'py>(
        &self,
        py: Python<'py>,
        x: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArrayDyn<u8>>> {
        let input = Input::<f32>::new(x, "x")?;
        input.require_finite(false)?;
        let xs = input.slice()?;
        let mut codes = vec![0u8; xs.len()];
        let book = &*self.inner;
        py.detach(|| batch::quantize(book, xs, &mut codes))
            .map_err(error)?;
        output(py, codes, input.shape())
    }

    /// The float32 centroid of every code (uint8 array of any shape); codes must be `< levels`.
    fn dequantize<'py>(
        &self,
        py: Python<'py>,
        codes: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
        let input = Input::<u8>::new(codes, "codes")?;
        let data = input.slice()?;
        let levels = self.inner.levels();
        if let Some(i) = data.iter().position(|&c| usize::from(c) >= levels) {
            return Err(error(format!(
                "codes: element {i} ({}) is not below {levels} levels",
                data[i]
            )));
        }
        let values: Vec<f32> = data.iter().map(|&c| self.inner.dequantize(c)).collect();
        output(py, values, input.shape())
    }

    fn __repr__(&self) -> String {
        format!(
            "LloydMaxCodebook(dim={}, bits={}, law={:?})",
            self.dim(),
            self.bits(),
            self.law()
        )
    }
}
