//! `turboquant.TqMse`, `turboquant.TqProd` and `turboquant.DebiasedMse`: batch encode,
//! decode and inner products over float32 `[n, d]` arrays.

use std::time::Instant;

use half::f16;
use numpy::PyArrayDyn;
use pyo3::IntoPyObjectExt;
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use tq_cache::codec::{DebiasedMse, MseSpec, ProdSpec, TqMse, TqProd};
use tq_lloyd_max::{CoordinateDistribution, LloydMaxCodebook};
use tq_qjl::QjlSpec;

use crate::batch::{self, ProdInputs, ProdOutputs};
use crate::codebook::PyLloydMaxCodebook;
use crate::convert::{Input, error, output};
use crate::qjl::{PyQjlSketch, sketch_kind, sketch_scale};
use crate::rotation::{PyRotation, kind_name, rotation_kind};

/// A tuple of numpy arrays.
fn tuple<'py>(py: Python<'py>, items: Vec<Bound<'py, PyAny>>) -> PyResult<Bound<'py, PyTuple>> {
    PyTuple::new(py, items)
}

/// Encodes `x` (`[n, d]`) with TQ_mse: `(words [n, w] uint32, norms [n] float16)`.
fn mse_encode<'py>(
    py: Python<'py>,
    codec: &TqMse,
    x: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyTuple>> {
    let input = Input::<f32>::new(x, "x")?;
    let n = input.rows(codec.dim())?;
    let xs = input.slice()?;
    let w = codec.words_per_vector();
    let mut words = vec![0u32; n * w];
    let mut norms = vec![f16::ZERO; n];
    py.detach(|| batch::mse_encode(codec, xs, &mut words, &mut norms))
        .map_err(error)?;
    tuple(
        py,
        vec![
            output(py, words, &[n, w])?.into_bound_py_any(py)?,
            output(py, norms, &[n])?.into_bound_py_any(py)?,
        ],
    )
}

/// The stored TQ_mse fields, shape-checked: `(words, norms, n)`.
fn mse_codes<'py>(
    codec: &TqMse,
    words: &Bound<'py, PyAny>,
    norms: &Bound<'py, PyAny>,
) -> PyResult<(Input<'py, u32>, Input<'py, f16>, usize)> {
    let norms = Input::<f16>::new(norms, "norms")?;
    let n = norms.vector(None)?;
    let words = Input::<u32>::new(words, "words")?;
    let w = codec.words_per_vector();
    words.expect_shape(&[Some(n), Some(w)], &format!("[{n}, {w}]"))?;
    Ok((words, norms, n))
}

fn mse_decode<'py>(
    py: Python<'py>,
    codec: &TqMse,
    words: &Bound<'py, PyAny>,
    norms: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
    let (words, norms, n) = mse_codes(codec, words, norms)?;
    let (ws, ns) = (words.slice()?, norms.slice()?);
    let d = codec.dim();
    let mut out = vec![0.0f32; n * d];
    py.detach(|| batch::mse_decode(codec, ws, ns, &mut out))
        .map_err(error)?;
    output(py, out, &[n, d])
}

fn mse_inner_products<'py>(
    py: Python<'py>,
    codec: &TqMse,
    debiased: Option<&DebiasedMse>,
    queries: &Bound<'py, PyAny>,
    words: &Bound<'py, PyAny>,
    norms: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
    let queries = Input::<f32>::new(queries, "queries")?;
    let m = queries.rows(codec.dim())?;
    queries.require_finite(true)?;
    let (words, norms, n) = mse_codes(codec, words, norms)?;
    let (qs, ws, ns) = (queries.slice()?, words.slice()?, norms.slice()?);
    let mut out = vec![0.0f32; m * n];
    py.detach(|| batch::mse_inner_products(codec, debiased, qs, ws, ns, &mut out))
        .map_err(error)?;
    output(py, out, &[m, n])
}

fn codebook_of(codec: &TqMse) -> PyResult<PyLloydMaxCodebook> {
    let spec = codec.spec();
    let inner = LloydMaxCodebook::cached(CoordinateDistribution::Beta { dim: spec.dim }, spec.bits)
        .map_err(error)?;
    Ok(PyLloydMaxCodebook { inner })
}

