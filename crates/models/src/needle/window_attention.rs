//! Whether a cache could find the needle's tokens on its own, while they are still in its
//! recent window: the attention each token receives from the queries of the `window` tokens
//! from it on (the queries that read it at full precision before its codes are written), as a
//! heavy-hitter policy would accumulate it, and where the needle's tokens rank by it.
//!
//! An instrumented [`AttentionBackend`]: attention runs on the CPU cache as usual (the answer
//! is the allocation's own); every query row is scored a second time against the exact keys
//! (f32, RoPE applied), and token `t` gains, per layer, the softmax weight of each row
//! `r ∈ [t, t + window)`, averaged over the query heads.

use std::ops::Range;

use tq_cache::attention::AttentionShape;

use super::exact::lanes_dot;
use crate::eval::score_probe::softmax;
use crate::llama::{AttentionBackend, CpuAttention, ModelError};

/// Per layer and token, the attention received within the window.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WindowAttention {
    /// `[layer][token]`: `Σ_{r ∈ [t, t + window)} mean_h w_{r,h}(t)`.
    received: Vec<Vec<f64>>,
}

impl WindowAttention {
    /// Per layer, the rank of each of the `needle`'s tokens among every token by the
    /// attention received in the window, as a fraction of the tokens ranked (0: received the
    /// most; ties count against the needle). A layer never measured gives an empty row.
    ///
    /// ```
    /// use tq_models::needle::WindowAttention;
    ///
    /// // One layer, four tokens; token 2 received the most, token 1 the least.
    /// let measured = WindowAttention::from_received(vec![vec![0.5, 0.1, 0.9, 0.3]]);
    /// assert_eq!(measured.needle_ranks(1..3), vec![vec![0.75, 0.0]]);
    /// ```
    pub fn needle_ranks(&self, needle: Range<usize>) -> Vec<Vec<f64>> {
        self.received
            .iter()
            .map(|tokens| {
                needle
                    .clone()
                    .filter_map(|t| tokens.get(t))
                    .map(|&mine| {
                        let above = tokens.iter().filter(|&&x| x >= mine).count() - 1;
                        above as f64 / tokens.len() as f64
                    })
                    .collect()
            })
            .collect()
    }

    /// A record of the given per layer, per token received attention.
    pub fn from_received(received: Vec<Vec<f64>>) -> Self {
        Self { received }
    }
}

/// Scores each query row (the last `queries.len() / (q_heads·d)` of `positions`) against
/// `exact_keys` (`[tokens, kv_heads·head_dim]`) over the tokens `kv` shows it, and calls
/// `add(kv_head, t, w)` with the softmax weight `w` of each query head on each token `t`
/// whose `window` holds the row (`t ≤ row < t + window`). The one loop behind the window
/// probe and the heavy-hitter simulation of [`exact`](super::exact).
pub(super) fn add_window_weights(
    kv: &tq_cache::kv_cache::KvCache,
    exact_keys: &[f32],
    queries: &[f32],
    positions: &[u32],
    shape: AttentionShape,
    window: usize,
    mut add: impl FnMut(usize, usize, f64),
) {
    let (d, kv_heads) = (kv.layout().head_dim, kv.layout().kv_heads);
    let width = kv_heads * d;
    let group = shape.q_heads / kv_heads.max(1);
    let n = queries.len() / (shape.q_heads * d).max(1);
    let first = positions.len() - n;
    let scale = f64::from(shape.scale);
    let mut scores = Vec::new();
    for (i, query) in queries.chunks_exact(shape.q_heads * d).enumerate() {
        let row = first + i;
        let visible = kv.visible(positions[row]);
        let reads = (row + 1).saturating_sub(window).max(visible.start)..visible.end;
        for (h, q) in query.chunks_exact(d).enumerate() {
            let g = h / group;
            scores.clear();
            scores.extend(
                visible
                    .clone()
                    .map(|t| scale * lanes_dot(q, &exact_keys[t * width + g * d..][..d])),
            );
            for (t, w) in visible.clone().zip(softmax(&scores)) {
                if reads.contains(&t) {
                    add(g, t, w);
                }
            }
        }
    }
}

/// [`CpuAttention`] plus the in-window attention measurement.
#[derive(Debug)]
pub(super) struct WindowAttentionProbe<'a> {
    attention: CpuAttention<'a>,
    /// Per layer, the exact keys `[tokens, kv_heads·head_dim]` in append order.
    exact_keys: Vec<Vec<f32>>,
    window: usize,
    record: WindowAttention,
}

