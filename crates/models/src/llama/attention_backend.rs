//! Where a layer's attention runs: the seam between the model and the cache.
//!
//! The forward pass computes Q, K and V and hands them to an [`AttentionBackend`], which stores
//! the new keys and values in its cache and writes the attention output. The CPU backend
//! ([`CpuAttention`]) runs over a `tq-cache` [`ModelCache`]; other backends (the GPU kernels of
//! `tq-attention-wgpu`, or an instrumented backend that records attention scores for the
//! quality figures) implement the same trait, so the model's layer math is written once.

use tq_cache::attention::{AttentionKernel, AttentionShape};
use tq_cache::states::ModelCache;

use super::ModelError;

/// Runs one layer's attention over the cached past plus the new tokens.
pub trait AttentionBackend {
    /// Appends the new tokens' `keys` and `values` (`[n, kv_heads·head_dim]` each, RoPE
    /// applied) to `layer`'s cache and writes the attention of `queries`
    /// (`[n, q_heads·head_dim]`) over the whole sequence into `out` (same shape as
    /// `queries`). `positions` covers the whole sequence: the cache held
    /// `positions.len − n` tokens before the call, and the new tokens sit at the end.
    #[allow(clippy::too_many_arguments)]
    fn attend(
        &mut self,
        layer: usize,
        queries: &[f32],
        keys: &[f32],
        values: &[f32],
        positions: &[u32],
        shape: AttentionShape,
        out: &mut [f32],
    ) -> Result<(), ModelError>;

    /// The attention of a KV-sharing `layer` (a [`StateKind::SharedKv`] state: it reads the
    /// cache its producer layer wrote and writes nothing): `queries` of the newest `n` tokens
    /// over the sequence the producer holds, `positions` covering it (the producer must have
    /// run this step). Backends that hold no shared states refuse it (the default).
    ///
    /// [`StateKind::SharedKv`]: tq_cache::states::StateKind::SharedKv
    fn attend_shared(
        &mut self,
        layer: usize,
        _queries: &[f32],
        _positions: &[u32],
        _shape: AttentionShape,
        _out: &mut [f32],
    ) -> Result<(), ModelError> {
        Err(ModelError::InvalidCall(format!(
            "layer {layer} reads a shared KV state, which this attention backend does not hold"
        )))
    }
}

/// Attention on the CPU over a `tq-cache` [`ModelCache`] with the chosen kernel.
#[derive(Debug)]
pub struct CpuAttention<'c> {
    /// The per-layer compressed (or f16/f32) caches.
    pub cache: &'c mut ModelCache,
    /// Which CPU kernel scores the cache.
    pub kernel: AttentionKernel,
}

impl AttentionBackend for CpuAttention<'_> {
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
        self.cache.forward_layer(
            layer,
            queries,
            Some((keys, values)),
            positions,
            shape,
            self.kernel,
            out,
        )?;
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
        self.cache
            .forward_layer(layer, queries, None, positions, shape, self.kernel, out)?;
        Ok(())
    }
}