/// TurboQuant-MSE with `bits` bits per coordinate: rotate with a seeded Π, quantize every
/// coordinate of `Π·x/‖x‖` with the Lloyd-Max codebook of the exact law, pack the codes into
/// uint32 words, keep `‖x‖` as float16.
///
/// `TqMse(dim, bits, seed, rotation="hadamard", norm_correction=False)`, `bits` in 1..=8.
#[pyclass(name = "TqMse", module = "turboquant", frozen)]
pub struct PyTqMse {
    inner: TqMse,
}

#[pymethods]
impl PyTqMse {
    #[new]
    #[pyo3(signature = (dim, bits, seed, rotation = "hadamard", norm_correction = false))]
    fn new(
        py: Python<'_>,
        dim: usize,
        bits: u8,
        seed: u64,
        rotation: &str,
        norm_correction: bool,
    ) -> PyResult<Self> {
        let spec = MseSpec {
            dim,
            bits,
            rotation: rotation_kind(rotation)?,
            seed,
            norm_correction,
        };
        let inner = py.detach(|| TqMse::new(spec)).map_err(error)?;
        Ok(Self { inner })
    }

    /// The vector dimension d.
    #[getter]
    fn dim(&self) -> usize {
        self.inner.dim()
    }

    /// Bits per coordinate.
    #[getter]
    fn bits(&self) -> u8 {
        self.inner.spec().bits
    }

    /// The seed of Π.
    #[getter]
    fn seed(&self) -> u64 {
        self.inner.spec().seed
    }

    /// Whether `‖x‖/‖c[idx]‖` is stored instead of `‖x‖`.
    #[getter]
    fn norm_correction(&self) -> bool {
        self.inner.spec().norm_correction
    }

    /// The rotation Π.
    #[getter]
    fn rotation(&self) -> PyRotation {
        PyRotation::wrap(self.inner.rotation().clone())
    }

    /// The Lloyd-Max codebook every coordinate is quantized with.
    #[getter]
    fn codebook(&self) -> PyResult<PyLloydMaxCodebook> {
        codebook_of(&self.inner)
    }

    /// Packed uint32 words per vector.
    #[getter]
    fn words_per_vector(&self) -> usize {
        self.inner.words_per_vector()
    }

    /// Bytes stored per vector: the packed words plus the float16 norm.
    #[getter]
    fn bytes_per_vector(&self) -> usize {
        self.inner.bytes_per_vector()
    }

    /// Encodes every row of a float32 `[n, dim]` array: returns `(words, norms)`, uint32
    /// `[n, words_per_vector]` and float16 `[n]`. NaN / infinite inputs or norms beyond the
    /// float16 range raise `TurboQuantError` naming the row.
    fn encode<'py>(&self, py: Python<'py>, x: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyTuple>> {
        mse_encode(py, &self.inner, x)
    }

    /// Decodes `(words, norms)` back to float32 `[n, dim]`: `Πᵀ·(norm·c[idx])`.
    fn decode<'py>(
        &self,
        py: Python<'py>,
        words: &Bound<'py, PyAny>,
        norms: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
        mse_decode(py, &self.inner, words, norms)
    }

    /// `⟨q_i, x̃_j⟩` for every query row `q_i` (float32 `[m, dim]`) and stored vector `j`,
    /// scored on the codes without decoding: float32 `[m, n]`.
    fn inner_products<'py>(
        &self,
        py: Python<'py>,
        queries: &Bound<'py, PyAny>,
        words: &Bound<'py, PyAny>,
        norms: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
        mse_inner_products(py, &self.inner, None, queries, words, norms)
    }

    fn __repr__(&self) -> String {
        let spec = self.inner.spec();
        format!(
            "TqMse(dim={}, bits={}, seed={}, rotation={:?}, norm_correction={})",
            spec.dim,
            spec.bits,
            spec.seed,
            kind_name(spec.rotation),
            if spec.norm_correction {
                "True"
            } else {
                "False"
            }
        )
    }
}

/// TQ_mse codes read through the unbiased estimator `⟨q, x̃⟩ / (1 − D_mse(b))`.
///
/// `DebiasedMse(dim, bits, seed, rotation="hadamard")`: encode and decode are TQ_mse's;
/// `inner_products` divides by `1 − D_mse(bits)` (the `correction` factor).
#[pyclass(name = "DebiasedMse", module = "turboquant", frozen)]
pub struct PyDebiasedMse {
    inner: DebiasedMse,
}

