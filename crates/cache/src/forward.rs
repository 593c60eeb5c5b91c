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
        // The layers take turns with one gathering buffer (their own stays empty).
        let mut received = std::mem::take(&mut self.received);
        let Some(cache) = self.kv_at_mut(index) else {
            self.received = received;
            return Err(CacheError::InvalidConfig(format!(
                "layer {layer} resolves to a state without KV"
            )));
        };
        std::mem::swap(&mut received, &mut cache.received);
        let result = match keys_values {
            Some((keys, values)) => {
                cache.forward(queries, keys, values, positions, shape, kernel, out)
            }
            None => {
                let width = shape.q_heads * cache.layout().head_dim;
                let query_len = queries.len().checked_div(width).unwrap_or(0);
                if positions.len() != cache.len() || query_len > positions.len() {
                    Err(CacheError::OffsetMismatch {
                        cached: cache.len(),
                        offset: positions.len().saturating_sub(query_len),
                    })
                } else {
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
        };
        std::mem::swap(&mut received, &mut cache.received);
        self.received = received;
        result
    }
}

#[cfg(test)]
mod tests {
    use crate::CodecSpec;
    use crate::attention::{AttentionKernel, AttentionShape};
    use crate::kv_cache::{KvKind, KvLayout, uniform_streams};
    use crate::states::{ModelCache, StateKind, StateSpec};
    use crate::token_store::Growth;

    /// Two layers keeping heavy hitters take turns with the model's one gathering buffer:
    /// after each call the layer's own is empty and the model's holds what the calls needed.
    #[test]
    fn layers_take_turns_with_one_gathering_buffer() {
        let (d, len) = (8, 40);
        let layout = KvLayout {
            kv_heads: 1,
            head_dim: d,
            kind: KvKind::Growing {
                growth: Growth::Doubling { initial: 8 },
            },
            max_rewind: 0,
            rope_pairs: crate::basis::RopePairs::Adjacent,
            rope_base: Default::default(),
        };
        let specs = (0..2)
            .map(|layer| StateSpec {
                name: format!("layer{layer}.kv"),
                kind: StateKind::Kv { layer, layout },
            })
            .collect();
        let streams = |layout: &KvLayout| {
            uniform_streams(layout, CodecSpec::F16 { dim: d })
                .into_iter()
                .map(|mut s| {
                    s.recent_tokens = 4;
                    s.recent = Some(CodecSpec::Q8 { dim: d });
                    s.heavy_hitters = Some(2.0);
                    s
                })
                .collect::<Vec<_>>()
        };
        let mut cache =
            ModelCache::new(specs, |_, layout| Ok((streams(layout), streams(layout)))).unwrap();
        let shape = AttentionShape {
            q_heads: 2,
            scale: 0.5,
        };
        let rows: Vec<f32> = (0..len * d).map(|i| ((i * 7) % 11) as f32 - 5.0).collect();
        let queries: Vec<f32> = (0..len * 2 * d)
            .map(|i| ((i * 5) % 13) as f32 - 6.0)
            .collect();
        let positions: Vec<u32> = (0..len as u32).collect();
        let mut out = vec![0.0; len * 2 * d];
        for layer in 0..2 {
            cache
                .forward_layer(
                    layer,
                    &queries,
                    Some((&rows, &rows)),
                    &positions,
                    shape,
                    AttentionKernel::Fused,
                    &mut out,
                )
                .unwrap();
            assert_eq!(
                cache.kv_at_mut(layer).unwrap().received.weights.capacity(),
                0
            );
            assert!(!cache.received.weights.is_empty(), "layer {layer}");
        }
    }
}
