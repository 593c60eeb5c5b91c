//! From an allocation to the stream layouts of real caches.

use super::{Allocation, AllocationError, LayerKind, StreamKind, StreamPlan};
use crate::error::CacheError;
use crate::kv_cache::{KvCache, KvKind, KvLayout};
use crate::states::{ModelCache, StateSpec, layer_count};
use crate::stream::StreamLayout;
use crate::token_store::Growth;

impl Allocation {
    /// The per-head stream layouts of the keys or values of `layer` (of `num_layers`), for a
    /// cache of the given layout: codecs and centering from
    /// [`resolve_stream_in`](Self::resolve_stream_in) (a sliding-window layout is a
    /// [`LayerKind::Sliding`] layer, a growing one a global layer), full-precision sinks from
    /// the allocation, and the recent window the stream resolves to (its own or the
    /// allocation's: a count, a fraction of the tokens held or both, see
    /// [`RecentWindow::tokens_at`](super::RecentWindow::tokens_at)) with its heavy-hitter
    /// factor, if any (none on a sliding-window layout).
    pub fn stream_layouts(
        &self,
        layer: usize,
        num_layers: usize,
        layout: &KvLayout,
        stream: StreamKind,
    ) -> Result<Vec<StreamLayout>, AllocationError> {
        let (growth, kind) = match layout.kind {
            KvKind::Growing { growth } => (growth, LayerKind::Global),
            KvKind::Sliding { .. } => (Growth::Static { capacity: 0 }, LayerKind::Sliding),
        };
        (0..layout.kv_heads)
            .map(|head| {
                let mut resolved =
                    self.resolve_stream_in(layer, kind, num_layers, head, layout.head_dim, stream)?;
                // `rope-or-first-chunk` takes the RoPE center where this layout knows the base.
                resolved.center = resolved.center.resolved(layout.rope_base, layout.head_dim);
                if resolved.center.turns_with_position() && layout.rope_base.get().is_none() {
                    return Err(AllocationError::Shape(format!(
                        "layer {layer}: center = \"rope\" needs the model's RoPE base, and this \
                         cache layout has none (KvLayout::rope_base)"
                    )));
                }
                let (codec, outliers) = match resolved.plan {
                    StreamPlan::Single(spec) => (spec, None),
                    // The rest tier's spec stands in the `codec` field; the tiers are used.
                    StreamPlan::TwoTier(tiers) => (tiers.rest, Some(tiers)),
                };
                Ok(StreamLayout {
                    codec,
                    outliers,
                    channels: None,
                    center: resolved.center,
                    mean: None,
                    basis: resolved.basis,
                    basis_fit: None,
                    basis_bits: resolved.basis_bits,
                    rope_pairs: layout.rope_pairs,
                    rope_base: layout.rope_base,
                    fp: self.fp_codec(layout.head_dim),
                    recent: Some(self.recent_codec(layout.head_dim))
                        .filter(|r| *r != self.fp_codec(layout.head_dim)),
                    sink_tokens: self.sink_tokens,
                    recent_tokens: resolved.recent.tokens.unwrap_or(0),
                    recent_fraction: resolved.recent.fraction,
                    max_rewind: layout.max_rewind,
                    growth,
                    ring_slots: layout.ring_slots(),
                    order: resolved.record_order,
                    heavy_hitters: resolved.heavy_hitters,
                })
            })
            .collect()
    }
}

impl KvCache {
    /// The cache of `layer` (of `num_layers`) with codecs chosen by `allocation`.
    ///
    /// ```
    /// use tq_cache::allocation::Allocation;
    /// use tq_cache::kv_cache::{KvCache, KvKind, KvLayout};
    /// use tq_cache::token_store::Growth;
    /// let layout = KvLayout {
    ///     kv_heads: 3,
    ///     head_dim: 64,
    ///     kind: KvKind::Growing { growth: Growth::Static { capacity: 1024 } },
    ///     max_rewind: 0,
    ///     rope_pairs: tq_cache::basis::RopePairs::Adjacent,
    ///     rope_base: Default::default(),
    /// };
    /// let cache = KvCache::with_allocation(layout, &Allocation::preset("k5v4")?, 0, 30)?;
    /// // 3 heads × (K: 32 code + 8 sign bytes + 2 f16 scales; V: 32 + one f16) + a 4-byte position
    /// assert_eq!(cache.bytes_per_token(), 3 * (44 + 34) + 4);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_allocation(
        layout: KvLayout,
        allocation: &Allocation,
        layer: usize,
        num_layers: usize,
    ) -> Result<Self, CacheError> {
        let keys = allocation.stream_layouts(layer, num_layers, &layout, StreamKind::Key)?;
        let values = allocation.stream_layouts(layer, num_layers, &layout, StreamKind::Value)?;
        KvCache::new(layout, &keys, &values)
    }
}

impl ModelCache {
    /// The states of a model with every KV state's codecs chosen by `allocation` (layers are
    /// counted from the declared states: the highest layer index plus one).
    pub fn with_allocation(
        specs: Vec<StateSpec>,
        allocation: &Allocation,
    ) -> Result<Self, CacheError> {
        let num_layers = layer_count(&specs);
        ModelCache::new(specs, |layer, layout| {
            Ok((
                allocation.stream_layouts(layer, num_layers, layout, StreamKind::Key)?,
                allocation.stream_layouts(layer, num_layers, layout, StreamKind::Value)?,
            ))
        })
    }
}
