//! `turboquant.KvCache` (one layer) and `turboquant.ModelCache` (a stack of layers) over an
//! allocation.

use numpy::PyArrayDyn;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use tq_cache::allocation::{Allocation, StreamKind};
use tq_cache::attention::simd::Isa;
use tq_cache::attention::{AttentionKernel, AttentionShape, attend};
use tq_cache::kv_cache::{KvCache, KvKind, KvLayout};
use tq_cache::states::{ModelCache, StateKind, StateSpec};
use tq_cache::token_store::Growth;

use crate::allocation::PyAllocation;
use crate::convert::{Input, arg_error, error, output, positions};

/// Tokens in the first page of a growing cache without a fixed capacity (pages then double).
const INITIAL_PAGE: usize = 256;

fn kernel(name: &str) -> PyResult<AttentionKernel> {
    match name {
        "fused" => Ok(AttentionKernel::Fused),
        "reference" => Ok(AttentionKernel::Reference),
        "fused-scalar" => Ok(AttentionKernel::FusedOn(Isa::Scalar)),
        "llamacpp-f16" => Ok(AttentionKernel::LlamaCppF16),
        other => Err(error(format!(
            "unknown kernel {other:?}: expected \"fused\", \"reference\", \"fused-scalar\" or \
             \"llamacpp-f16\""
        ))),
    }
}

/// The most a statically sized cache (`capacity`, or a `window` ring) may ask for up front:
/// far above any real cache, low enough that an absurd size is an error, not an abort of the
/// interpreter when the allocation fails.
const MAX_STATIC_BYTES: u128 = 1 << 40;

/// Refuses a static size whose buffers would exceed [`MAX_STATIC_BYTES`] (every layer of
/// `layers`, every head and stream at the allocation's bytes per token, plus the position).
fn check_static_size(
    allocation: &Allocation,
    layout: &KvLayout,
    layers: std::ops::Range<usize>,
    num_layers: usize,
) -> PyResult<()> {
    let tokens = match layout.kind {
        KvKind::Growing {
            growth: Growth::Static { capacity },
        } => capacity,
        KvKind::Sliding { window } => window.saturating_add(layout.max_rewind),
        KvKind::Growing { .. } => return Ok(()),
    };
    let mut per_token: u128 = 0;
    for layer in layers {
        per_token += 4;
        for head in 0..layout.kv_heads {
            for stream in StreamKind::BOTH {
                let plan = allocation
                    .resolve(layer, num_layers, head, layout.head_dim, stream)
                    .map_err(error)?;
                per_token += plan.bytes_per_token() as u128;
            }
        }
    }
    let bytes = per_token.saturating_mul(tokens as u128);
    if bytes > MAX_STATIC_BYTES {
        return Err(error(format!(
            "a cache of {tokens} token slots would take {bytes} bytes up front (more than 1 TiB)"
        )));
    }
    Ok(())
}

fn layout(
    kv_heads: usize,
    head_dim: usize,
    capacity: Option<usize>,
    window: Option<usize>,
    max_rewind: usize,
) -> PyResult<KvLayout> {
    if kv_heads == 0 || head_dim == 0 {
        return Err(error("kv_heads and head_dim must be positive"));
    }
    let kind = match (window, capacity) {
        (Some(_), Some(_)) => {
            return Err(error(
                "give either window (a sliding ring) or capacity (a growing cache), not both",
            ));
        }
        (Some(window), None) => KvKind::Sliding { window },
        (None, Some(capacity)) => KvKind::Growing {
            growth: Growth::Static { capacity },
        },
        (None, None) => KvKind::Growing {
            growth: Growth::Doubling {
                initial: INITIAL_PAGE,
            },
        },
    };
    Ok(KvLayout {
        kv_heads,
        head_dim,
        kind,
        max_rewind,
        // The Python API takes keys as the caller rotated them; only the plane basis reads
        // this, and it is not exposed there.
        rope_pairs: tq_cache::basis::RopePairs::Adjacent,
        rope_base: Default::default(),
    })
}