#[pymethods]
impl PyDebiasedMse {
    #[new]
    #[pyo3(signature = (dim, bits, seed, rotation = "hadamard"))]
    fn new(py: Python<'_>, dim: usize, bits: u8, seed: u64, rotation: &str) -> PyResult<Self> {
        let spec = MseSpec {
            dim,
            bits,
            rotation: rotation_kind(rotation)?,
            seed,
            norm_correction: false,
        };
        let inner = py.detach(|| DebiasedMse::new(spec)).map_err(error)?;
        Ok(Self { inner })
    }

    /// The vector dimension d.
    #[getter]
    fn dim(&self) -> usize {
        self.inner.codec().dim()
    }

    /// Bits per coordinate.
    #[getter]
    fn bits(&self) -> u8 {
        self.inner.codec().spec().bits
    }

    /// The seed of Π.
    #[getter]
    fn seed(&self) -> u64 {
        self.inner.codec().spec().seed
    }

    /// The factor `1 / (1 − D_mse(bits))` applied to every inner product.
    #[getter]
    fn correction(&self) -> f32 {
        self.inner.correction()
    }

    /// The underlying TQ_mse codec.
    #[getter]
    fn codec(&self) -> PyTqMse {
        PyTqMse {
            inner: self.inner.codec().clone(),
        }
    }

    /// Packed uint32 words per vector.
    #[getter]
    fn words_per_vector(&self) -> usize {
        self.inner.codec().words_per_vector()
    }

    /// Bytes stored per vector: the packed words plus the float16 norm.
    #[getter]
    fn bytes_per_vector(&self) -> usize {
        self.inner.codec().bytes_per_vector()
    }

    /// TQ_mse encode of every row: `(words, norms)` (see `TqMse.encode`).
    fn encode<'py>(&self, py: Python<'py>, x: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyTuple>> {
        mse_encode(py, self.inner.codec(), x)
    }

    /// TQ_mse decode (see `TqMse.decode`; the reconstruction is not rescaled).
    fn decode<'py>(
        &self,
        py: Python<'py>,
        words: &Bound<'py, PyAny>,
        norms: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
        mse_decode(py, self.inner.codec(), words, norms)
    }

    /// Unbiased `⟨q_i, x_j⟩` estimates, float32 `[m, n]`: the TQ_mse inner products times
    /// `correction`.
    fn inner_products<'py>(
        &self,
        py: Python<'py>,
        queries: &Bound<'py, PyAny>,
        words: &Bound<'py, PyAny>,
        norms: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
        mse_inner_products(
            py,
            self.inner.codec(),
            Some(&self.inner),
            queries,
            words,
            norms,
        )
    }

    fn __repr__(&self) -> String {
        let spec = self.inner.codec().spec();
        format!(
            "DebiasedMse(dim={}, bits={}, seed={}, rotation={:?})",
            spec.dim,
            spec.bits,
            spec.seed,
            kind_name(spec.rotation)
        )
    }
}

/// TurboQuant-prod with `bits` bits per coordinate: TQ_mse(bits − 1) plus a 1-bit QJL sketch
/// of the residual, for unbiased inner products.
///
/// `TqProd(dim, bits, seed, sketch="haar", rotation="hadamard", norm_correction=False,
/// scale=None, shrinkage=1.0)`, `bits` in 2..=9. The sketch's seed is derived from `seed` as
/// in the Rust `ProdSpec::orthogonal` / `ProdSpec::paper` (`sketch="gaussian"` is the paper's
/// construction).
#[pyclass(name = "TqProd", module = "turboquant", frozen)]
pub struct PyTqProd {
    inner: TqProd,
}

