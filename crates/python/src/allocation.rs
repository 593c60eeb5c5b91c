//! `turboquant.Allocation`: bit allocations as TOML data.

use std::path::PathBuf;

use pyo3::prelude::*;
use tq_cache::allocation::{Allocation, ModelShape, StreamKind};

use crate::convert::error;

/// `"key"`, `"value"` as a stream kind.
pub(crate) fn stream_kind(name: &str) -> PyResult<StreamKind> {
    match name {
        "key" => Ok(StreamKind::Key),
        "value" => Ok(StreamKind::Value),
        other => Err(error(format!(
            "unknown stream {other:?}: expected \"key\" or \"value\""
        ))),
    }
}

/// Which codec, bits and random objects every key and value stream of a model uses, read
/// from a TOML file (schema: `crates/cache/src/allocation/mod.rs`, presets in
/// `crates/cache/presets/`).
///
/// Build one with `Allocation.from_toml(text_or_path)`, `Allocation.preset(name)` or
/// `Allocation.load(name_or_path)`.
#[pyclass(name = "Allocation", module = "turboquant", frozen)]
pub struct PyAllocation {
    pub(crate) inner: Allocation,
}

#[pymethods]
impl PyAllocation {
    /// Parses an allocation from TOML text, or reads it from a file when given an
    /// `os.PathLike` or a one-line string that names an existing file or holds no `=` (TOML
    /// text always has one). Errors name the field path and the reason.
    #[staticmethod]
    fn from_toml(source: &Bound<'_, PyAny>) -> PyResult<Self> {
        let inner = if let Ok(text) = source.extract::<String>() {
            // TOML text always holds a `=`; a one-line string without one is a file name.
            if !text.contains('\n') && (!text.contains('=') || PathBuf::from(&text).is_file()) {
                Allocation::from_path(PathBuf::from(&text))
            } else {
                Allocation::from_toml_str(&text)
            }
        } else {
            let path: PathBuf = source
                .extract()
                .map_err(|_| error("from_toml expects TOML text (str) or a path (os.PathLike)"))?;
            Allocation::from_path(path)
        }
        .map_err(error)?;
        Ok(Self { inner })
    }

    /// A shipped preset by name (see `preset_names()`).
    #[staticmethod]
    fn preset(name: &str) -> PyResult<Self> {
        let inner = Allocation::preset(name).map_err(error)?;
        Ok(Self { inner })
    }

    /// A shipped preset if `name_or_path` names one, else the allocation file at that path.
    #[staticmethod]
    fn load(name_or_path: PathBuf) -> PyResult<Self> {
        let inner = Allocation::load(name_or_path).map_err(error)?;
        Ok(Self { inner })
    }

    /// The names of the shipped presets.
    #[staticmethod]
    fn preset_names() -> Vec<&'static str> {
        Allocation::preset_names().collect()
    }

    /// The recommended presets (best measured quality at about 4.25, 3.25 and 2.5 bits per
    /// value), best quality first.
    #[staticmethod]
    fn recommended_names() -> Vec<&'static str> {
        Allocation::recommended_names().collect()
    }

    /// The TOML text of a shipped preset, or None.
    #[staticmethod]
    fn preset_text(name: &str) -> Option<&'static str> {
        Allocation::preset_text(name)
    }

    /// The allocation's `name`.
    #[getter]
    fn name(&self) -> &str {
        &self.inner.name
    }

    /// The allocation's `description`, if any.
    #[getter]
    fn description(&self) -> Option<&str> {
        self.inner.description.as_deref()
    }

    /// The base seed every rotation and sketch seed is derived from.
    #[getter]
    fn seed(&self) -> u64 {
        self.inner.seed
    }

    /// The first tokens kept unquantized.
    #[getter]
    fn sink_tokens(&self) -> usize {
        self.inner.sink_tokens
    }

    /// The newest tokens kept unquantized (the count, a floor with `recent_fraction`).
    #[getter]
    fn recent_fp_tokens(&self) -> usize {
        self.inner.recent_fp_tokens
    }

    /// The recent window as a fraction of the tokens the cache holds, or None.
    #[getter]
    fn recent_fraction(&self) -> Option<f64> {
        self.inner.recent_fraction
    }

    /// The allocation as TOML text (`from_toml` reads back an equal allocation).
    fn to_toml(&self) -> PyResult<String> {
        self.inner.to_toml_string().map_err(error)
    }

    /// Stored bits per value for a model of this shape, averaged over every layer and KV head:
    /// codes, QJL sign bits and every float16 norm included (sink / recent full-precision
    /// tokens and per-head metadata excluded). `stream` is `"key"`, `"value"` or `"both"`
    /// (the mean of the two).
    #[pyo3(signature = (num_layers, num_kv_heads, head_dim, stream = "both"))]
    fn bits_per_value(
        &self,
        num_layers: usize,
        num_kv_heads: usize,
        head_dim: usize,
        stream: &str,
    ) -> PyResult<f64> {
        let shape = ModelShape {
            num_layers,
            num_kv_heads,
            head_dim,
        };
        let bits = |kind| self.inner.bits_per_value(&shape, kind).map_err(error);
        match stream {
            "both" => Ok((bits(StreamKind::Key)? + bits(StreamKind::Value)?) / 2.0),
            other => bits(stream_kind(other)?),
        }
    }

    /// Bytes one token stores in one stream (`"key"` or `"value"`) of one KV head of one layer.
    #[pyo3(signature = (layer, num_layers, kv_head, head_dim, stream))]
    fn bytes_per_token(
        &self,
        layer: usize,
        num_layers: usize,
        kv_head: usize,
        head_dim: usize,
        stream: &str,
    ) -> PyResult<usize> {
        let plan = self
            .inner
            .resolve(layer, num_layers, kv_head, head_dim, stream_kind(stream)?)
            .map_err(error)?;
        Ok(plan.bytes_per_token())
    }

    /// Checks the allocation against a whole model (every override index, every stream).
    fn validate_for(
        &self,
        num_layers: usize,
        num_kv_heads: usize,
        head_dim: usize,
    ) -> PyResult<()> {
        self.inner
            .validate_for(&ModelShape {
                num_layers,
                num_kv_heads,
                head_dim,
            })
            .map_err(error)
    }

    fn __repr__(&self) -> String {
        format!("Allocation(name={:?})", self.inner.name)
    }
}