impl<'a> WindowAttentionProbe<'a> {
    /// A probe over `attention` for a model of `layers` layers, with a window of `window`
    /// tokens (at least 1).
    pub(super) fn new(attention: CpuAttention<'a>, layers: usize, window: usize) -> Self {
        Self {
            attention,
            exact_keys: vec![Vec::new(); layers],
            window: window.max(1),
            record: WindowAttention {
                received: vec![Vec::new(); layers],
            },
        }
    }

    /// What was measured.
    pub(super) fn into_record(self) -> WindowAttention {
        self.record
    }
}

impl AttentionBackend for WindowAttentionProbe<'_> {
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
        self.attention
            .attend(layer, queries, keys, values, positions, shape, out)?;
        let layers = self.exact_keys.len();
        let (Some(exact), Some(received)) = (
            self.exact_keys.get_mut(layer),
            self.record.received.get_mut(layer),
        ) else {
            return Err(ModelError::InvalidCall(format!(
                "layer {layer} of a window-attention probe for {layers} layers"
            )));
        };
        exact.extend_from_slice(keys);
        let kv = self.attention.cache.kv(layer)?;
        let (d, kv_heads) = (kv.layout().head_dim, kv.layout().kv_heads);
        let width = kv_heads * d;
        if exact.len() != positions.len() * width || !shape.q_heads.is_multiple_of(kv_heads.max(1))
        {
            return Err(ModelError::InvalidCall(format!(
                "layer {layer}: the window-attention probe holds {} key floats for {} positions \
                 of {kv_heads}×{d} (a cache that started non-empty, or was truncated?)",
                exact.len(),
                positions.len()
            )));
        }
        received.resize(positions.len(), 0.0);
        let per_head = 1.0 / shape.q_heads as f64;
        add_window_weights(
            kv,
            exact,
            queries,
            positions,
            shape,
            self.window,
            |_, t, w| {
                received[t] += per_head * w;
            },
        );
        Ok(())
    }

    /// A KV-sharing layer attends as usual and is not measured.
    fn attend_shared(
        &mut self,
        layer: usize,
        queries: &[f32],
        positions: &[u32],
        shape: AttentionShape,
        out: &mut [f32],
    ) -> Result<(), ModelError> {
        self.attention
            .attend_shared(layer, queries, positions, shape, out)
    }
}

#[cfg(test)]
mod tests {
    use tq_cache::allocation::Allocation;
    use tq_cache::attention::AttentionKernel;

    use super::*;

    #[test]
    fn a_token_receives_the_weights_of_the_rows_of_its_window() {
        let f16 = Allocation::preset("f16").expect("the f16 preset");
        let mut cache = super::super::test_cache::one_layer(8, 2, None, &f16);
        let attention = CpuAttention {
            cache: &mut cache,
            kernel: AttentionKernel::Fused,
        };
        let mut probe = WindowAttentionProbe::new(attention, 1, 2);
        let keys = [0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.5, 0.5];
        let queries = [1.0, 0.0, 0.0, 2.0, 1.0, 1.0, 2.0, 1.0];
        let shape = AttentionShape {
            q_heads: 1,
            scale: 1.0,
        };
        let mut out = [0.0; 8];
        let positions = [0, 1, 2, 3];
        probe
            .attend(0, &queries, &keys, &[0.0; 8], &positions, shape, &mut out)
            .expect("attends");
        // Row r's weight on token t over tokens 0..=r, by hand.
        let weight = |r: usize, t: usize| {
            let q = &queries[2 * r..2 * r + 2];
            let score = |u: usize| f64::from(q[0] * keys[2 * u] + q[1] * keys[2 * u + 1]);
            score(t).exp() / (0..=r).map(|u| score(u).exp()).sum::<f64>()
        };
        // A 2-token window: token t is read in it by rows t and t + 1.
        let expected: Vec<f64> = (0..4)
            .map(|t| weight(t, t) + if t < 3 { weight(t + 1, t) } else { 0.0 })
            .collect();
        let got = &probe.into_record().received[0];
        for (g, e) in got.iter().zip(&expected) {
            assert!((g - e).abs() < 1e-6, "{got:?} vs {expected:?}");
        }
    }
}
