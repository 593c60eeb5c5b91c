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
//! What the GPU kernels do not implement is a typed error when the backend is built
//! ([`ModelError::Gpu`] wrapping [`GpuError::Unsupported`]): two tiers with QJL tiers,
//! shared-KV or fixed states, and sink or window copies in f32.

use std::sync::Arc;

use tq_attention_wgpu::{GpuContext, GpuError, GpuKvCache};
use tq_cache::allocation::Allocation;
use tq_cache::attention::AttentionShape;
use tq_cache::states::{ModelCache, StateKind};

use super::ModelError;
use super::attention_backend::AttentionBackend;
use super::model::Llama;

/// Attention on the GPU: one [`GpuKvCache`] per layer, all on one [`GpuContext`].
pub struct WgpuAttention {
    ctx: Arc<GpuContext>,
    layers: Vec<GpuKvCache>,
}

impl std::fmt::Debug for WgpuAttention {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WgpuAttention")
            .field("adapter", &self.ctx.adapter_info().name)
            .field("layers", &self.layers.len())
            .field("len", &self.len())
            .finish()
    }
}

impl WgpuAttention {
    /// Empty GPU caches with the layouts and codecs of `template`'s KV states (its tokens are
    /// not copied; see [`from_cache`](Self::from_cache)).
    ///
    /// Errors: a state other than one KV cache per layer (shared KV, fixed), or a codec
    /// configuration the GPU kernels do not implement (`GpuError::Unsupported`).
    pub fn new(ctx: &Arc<GpuContext>, template: &ModelCache) -> Result<Self, ModelError> {
        let mut layers = Vec::new();
        for spec in template.specs() {
            let StateKind::Kv { layer, .. } = spec.kind else {
                return Err(GpuError::Unsupported(format!(
                    "state `{}` is not a per-layer KV cache (shared-KV and fixed states \
                     stay on the CPU)",
                    spec.name
                ))
                .into());
            };
            // Layers must be declared in order so that `attend(layer, ..)` finds its cache
            // by index; a model declaring them otherwise is not one this backend runs.
            if layer != layers.len() {
                return Err(ModelError::InvalidCall(format!(
                    "KV state of layer {layer} declared at index {}",
                    layers.len()
                )));
            }
            layers.push(GpuKvCache::new(ctx, template.kv(layer)?)?);
        }
        Ok(Self {
            ctx: Arc::clone(ctx),
            layers,
        })
    }

    /// [`new`](Self::new), then every stored token of `cache` uploaded: continues a sequence
    /// the CPU started (e.g. a prompt prefilled on the CPU).
    pub fn from_cache(ctx: &Arc<GpuContext>, cache: &ModelCache) -> Result<Self, ModelError> {
        let mut backend = Self::new(ctx, cache)?;
        for (layer, gpu) in backend.layers.iter_mut().enumerate() {
            gpu.upload_all(cache.kv(layer)?)?;
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
        self.layers.first().map_or(0, GpuKvCache::len)
    }

    /// Whether no token was appended.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Layers (one GPU cache each).
    pub fn layers(&self) -> usize {
        self.layers.len()
    }

    /// The GPU cache of `layer`.
    pub fn layer(&self, layer: usize) -> Option<&GpuKvCache> {
        self.layers.get(layer)
    }

    /// Bytes of cache pages allocated on the device, all layers.
    pub fn device_bytes(&self) -> u64 {
        self.layers.iter().map(GpuKvCache::device_bytes).sum()
    }

    /// Drops every token from `new_len` on, in every layer.
    pub fn truncate(&mut self, new_len: usize) -> Result<(), ModelError> {
        for gpu in &mut self.layers {
            gpu.truncate(new_len)?;
        }
        Ok(())
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
        let layers = self.layers.len();
        let gpu = self.layers.get_mut(layer).ok_or_else(|| {
            ModelError::InvalidCall(format!("layer {layer} of a {layers}-layer GPU cache"))
        })?;
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
}
