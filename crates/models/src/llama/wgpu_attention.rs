//! [`WgpuAttention`]: the model's attention on the GPU kernels of `tq-attention-wgpu`.
//!
//! One [`GpuKvCache`] per layer, built with exactly the codecs (kinds, bits, rotation and
//! sketch seeds) that the CPU [`ModelCache`] of the same allocation uses for that layer, so
//! the two backends store the same records and differ only by f32 rounding. Each
//! [`attend`](AttentionBackend::attend) call encodes the chunk's new keys and values on the
//! GPU (streams with two tiers, a basis, centering, sinks or a recent window on the host, with
//! the CPU codecs), appends them (one upload of the
//! chunk, never the whole cache) and runs decode attention on the device; only the attention
//! output comes back.
//!
//! Heavy hitters are decided on the GPU's own attention weights with the CPU stream's rule
//! (`tq_attention_wgpu`'s `heavy_hitters` module), their kept copies on the device.
//!
//! KV-sharing layers ([`StateKind::SharedKv`]) read their producer's GPU cache
//! ([`attend_shared`](AttentionBackend::attend_shared), each query with the recent window it
//! had in the producer's step); nothing is stored for them.
//!
//! What the GPU kernels do not implement is a typed error when the backend is built
//! ([`ModelError::Gpu`] wrapping [`GpuError::Unsupported`]): two tiers with QJL tiers,
//! fixed states (the recurrent layers' own states, which their layers update on the CPU),
//! and sink or window copies in f32.

use std::sync::Arc;

use tq_attention_wgpu::{GpuContext, GpuError, GpuKvCache};
use tq_cache::allocation::Allocation;
use tq_cache::attention::AttentionShape;
use tq_cache::states::{ModelCache, StateKind};

use super::ModelError;
use super::attention_backend::AttentionBackend;
use super::model::Llama;

/// Attention on the GPU: one [`GpuKvCache`] per KV state, all on one [`GpuContext`].
pub struct WgpuAttention {
    ctx: Arc<GpuContext>,
    /// One per KV state, in the order of the first layer that attends over it.
    caches: Vec<GpuKvCache>,
    /// Per layer: its cache in `caches`, and whether it shares it (reads its producer's).
    routes: Vec<(usize, bool)>,
}

impl std::fmt::Debug for WgpuAttention {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WgpuAttention")
            .field("adapter", &self.ctx.adapter_info().name)
            .field("layers", &self.routes.len())
            .field("kv_states", &self.caches.len())
            .field("len", &self.len())
            .finish()
    }
}

impl WgpuAttention {
    /// Empty GPU caches with the layouts and codecs of `template`'s KV states (its tokens are
    /// not copied; see [`from_cache`](Self::from_cache)); its KV-sharing layers read their
    /// producers' caches.
    ///
    /// Errors: a fixed state or a codec configuration the GPU kernels do not implement
    /// (`GpuError::Unsupported`), a layer without a KV state.
    pub fn new(ctx: &Arc<GpuContext>, template: &ModelCache) -> Result<Self, ModelError> {
        if let Some(spec) = template
            .specs()
            .iter()
            .find(|s| matches!(s.kind, StateKind::Fixed { .. }))
        {
            return Err(GpuError::Unsupported(format!(
                "state `{}` is a fixed state (recurrent layers update theirs on the CPU)",
                spec.name
            ))
            .into());
        }
        // The template resolves each layer to the KV state it attends over (a sharer to its
        // producer's; the specs were checked when it was built): one GPU cache per state.
        let specs = template.specs();
        let mut caches = Vec::new();
        let mut cache_of_state: Vec<Option<usize>> = vec![None; specs.len()];
        let mut routes = Vec::new();
        for layer in 0..tq_cache::states::layer_count(specs) {
            let (state, shared) = template.kv_index(layer)?;
            let cache = match cache_of_state[state] {
                Some(cache) => cache,
                None => {
                    caches.push(GpuKvCache::new(ctx, template.kv(layer)?)?);
                    cache_of_state[state] = Some(caches.len() - 1);
                    caches.len() - 1
                }
            };
            routes.push((cache, shared));
        }
        Ok(Self {
            ctx: Arc::clone(ctx),
            caches,
            routes,
        })
    }

    /// [`new`](Self::new), then every stored token of `cache` uploaded: continues a sequence
    /// the CPU started (e.g. a prompt prefilled on the CPU).
    pub fn from_cache(ctx: &Arc<GpuContext>, cache: &ModelCache) -> Result<Self, ModelError> {
        let mut backend = Self::new(ctx, cache)?;
        for (layer, &(index, shared)) in backend.routes.iter().enumerate() {
            if !shared {
                backend.caches[index].upload_all(cache.kv(layer)?)?;
            }
        }
        Ok(backend)
    }