/// Keys or values `[n, kv_heads, head_dim]` (or `[n, kv_heads·head_dim]`): the borrowed array
/// and `n`.
fn tokens<'py>(
    obj: &Bound<'py, PyAny>,
    name: &'static str,
    layout: &KvLayout,
) -> PyResult<(Input<'py, f32>, usize)> {
    let input = Input::<f32>::new(obj, name)?;
    let (h, d) = (layout.kv_heads, layout.head_dim);
    let shape = input.shape().to_vec();
    match shape.as_slice() {
        [n, heads, dim] if *heads == h && *dim == d => Ok((input, *n)),
        [n, width] if *width == h * d => Ok((input, *n)),
        _ => Err(arg_error(
            name,
            format!(
                "expected shape [n, {h}, {d}] (or [n, {}]), got {shape:?}",
                h * d
            ),
        )),
    }
}

/// The positions of `n` new tokens: as given, or continuing after the cache's last position.
fn new_positions(given: Option<&Bound<'_, PyAny>>, n: usize, next: u32) -> PyResult<Vec<u32>> {
    match given {
        Some(obj) => {
            let p = positions(obj, "positions")?;
            if p.len() != n {
                return Err(arg_error(
                    "positions",
                    format!("expected {n} positions (one per token), got {}", p.len()),
                ));
            }
            Ok(p)
        }
        None => (0..n)
            .map(|i| {
                u32::try_from(i)
                    .ok()
                    .and_then(|i| next.checked_add(i))
                    .ok_or_else(|| error("positions overflow u32"))
            })
            .collect(),
    }
}

/// The position after the last cached token (0 for an empty cache).
fn next_position(cache: &KvCache) -> u32 {
    cache
        .len()
        .checked_sub(1)
        .and_then(|t| cache.position(t))
        .map_or(0, |p| p.saturating_add(1))
}

/// Runs attention for `queries` `[m, q_heads, head_dim]` over `cache`; returns the output
/// array of the same shape.
fn run_attention<'py>(
    py: Python<'py>,
    cache: &KvCache,
    queries: &Bound<'py, PyAny>,
    query_positions: Option<&Bound<'py, PyAny>>,
    scale: Option<f32>,
    kernel_name: &str,
) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
    let kernel = kernel(kernel_name)?;
    let layout = *cache.layout();
    let queries = Input::<f32>::new(queries, "queries")?;
    let d = layout.head_dim;
    let shape = queries.shape().to_vec();
    let (m, q_heads) = match shape.as_slice() {
        [m, q_heads, dim] if *dim == d => (*m, *q_heads),
        _ => {
            return Err(arg_error(
                "queries",
                format!("expected shape [m, q_heads, {d}], got {shape:?}"),
            ));
        }
    };
    let query_positions = match query_positions {
        Some(obj) => {
            let p = positions(obj, "positions")?;
            if p.len() != m {
                return Err(arg_error(
                    "positions",
                    format!("expected {m} positions (one per query), got {}", p.len()),
                ));
            }
            p
        }
        None => {
            if cache.is_empty() {
                return Err(error("attend: the cache is empty; append tokens first"));
            }
            vec![next_position(cache).saturating_sub(1); m]
        }
    };
    let scale = scale.unwrap_or(1.0 / (d as f32).sqrt());
    if !scale.is_finite() {
        return Err(arg_error("scale", "must be finite"));
    }
    let shape = AttentionShape { q_heads, scale };
    let qs = queries.slice()?;
    let mut out = vec![0.0f32; qs.len()];
    py.detach(|| attend(cache, qs, &query_positions, shape, kernel, &mut out))
        .map_err(error)?;
    output(py, out, &[m, q_heads, d])
}

/// The compressed key/value cache of one attention layer, with codecs chosen per KV head and
/// stream by an allocation.
///
/// `KvCache(allocation, kv_heads, head_dim, layer=0, num_layers=1, capacity=None,
/// window=None, max_rewind=0)`: `layer` of `num_layers` picks the allocation's per-layer
/// settings (`[boundary]`, `[[override]]`); `capacity` makes a static cache of that many
/// tokens (default: pages that double as it grows); `window` makes a sliding ring.
#[pyclass(name = "KvCache", module = "turboquant")]
pub struct PyKvCache {
    inner: KvCache,
}

