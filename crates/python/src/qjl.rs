//! `turboquant.QjlSketch`.

use numpy::PyArrayDyn;
use pyo3::IntoPyObjectExt;
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use tq_qjl::{QjlSketch, QjlSpec, SketchKind, SketchScale};

use crate::batch;
use crate::convert::{Input, error, output};

/// The sketch kind used in Python: `"gaussian"`, `"haar"` or `"hadamard"`.
pub(crate) fn sketch_kind(name: &str) -> PyResult<SketchKind> {
    match name {
        "gaussian" => Ok(SketchKind::Gaussian),
        "haar" => Ok(SketchKind::Haar),
        "hadamard" => Ok(SketchKind::Hadamard),
        other => Err(error(format!(
            "unknown sketch kind {other:?}: expected \"gaussian\", \"haar\" or \"hadamard\""
        ))),
    }
}

/// The sketch scale used in Python: `"paper"`, `"asymptotic"` or `"exact"`.
pub(crate) fn sketch_scale(name: &str) -> PyResult<SketchScale> {
    match name {
        "paper" => Ok(SketchScale::Paper),
        "asymptotic" => Ok(SketchScale::Asymptotic),
        "exact" => Ok(SketchScale::Exact),
        other => Err(error(format!(
            "unknown sketch scale {other:?}: expected \"paper\", \"asymptotic\" or \"exact\""
        ))),
    }
}

fn kind_name(kind: SketchKind) -> &'static str {
    match kind {
        SketchKind::Gaussian => "gaussian",
        SketchKind::Haar => "haar",
        SketchKind::Hadamard => "hadamard",
    }
}

fn scale_name(scale: SketchScale) -> &'static str {
    match scale {
        SketchScale::Paper => "paper",
        SketchScale::Asymptotic => "asymptotic",
        SketchScale::Exact => "exact",
    }
}

/// A 1-bit Quantized Johnson–Lindenstrauss sketch: `z = sign(S·r)` packed into uint32 words,
/// plus `γ = ‖r‖`, with unbiased inner-product estimates `α·γ·s·⟨S·y, z⟩`.
///
/// `QjlSketch(kind, dim, seed, scale=None, shrinkage=1.0)`: `kind` is `"gaussian"`, `"haar"`
/// or `"hadamard"`; `scale` defaults to the unbiased one (`"paper"` for Gaussian, `"exact"`
/// otherwise); `shrinkage` is α (finite, > 0).
#[pyclass(name = "QjlSketch", module = "turboquant", frozen)]
pub struct PyQjlSketch {
    inner: QjlSketch,
}

impl PyQjlSketch {
    /// Wraps a sketch built elsewhere (a codec's).
    pub(crate) fn wrap(inner: QjlSketch) -> Self {
        Self { inner }
    }
}

#[pymethods]
impl PyQjlSketch {
    #[new]
    #[pyo3(signature = (kind, dim, seed, scale = None, shrinkage = 1.0))]
    fn new(
        py: Python<'_>,
        kind: &str,
        dim: usize,
        seed: u64,
        scale: Option<&str>,
        shrinkage: f32,
    ) -> PyResult<Self> {
        let mut spec = QjlSpec::new(sketch_kind(kind)?, dim, seed).with_shrinkage(shrinkage);
        if let Some(scale) = scale {
            spec = spec.with_scale(sketch_scale(scale)?);
        }
        let inner = py.detach(|| spec.build()).map_err(error)?;
        Ok(Self { inner })
    }