impl PyTqProd {
    fn codes<'py>(
        &self,
        words: &Bound<'py, PyAny>,
        norms: &Bound<'py, PyAny>,
        signs: &Bound<'py, PyAny>,
        gammas: &Bound<'py, PyAny>,
    ) -> PyResult<(ProdArrays<'py>, usize)> {
        let norms = Input::<f16>::new(norms, "norms")?;
        let n = norms.vector(None)?;
        let words = Input::<u32>::new(words, "words")?;
        let w = self.inner.mse().words_per_vector();
        words.expect_shape(&[Some(n), Some(w)], &format!("[{n}, {w}]"))?;
        let signs = Input::<u32>::new(signs, "signs")?;
        let s = self.inner.sign_words_per_vector();
        signs.expect_shape(&[Some(n), Some(s)], &format!("[{n}, {s}]"))?;
        let gammas = Input::<f16>::new(gammas, "gammas")?;
        gammas.vector(Some(n))?;
        Ok((
            ProdArrays {
                words,
                norms,
                signs,
                gammas,
            },
            n,
        ))
    }
}

/// The four borrowed arrays of stored TQ_prod codes.
struct ProdArrays<'py> {
    words: Input<'py, u32>,
    norms: Input<'py, f16>,
    signs: Input<'py, u32>,
    gammas: Input<'py, f16>,
}

impl ProdArrays<'_> {
    fn slices(&self) -> PyResult<ProdInputs<'_>> {
        Ok(ProdInputs {
            words: self.words.slice()?,
            norms: self.norms.slice()?,
            signs: self.signs.slice()?,
            gammas: self.gammas.slice()?,
        })
    }
}

#[pymethods]
impl PyTqProd {
    #[new]
    #[pyo3(signature = (
        dim, bits, seed, sketch = "haar", rotation = "hadamard", norm_correction = false,
        scale = None, shrinkage = 1.0
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        dim: usize,
        bits: u8,
        seed: u64,
        sketch: &str,
        rotation: &str,
        norm_correction: bool,
        scale: Option<&str>,
        shrinkage: f32,
    ) -> PyResult<Self> {
        let mut spec = ProdSpec::orthogonal(dim, bits, seed);
        spec.sketch = QjlSpec::new(sketch_kind(sketch)?, dim, spec.sketch.seed);
        if let Some(scale) = scale {
            spec = spec.scale(sketch_scale(scale)?);
        }
        spec = spec.shrinkage(shrinkage);
        spec.rotation = rotation_kind(rotation)?;
        spec.norm_correction = norm_correction;
        let inner = py.detach(|| TqProd::new(spec)).map_err(error)?;
        Ok(Self { inner })
    }

    /// The vector dimension d.
    #[getter]
    fn dim(&self) -> usize {
        self.inner.spec().dim
    }

    /// Total bits per coordinate (`bits − 1` MSE + 1 QJL).
    #[getter]
    fn bits(&self) -> u8 {
        self.inner.spec().bits
    }

    /// The seed of Π.
    #[getter]
    fn seed(&self) -> u64 {
        self.inner.spec().seed
    }

    /// The TQ_mse(bits − 1) stage.
    #[getter]
    fn mse(&self) -> PyTqMse {
        PyTqMse {
            inner: self.inner.mse().clone(),
        }
    }

    /// The QJL sketch of the residual.
    #[getter]
    fn sketch(&self) -> PyQjlSketch {
        PyQjlSketch::wrap(self.inner.sketch().clone())
    }

    /// Packed uint32 MSE words per vector.
    #[getter]
    fn words_per_vector(&self) -> usize {
        self.inner.mse().words_per_vector()
    }

    /// Packed uint32 sign words per vector.
    #[getter]
    fn sign_words_per_vector(&self) -> usize {
        self.inner.sign_words_per_vector()
    }

    /// Bytes stored per vector: MSE words, float16 norm, sign words, float16 γ.
    #[getter]
    fn bytes_per_vector(&self) -> usize {
        self.inner.bytes_per_vector()
    }

    /// Encodes every row of a float32 `[n, dim]` array: returns `(words, norms, signs,
    /// gammas)`: uint32 `[n, words_per_vector]`, float16 `[n]`, uint32
    /// `[n, sign_words_per_vector]`, float16 `[n]`.
    fn encode<'py>(&self, py: Python<'py>, x: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyTuple>> {
        let input = Input::<f32>::new(x, "x")?;
        let n = input.rows(self.dim())?;
        let xs = input.slice()?;
        let (w, s) = (self.words_per_vector(), self.sign_words_per_vector());
        let mut words = vec![0u32; n * w];
        let mut norms = vec![f16::ZERO; n];
        let mut signs = vec![0u32; n * s];
        let mut gammas = vec![f16::ZERO; n];
        let codec = &self.inner;
        py.detach(|| {
            batch::prod_encode(
                codec,
                xs,
                ProdOutputs {
                    words: &mut words,
                    norms: &mut norms,
                    signs: &mut signs,
                    gammas: &mut gammas,
                },
            )
        })
        .map_err(error)?;
        tuple(
            py,
            vec![
                output(py, words, &[n, w])?.into_bound_py_any(py)?,
                output(py, norms, &[n])?.into_bound_py_any(py)?,
                output(py, signs, &[n, s])?.into_bound_py_any(py)?,
                output(py, gammas, &[n])?.into_bound_py_any(py)?,
            ],
        )
    }

    /// Decodes `(words, norms, signs, gammas)` to float32 `[n, dim]`:
    /// `Πᵀ·(norm·c[idx] + α·γ·s·Sᵀz)`.
    fn decode<'py>(
        &self,
        py: Python<'py>,
        words: &Bound<'py, PyAny>,
        norms: &Bound<'py, PyAny>,
        signs: &Bound<'py, PyAny>,
        gammas: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
        let (arrays, n) = self.codes(words, norms, signs, gammas)?;
        let codes = arrays.slices()?;
        let d = self.dim();
        let mut out = vec![0.0f32; n * d];
        let codec = &self.inner;
        py.detach(|| batch::prod_decode(codec, codes, &mut out))
            .map_err(error)?;
        output(py, out, &[n, d])
    }

    /// Unbiased `⟨q_i, x_j⟩` estimates for every query row (float32 `[m, dim]`) and stored
    /// vector `j`, scored on the codes: float32 `[m, n]`.
    fn inner_products<'py>(
        &self,
        py: Python<'py>,
        queries: &Bound<'py, PyAny>,
        words: &Bound<'py, PyAny>,
        norms: &Bound<'py, PyAny>,
        signs: &Bound<'py, PyAny>,
        gammas: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
        let queries = Input::<f32>::new(queries, "queries")?;
        let m = queries.rows(self.dim())?;
        queries.require_finite(true)?;
        let (arrays, n) = self.codes(words, norms, signs, gammas)?;
        let codes = arrays.slices()?;
        let qs = queries.slice()?;
        let mut out = vec![0.0f32; m * n];
        let codec = &self.inner;
        py.detach(|| batch::prod_inner_products(codec, qs, codes, &mut out))
            .map_err(error)?;
        output(py, out, &[m, n])
    }

    fn __repr__(&self) -> String {
        let spec = self.inner.spec();
        format!(
            "TqProd(dim={}, bits={}, seed={}, sketch={:?}, rotation={:?})",
            spec.dim,
            spec.bits,
            spec.seed,
            format!("{:?}", spec.sketch.kind).to_lowercase(),
            kind_name(spec.rotation)
        )
    }
}