#[pymethods]
impl PyKvCache {
    #[new]
    #[pyo3(signature = (
        allocation, kv_heads, head_dim, layer = 0, num_layers = 1, capacity = None,
        window = None, max_rewind = 0
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        allocation: &PyAllocation,
        kv_heads: usize,
        head_dim: usize,
        layer: usize,
        num_layers: usize,
        capacity: Option<usize>,
        window: Option<usize>,
        max_rewind: usize,
    ) -> PyResult<Self> {
        let layout = layout(kv_heads, head_dim, capacity, window, max_rewind)?;
        let allocation = &allocation.inner;
        check_static_size(allocation, &layout, layer..layer + 1, num_layers)?;
        let inner = py
            .detach(|| KvCache::with_allocation(layout, allocation, layer, num_layers))
            .map_err(error)?;
        Ok(Self { inner })
    }

    /// KV heads.
    #[getter]
    fn kv_heads(&self) -> usize {
        self.inner.layout().kv_heads
    }

    /// Head dimension.
    #[getter]
    fn head_dim(&self) -> usize {
        self.inner.layout().head_dim
    }

    /// Tokens appended (on a sliding layer, including those the ring dropped).
    fn __len__(&self) -> usize {
        self.inner.len()
    }

    /// Bytes per token slot: every head's key and value record and scales, plus the 4-byte
    /// position.
    #[getter]
    fn bytes_per_token(&self) -> usize {
        self.inner.bytes_per_token()
    }

    /// Bytes held by every buffer, measured.
    #[getter]
    fn allocated_bytes(&self) -> usize {
        self.inner.allocated_bytes()
    }

    /// Bytes by the layout formula (equals `allocated_bytes`).
    #[getter]
    fn formula_bytes(&self) -> usize {
        self.inner.formula_bytes()
    }

    /// Bytes stored once rather than per token (full-precision sink / recent copies, means of
    /// centered streams).
    #[getter]
    fn fixed_bytes(&self) -> usize {
        self.inner.fixed_bytes()
    }

    /// Appends keys and values, float32 `[n, kv_heads, head_dim]` (or
    /// `[n, kv_heads·head_dim]`), at `positions` (`n` increasing integers; default: right after
    /// the last cached position). The batch goes in whole or not at all.
    #[pyo3(signature = (keys, values, positions = None))]
    fn append(
        &mut self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        values: &Bound<'_, PyAny>,
        positions: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let layout = *self.inner.layout();
        let (keys, n) = tokens(keys, "keys", &layout)?;
        let (values, n_values) = tokens(values, "values", &layout)?;
        if n != n_values {
            return Err(error(format!(
                "keys hold {n} tokens but values hold {n_values}"
            )));
        }
        let positions = new_positions(positions, n, next_position(&self.inner))?;
        let (ks, vs) = (keys.slice()?, values.slice()?);
        let cache = &mut self.inner;
        py.detach(|| cache.append(ks, vs, &positions))
            .map_err(error)
    }

    /// Attention of `queries` (float32 `[m, q_heads, head_dim]`, `q_heads` a multiple of
    /// `kv_heads`) over the cache, on the compressed codes: float32 `[m, q_heads, head_dim]`.
    /// A query at position `p` sees the cached tokens at positions `<= p` (and within the
    /// window); by default every query sits at the last cached position and sees everything.
    /// `scale` defaults to `1/sqrt(head_dim)`; `kernel` is `"fused"` (default, SIMD),
    /// `"fused-scalar"` (the same on plain Rust: identical bits on every machine),
    /// `"reference"` (decode everything, f64 sums) or `"llamacpp-f16"` (f16 caches only).
    #[pyo3(signature = (queries, positions = None, scale = None, kernel = "fused"))]
    fn attend<'py>(
        &self,
        py: Python<'py>,
        queries: &Bound<'py, PyAny>,
        positions: Option<&Bound<'py, PyAny>>,
        scale: Option<f32>,
        kernel: &str,
    ) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
        run_attention(py, &self.inner, queries, positions, scale, kernel)
    }

    /// The positions of the stored tokens (uint32, oldest first).
    fn positions<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArrayDyn<u32>>> {
        let stored: Vec<u32> = (self.inner.first_stored()..self.inner.len())
            .filter_map(|t| self.inner.position(t))
            .collect();
        let n = stored.len();
        output(py, stored, &[n])
    }

    /// Forgets every token (keeps the allocations).
    fn clear(&mut self) {
        self.inner.clear();
    }

    /// Rewinds to `new_len` tokens (as far back as the layout allows exactly).
    fn truncate(&mut self, new_len: usize) -> PyResult<()> {
        self.inner.truncate(new_len).map_err(error)
    }

    fn __repr__(&self) -> String {
        let layout = self.inner.layout();
        format!(
            "KvCache(kv_heads={}, head_dim={}, len={}, bytes_per_token={})",
            layout.kv_heads,
            layout.head_dim,
            self.inner.len(),
            self.inner.bytes_per_token()
        )
    }
}