    /// Empty GPU caches for `model` with the codecs `allocation` chooses, the same per layer,
    /// head and stream as [`Llama::new_cache`] with that allocation.
    pub fn for_model(
        ctx: &Arc<GpuContext>,
        model: &Llama,
        allocation: &Allocation,
    ) -> Result<Self, ModelError> {
        // A one-token CPU cache is only a template: codecs and seeds, no token storage.
        let template = model.new_cache(allocation, 1)?;
        Self::new(ctx, &template)
    }

    /// The device context.
    pub fn context(&self) -> &Arc<GpuContext> {
        &self.ctx
    }

    /// Tokens the caches hold (every layer holds the same count between forward calls).
    pub fn len(&self) -> usize {
        self.caches.first().map_or(0, GpuKvCache::len)
    }

    /// Whether no token was appended.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Layers (a GPU cache each, its own or its producer's).
    pub fn layers(&self) -> usize {
        self.routes.len()
    }

    /// The GPU cache `layer` reads (a sharer's is its producer's).
    pub fn layer(&self, layer: usize) -> Option<&GpuKvCache> {
        self.routes
            .get(layer)
            .map(|&(index, _)| &self.caches[index])
    }

    /// Bytes of cache pages allocated on the device, all layers (a shared cache once).
    pub fn device_bytes(&self) -> u64 {
        self.caches.iter().map(GpuKvCache::device_bytes).sum()
    }

    /// Drops every token from `new_len` on, in every layer.
    pub fn truncate(&mut self, new_len: usize) -> Result<(), ModelError> {
        for gpu in &mut self.caches {
            gpu.truncate(new_len)?;
        }
        Ok(())
    }

    /// The cache of `layer` and whether the layer shares it.
    fn route(&mut self, layer: usize) -> Result<(&mut GpuKvCache, bool), ModelError> {
        let layers = self.routes.len();
        let &(index, shared) = self.routes.get(layer).ok_or_else(|| {
            ModelError::InvalidCall(format!("layer {layer} of a {layers}-layer GPU cache"))
        })?;
        Ok((&mut self.caches[index], shared))
    }
}

impl AttentionBackend for WgpuAttention {
    fn attend(
        &mut self,
        layer: usize,
        queries: &[f32],
        keys: &[f32],
        values: &[f32],
        positions: &[u32],
        shape: AttentionShape,
        out: &mut [f32],
    ) -> Result<(), ModelError> {
        let (gpu, shared) = self.route(layer)?;
        if shared {
            return Err(ModelError::InvalidCall(format!(
                "layer {layer} reads a shared KV state and writes nothing (attend_shared)"
            )));
        }
        let width = shape.q_heads * gpu.head_dim();
        if width == 0 || !queries.len().is_multiple_of(width) {
            return Err(GpuError::Shape {
                what: "queries [tokens, q_heads·head_dim]",
                expected: width,
                actual: queries.len(),
            }
            .into());
        }
        let n = queries.len() / width;
        let Some(offset) = positions.len().checked_sub(n) else {
            return Err(ModelError::InvalidCall(format!(
                "{n} query tokens with {} positions",
                positions.len()
            )));
        };
        if offset != gpu.len() {
            return Err(ModelError::InvalidCall(format!(
                "layer {layer}: the GPU cache holds {} tokens but the call continues after {offset}",
                gpu.len()
            )));
        }
        gpu.forward(queries, keys, values, &positions[offset..], shape, out)?;
        Ok(())
    }

    fn attend_shared(
        &mut self,
        layer: usize,
        queries: &[f32],
        positions: &[u32],
        shape: AttentionShape,
        out: &mut [f32],
    ) -> Result<(), ModelError> {
        let (gpu, shared) = self.route(layer)?;
        if !shared {
            return Err(ModelError::InvalidCall(format!(
                "layer {layer} writes its own KV state (attend, with its keys and values)"
            )));
        }
        let width = shape.q_heads * gpu.head_dim();
        let n = queries.len().checked_div(width).unwrap_or(0);
        if width == 0 || queries.len() != n * width || positions.len() != gpu.len() || n > gpu.len()
        {
            return Err(ModelError::InvalidCall(format!(
                "layer {layer}: {} query values over {} positions, the shared cache holds {} \
                 tokens of {width} query values each",
                queries.len(),
                positions.len(),
                gpu.len()
            )));
        }
        gpu.attend_in_step(queries, &positions[positions.len() - n..], shape, out)?;
        Ok(())
    }
}
