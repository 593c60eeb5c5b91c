//! The one write-then-attend entry point: [`KvCache::forward`] and
//! [`ModelCache::forward_layer`] write a chunk's keys and values into storage, then run
//! attention over it.
//!
//! It lives above both layers on purpose: the storage modules (codecs, token store, stream, KV
//! cache, states, persist) import nothing from [`attention`](crate::attention), and attention
//! reads storage only through its public accessors, so neither layer imports the other in a
//! cycle; this module is the one place that uses both (see `docs/ARCHITECTURE.md`).

use crate::attention::{AttentionKernel, AttentionShape, attend_in_step, attend_in_step_gathering};
use crate::error::CacheError;
use crate::kv_cache::KvCache;
use crate::states::ModelCache;

impl KvCache {
    /// The one entry point for prefill, chunked prefill and decode.
    ///
    /// `positions` are the positions of the whole sequence so far (cached tokens and the new
    /// ones); `queries` `[query_len, q_heads, d]` and `keys`/`values` `[query_len, kv_heads, d]`
    /// belong to the newest `query_len` tokens. `offset = positions.len − query_len` must equal
    /// [`len`](Self::len). The new tokens are written first, then every query attends (causal
    /// and window masks from positions) and `out` receives `[query_len, q_heads, d]`.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &mut self,
        queries: &[f32],
        keys: &[f32],
        values: &[f32],
        positions: &[u32],
        shape: AttentionShape,
        kernel: AttentionKernel,
        out: &mut [f32],
    ) -> Result<(), CacheError> {
        let width = shape.q_heads * self.layout().head_dim;
        if width == 0 || !queries.len().is_multiple_of(width) {
            return Err(CacheError::ShapeMismatch {
                what: "queries",
                expected: width,
                actual: queries.len(),
            });
        }
        let query_len = queries.len() / width;
        let offset = positions
            .len()
            .checked_sub(query_len)
            .ok_or(CacheError::ShapeMismatch {
                what: "positions",
                expected: query_len,
                actual: positions.len(),
            })?;
        if offset != self.len() {
            return Err(CacheError::OffsetMismatch {
                cached: self.len(),
                offset,
            });
        }
        let new_positions = &positions[offset..];
        self.append_with_queries(keys, values, new_positions, queries, shape.q_heads)?;
        if !self.keeps_heavy_hitters() {
            return attend_in_step(self, queries, new_positions, shape, kernel, out);
        }
        // The kernel hands back what each query gave its window tokens; the streams count it
        // and keep the heavy hitters among the tokens that left.
        let mut received = std::mem::take(&mut self.received);
        let result = attend_in_step_gathering(
            self,
            queries,
            new_positions,
            shape,
            kernel,
            (out, &mut received),
        )
        .and_then(|()| self.add_received(&received));
        self.received = received;
        result
    }
}

impl ModelCache {
    /// Attention for `layer` with the one-entry-point semantics of [`KvCache::forward`].
    ///
    /// A producer layer passes its new `keys`/`values`; a sharer passes `None` for both and
    /// attends over what its producer wrote this step (the producer must run first).
    #[allow(clippy::too_many_arguments)]
    pub fn forward_layer(
        &mut self,
        layer: usize,
        queries: &[f32],
        keys_values: Option<(&[f32], &[f32])>,
        positions: &[u32],
        shape: AttentionShape,
        kernel: AttentionKernel,
        out: &mut [f32],
    ) -> Result<(), CacheError> {
        let (index, shared) = self.kv_index(layer)?;
        // The state's name is only cloned on the error paths: decode calls this once per layer
        // per token and must not allocate.
        match (shared, keys_values) {
            (false, Some(_)) | (true, None) => {}
            (false, None) => {
                return Err(CacheError::Unsupported {
                    state: self.specs()[index].name.clone(),
                    reason: "a producer layer must pass its new keys and values",
                });
            }
            (true, Some(_)) => {
                return Err(CacheError::Unsupported {
                    state: self.state_name_of_layer(layer, index),
                    reason: "a KV-sharing layer reads its producer's cache and writes nothing",
                });
            }
        }
        let cache = self.kv_at_mut(index).ok_or_else(|| {
            CacheError::InvalidConfig(format!("layer {layer} resolves to a state without KV"))
        })?;
        match keys_values {
            Some((keys, values)) => {
                cache.forward(queries, keys, values, positions, shape, kernel, out)
            }
            None => {
                let width = shape.q_heads * cache.layout().head_dim;
                let query_len = queries.len().checked_div(width).unwrap_or(0);
                if positions.len() != cache.len() || query_len > positions.len() {
                    return Err(CacheError::OffsetMismatch {
                        cached: cache.len(),
                        offset: positions.len().saturating_sub(query_len),
                    });
                }
                attend_in_step(
                    cache,
                    queries,
                    &positions[positions.len() - query_len..],
                    shape,
                    kernel,
                    out,
                )
            }
        }
    }
}