/// The KV caches of every attention layer of a model (`blk.{l}.kv`), codecs per layer, head
/// and stream from one allocation.
///
/// `ModelCache(allocation, num_layers, kv_heads, head_dim, capacity=None, window=None)`.
/// A layer writes and attends in one call, `forward_layer`, as in the Rust `ModelCache`.
#[pyclass(name = "ModelCache", module = "turboquant")]
pub struct PyModelCache {
    inner: ModelCache,
}

impl PyModelCache {
    fn layer(&self, layer: usize) -> PyResult<&KvCache> {
        self.inner.kv(layer).map_err(error)
    }
}

#[pymethods]
impl PyModelCache {
    #[new]
    #[pyo3(signature = (allocation, num_layers, kv_heads, head_dim, capacity = None, window = None))]
    fn new(
        py: Python<'_>,
        allocation: &PyAllocation,
        num_layers: usize,
        kv_heads: usize,
        head_dim: usize,
        capacity: Option<usize>,
        window: Option<usize>,
    ) -> PyResult<Self> {
        if num_layers == 0 {
            return Err(error("num_layers must be positive"));
        }
        let layout = layout(kv_heads, head_dim, capacity, window, 0)?;
        let specs: Vec<StateSpec> = (0..num_layers)
            .map(|layer| StateSpec {
                name: format!("blk.{layer}.kv"),
                kind: StateKind::Kv { layer, layout },
            })
            .collect();
        let allocation = &allocation.inner;
        check_static_size(allocation, &layout, 0..num_layers, num_layers)?;
        let inner = py
            .detach(|| ModelCache::with_allocation(specs, allocation))
            .map_err(error)?;
        Ok(Self { inner })
    }

    /// Attention layers.
    #[getter]
    fn num_layers(&self) -> usize {
        self.inner.specs().len()
    }

    /// Tokens seen (the longest layer).
    fn __len__(&self) -> usize {
        self.inner.len()
    }

    /// Bytes per token slot, summed over every layer.
    #[getter]
    fn bytes_per_token(&self) -> usize {
        self.inner.memory().iter().map(|m| m.bytes_per_token).sum()
    }

    /// Bytes held by every buffer of every layer, measured.
    #[getter]
    fn allocated_bytes(&self) -> usize {
        self.inner.memory().iter().map(|m| m.allocated_bytes).sum()
    }