/// Times `TqMse.encode`'s Rust side alone on `x` (float32 `[n, dim]`): `repeats` runs of the
/// same batch loop the binding calls, on preallocated outputs, with no Python conversion or
/// allocation in the timed region. Returns the best run's seconds per batch; with
/// `sequential=True`, the plain single-threaded Rust-API loop (`encode_into` per row).
#[pyfunction]
#[pyo3(signature = (codec, x, repeats = 5, sequential = false))]
pub fn _bench_rust_encode(
    py: Python<'_>,
    codec: &PyTqMse,
    x: &Bound<'_, PyAny>,
    repeats: usize,
    sequential: bool,
) -> PyResult<f64> {
    let codec = &codec.inner;
    let input = Input::<f32>::new(x, "x")?;
    let n = input.rows(codec.dim())?;
    let xs = input.slice()?;
    let mut words = vec![0u32; n * codec.words_per_vector()];
    let mut norms = vec![f16::ZERO; n];
    py.detach(|| {
        let mut best = f64::INFINITY;
        for _ in 0..repeats.max(1) {
            let start = Instant::now();
            if sequential {
                batch::mse_encode_sequential(codec, xs, &mut words, &mut norms)?;
            } else {
                batch::mse_encode(codec, xs, &mut words, &mut norms)?;
            }
            best = best.min(start.elapsed().as_secs_f64());
        }
        Ok(best)
    })
    .map_err(|e: batch::BatchError| error(e))
}