    /// `"gaussian"`, `"haar"` or `"hadamard"`.
    #[getter]
    fn kind(&self) -> &'static str {
        kind_name(self.inner.spec().kind)
    }

    /// `"paper"`, `"asymptotic"` or `"exact"`.
    #[getter]
    fn scale(&self) -> &'static str {
        scale_name(self.inner.spec().scale)
    }

    /// The vector dimension d (also the number of sketch rows).
    #[getter]
    fn dim(&self) -> usize {
        self.inner.dim()
    }

    /// The seed of the sketch matrix.
    #[getter]
    fn seed(&self) -> u64 {
        self.inner.spec().seed
    }

    /// The shrinkage α.
    #[getter]
    fn shrinkage(&self) -> f32 {
        self.inner.spec().shrinkage
    }

    /// uint32 words per packed sketch, `ceil(dim / 32)`.
    #[getter]
    fn words(&self) -> usize {
        self.inner.words()
    }

    /// The scale `s` (before shrinkage).
    #[getter]
    fn scale_factor(&self) -> f64 {
        self.inner.scale_factor()
    }

    /// `α·s`, the factor that turns `γ·Sᵀz` into `r̂`.
    #[getter]
    fn gain(&self) -> f64 {
        self.inner.gain()
    }

    /// The exact mean gain `E⟨y, r̂⟩ / ⟨y, r⟩` over the draw of S (None for Hadamard).
    #[getter]
    fn bias_factor(&self) -> Option<f64> {
        self.inner.bias_factor()
    }

    /// The MSE-optimal shrinkage α* for this family and scale (None for Hadamard).
    #[getter]
    fn mmse_shrinkage(&self) -> Option<f64> {
        self.inner.mmse_shrinkage()
    }

    /// Sketches every row of a float32 `[n, dim]` array: returns `(bits, gamma)`, uint32
    /// `[n, words]` (bit i of a sketch is bit i % 32 of word i // 32, 1 meaning `(S·r)_i ≥ 0`)
    /// and float32 `[n]` norms.
    fn encode<'py>(&self, py: Python<'py>, r: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyTuple>> {
        let input = Input::<f32>::new(r, "r")?;
        let n = input.rows(self.inner.dim())?;
        let rs = input.slice()?;
        let w = self.inner.words();
        let mut bits = vec![0u32; n * w];
        let mut gammas = vec![0.0f32; n];
        let sketch = &self.inner;
        py.detach(|| batch::qjl_encode(sketch, rs, &mut bits, &mut gammas))
            .map_err(error)?;
        let bits = output(py, bits, &[n, w])?.into_bound_py_any(py)?;
        let gammas = output(py, gammas, &[n])?.into_bound_py_any(py)?;
        PyTuple::new(py, [bits, gammas])
    }

    /// `S·y` for every row of a float32 `[n, dim]` array (the query side, never quantized).
    fn project<'py>(
        &self,
        py: Python<'py>,
        y: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
        let input = Input::<f32>::new(y, "y")?;
        let n = input.rows(self.inner.dim())?;
        let ys = input.slice()?;
        let m = self.inner.rows();
        let mut out = vec![0.0f32; n * m];
        let sketch = &self.inner;
        py.detach(|| batch::qjl_project(sketch, ys, &mut out))
            .map_err(error)?;
        output(py, out, &[n, m])
    }

    /// Row-wise estimates `α·γ_i·s·⟨S·y_i, z_i⟩` from projected queries `[n, dim]`
    /// (`project`), bits `[n, words]` and gamma `[n]`: float32 `[n]`.
    fn estimate_inner_products<'py>(
        &self,
        py: Python<'py>,
        projected: &Bound<'py, PyAny>,
        bits: &Bound<'py, PyAny>,
        gamma: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
        let projected = Input::<f32>::new(projected, "projected")?;
        let n = projected.rows(self.inner.rows())?;
        let bits = Input::<u32>::new(bits, "bits")?;
        bits.expect_shape(
            &[Some(n), Some(self.inner.words())],
            &format!("[{n}, {}]", self.inner.words()),
        )?;
        let gamma = Input::<f32>::new(gamma, "gamma")?;
        gamma.vector(Some(n))?;
        projected.require_finite(true)?;
        let (p, b, g) = (projected.slice()?, bits.slice()?, gamma.slice()?);
        let mut out = vec![0.0f32; n];
        let sketch = &self.inner;
        py.detach(|| batch::qjl_estimate(sketch, p, b, g, &mut out))
            .map_err(error)?;
        output(py, out, &[n])
    }

    /// `r̂ = α·γ·s·Sᵀz` for every row, from bits `[n, words]` and gamma `[n]`: float32
    /// `[n, dim]`.
    fn reconstruct<'py>(
        &self,
        py: Python<'py>,
        bits: &Bound<'py, PyAny>,
        gamma: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
        let gamma = Input::<f32>::new(gamma, "gamma")?;
        let n = gamma.vector(None)?;
        let bits = Input::<u32>::new(bits, "bits")?;
        bits.expect_shape(
            &[Some(n), Some(self.inner.words())],
            &format!("[{n}, {}]", self.inner.words()),
        )?;
        let (b, g) = (bits.slice()?, gamma.slice()?);
        let d = self.inner.dim();
        let mut out = vec![0.0f32; n * d];
        let sketch = &self.inner;
        py.detach(|| batch::qjl_reconstruct(sketch, b, g, &mut out))
            .map_err(error)?;
        output(py, out, &[n, d])
    }

    fn __repr__(&self) -> String {
        format!(
            "QjlSketch(kind={:?}, dim={}, seed={}, scale={:?}, shrinkage={})",
            self.kind(),
            self.dim(),
            self.seed(),
            self.scale(),
            self.shrinkage()
        )
    }
}