    /// Per layer: a dict with `name`, `kind`, `bytes_per_token`, `formula_bytes` and
    /// `allocated_bytes`.
    fn memory<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        self.inner
            .memory()
            .into_iter()
            .map(|m| {
                let dict = PyDict::new(py);
                dict.set_item("name", m.name)?;
                dict.set_item("kind", m.kind)?;
                dict.set_item("bytes_per_token", m.bytes_per_token)?;
                dict.set_item("formula_bytes", m.formula_bytes)?;
                dict.set_item("allocated_bytes", m.allocated_bytes)?;
                Ok(dict)
            })
            .collect()
    }

    /// Writes `keys` / `values` (float32 `[n, kv_heads, head_dim]`) of `n` new tokens into
    /// `layer`, then attends with `queries` (float32 `[n, q_heads, head_dim]`, one per new
    /// token, causal): returns float32 `[n, q_heads, head_dim]`. `positions` are the new
    /// tokens' (default: right after the layer's last cached position).
    #[pyo3(signature = (layer, queries, keys, values, positions = None, scale = None, kernel = "fused"))]
    #[allow(clippy::too_many_arguments)]
    fn forward_layer<'py>(
        &mut self,
        py: Python<'py>,
        layer: usize,
        queries: &Bound<'py, PyAny>,
        keys: &Bound<'py, PyAny>,
        values: &Bound<'py, PyAny>,
        positions: Option<&Bound<'py, PyAny>>,
        scale: Option<f32>,
        kernel: &str,
    ) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
        let kernel = self::kernel(kernel)?;
        let cache = self.layer(layer)?;
        let layout = *cache.layout();
        let (cached, next) = (cache.len(), next_position(cache));
        let (keys, n) = tokens(keys, "keys", &layout)?;
        let (values, n_values) = tokens(values, "values", &layout)?;
        let queries = Input::<f32>::new(queries, "queries")?;
        let d = layout.head_dim;
        let q_shape = queries.shape().to_vec();
        let q_heads = match q_shape.as_slice() {
            [m, q_heads, dim] if *m == n && *dim == d => *q_heads,
            _ => {
                return Err(arg_error(
                    "queries",
                    format!("expected shape [{n}, q_heads, {d}], got {q_shape:?}"),
                ));
            }
        };
        if n != n_values {
            return Err(error(format!(
                "keys hold {n} tokens but values hold {n_values}"
            )));
        }
        let new = new_positions(positions, n, next)?;
        // `forward_layer` takes the positions of the whole sequence and reads only the last
        // `n` (the offset `len − n` must equal the tokens cached): the cached ones are
        // placeholders here, the cache keeps its own.
        let mut all = vec![0u32; cached];
        all.extend_from_slice(&new);
        let scale = scale.unwrap_or(1.0 / (d as f32).sqrt());
        if !scale.is_finite() {
            return Err(arg_error("scale", "must be finite"));
        }
        let shape = AttentionShape { q_heads, scale };
        let (qs, ks, vs) = (queries.slice()?, keys.slice()?, values.slice()?);
        let mut out = vec![0.0f32; qs.len()];
        let states = &mut self.inner;
        py.detach(|| {
            states.forward_layer(layer, qs, Some((ks, vs)), &all, shape, kernel, &mut out)
        })
        .map_err(error)?;
        output(py, out, &[n, q_heads, d])
    }

    /// Appends keys and values (float32 `[n, kv_heads, head_dim]`) of `n` new tokens to
    /// `layer`'s cache at `positions` (default: right after the layer's last cached position),
    /// without attending; `attend` reads them afterwards.
    #[pyo3(signature = (layer, keys, values, positions = None))]
    fn append(
        &mut self,
        py: Python<'_>,
        layer: usize,
        keys: &Bound<'_, PyAny>,
        values: &Bound<'_, PyAny>,
        positions: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let cache = self.layer(layer)?;
        let layout = *cache.layout();
        let next = next_position(cache);
        let (keys, n) = tokens(keys, "keys", &layout)?;
        let (values, n_values) = tokens(values, "values", &layout)?;
        if n != n_values {
            return Err(error(format!(
                "keys hold {n} tokens but values hold {n_values}"
            )));
        }
        let positions = new_positions(positions, n, next)?;
        let (ks, vs) = (keys.slice()?, values.slice()?);
        let states = &mut self.inner;
        py.detach(|| states.append_layer(layer, ks, vs, &positions))
            .map_err(error)
    }

    /// Attention of `queries` over `layer`'s cache without writing (see `KvCache.attend`).
    #[pyo3(signature = (layer, queries, positions = None, scale = None, kernel = "fused"))]
    fn attend<'py>(
        &self,
        py: Python<'py>,
        layer: usize,
        queries: &Bound<'py, PyAny>,
        positions: Option<&Bound<'py, PyAny>>,
        scale: Option<f32>,
        kernel: &str,
    ) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
        run_attention(py, self.layer(layer)?, queries, positions, scale, kernel)
    }

    /// Rewinds every layer to `new_len` tokens.
    fn truncate(&mut self, new_len: usize) -> PyResult<()> {
        self.inner.truncate(new_len).map_err(error)
    }

    /// Empties every layer.
    fn reset(&mut self) {
        self.inner.reset();
    }

    fn __repr__(&self) -> String {
        format!(
            "ModelCache(num_layers={}, len={}, bytes_per_token={})",
            self.num_layers(),
            self.inner.len(),
            self.bytes_per_token()
        )
    }
}
