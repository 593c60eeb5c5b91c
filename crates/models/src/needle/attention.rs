//! How much attention each query head pays to the needle while the model reads the question's
//! end and writes its answer: the instrument that finds a model's retrieval heads (the few
//! heads that copy the pass key out of the haystack), where the cache's error costs retrieval
//! most.
//!
//! An instrumented [`AttentionBackend`]: attention runs on the CPU cache as usual (the answer
//! is the allocation's own), and each query row from the prompt's last token on is also
//! scored against the *exact* keys of this run (kept by the probe, f32, RoPE applied), so the
//! weights measured are the model's, not the cache's rounding of them.

use std::ops::Range;

use tq_cache::attention::AttentionShape;

use crate::eval::score_probe::{dot, softmax};
use crate::llama::{AttentionBackend, CpuAttention, ModelError};

/// Per layer and query head, the softmax weight the model put on the needle's tokens,
/// summed over the scored query rows (the prompt's last token and each answer token).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NeedleAttention {
    /// `[layer][q_head]`: `Σ_rows Σ_{t ∈ needle} w_t`.
    mass: Vec<Vec<f64>>,
    /// `[layer]`: query rows scored (a layer the probe never saw, such as a KV-sharing one,
    /// keeps 0).
    rows: Vec<usize>,
}

impl NeedleAttention {
    /// Per layer and query head, the mean weight on the needle over the scored rows, in
    /// [0, 1] (a layer with no scored rows: zeros).
    pub fn mean_per_head(&self) -> Vec<Vec<f32>> {
        self.mass
            .iter()
            .zip(&self.rows)
            .map(|(heads, &rows)| {
                heads
                    .iter()
                    .map(|&m| (m / rows.max(1) as f64) as f32)
                    .collect()
            })
            .collect()
    }
}

/// A KV head ranked by how much its query heads read the needle.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RetrievalHead {
    /// The layer.
    pub layer: usize,
    /// The KV head within the layer.
    pub kv_head: usize,
    /// Over the cells, the mean of the largest needle weight among the query heads that
    /// share this KV head (one retrieving query head is enough to make its keys and values
    /// matter).
    pub weight: f64,
}

/// The KV heads of the cells `needle_attention` (each `[layer][q_head]`, as
/// [`NeedleRow::needle_attention`](super::NeedleRow::needle_attention) holds it), ranked by
/// [`RetrievalHead::weight`], largest first (ties: lower layer, then lower head). Query heads
/// `h` share KV head `h / (q_heads / kv_heads)`; cells without a measurement are skipped.
///
/// ```
/// use tq_models::needle::rank_retrieval_heads;
///
/// // One layer, 4 query heads over 2 KV heads; two cells.
/// let cells = [vec![vec![0.1f32, 0.0, 0.6, 0.2]], vec![vec![0.3, 0.1, 0.2, 0.0]]];
/// let ranked = rank_retrieval_heads(cells.iter().map(|c| c.as_slice()), 2);
/// assert_eq!((ranked[0].layer, ranked[0].kv_head), (0, 1));
/// assert!((ranked[0].weight - 0.4).abs() < 1e-6); // (0.6 + 0.2) / 2
/// assert!((ranked[1].weight - 0.2).abs() < 1e-6); // (0.1 + 0.3) / 2
/// ```
pub fn rank_retrieval_heads<'a>(
    cells: impl IntoIterator<Item = &'a [Vec<f32>]>,
    kv_heads: usize,
) -> Vec<RetrievalHead> {
    let mut sums: Vec<Vec<f64>> = Vec::new();
    let mut count = 0usize;
    for cell in cells {
        count += 1;
        if sums.len() < cell.len() {
            sums.resize(cell.len(), vec![0.0; kv_heads]);
        }
        for (layer, heads) in cell.iter().enumerate() {
            let group = (heads.len() / kv_heads.max(1)).max(1);
            for (kv_head, shared) in heads.chunks(group).take(kv_heads).enumerate() {
                let top = shared.iter().copied().fold(0f32, f32::max);
                sums[layer][kv_head] += f64::from(top);
            }
        }
    }
    let mut ranked: Vec<RetrievalHead> = sums
        .iter()
        .enumerate()
        .flat_map(|(layer, heads)| {
            heads
                .iter()
                .enumerate()
                .map(move |(kv_head, &sum)| RetrievalHead {
                    layer,
                    kv_head,
                    weight: sum / count.max(1) as f64,
                })
        })
        .collect();
    ranked.sort_by(|a, b| {
        b.weight
            .total_cmp(&a.weight)
            .then(a.layer.cmp(&b.layer))
            .then(a.kv_head.cmp(&b.kv_head))
    });
    ranked
}

/// [`CpuAttention`] plus the needle-weight measurement.
#[derive(Debug)]
pub(super) struct NeedleAttentionProbe<'a> {
    attention: CpuAttention<'a>,
    /// Per layer, the exact keys `[tokens, kv_heads·head_dim]` in append order.
    exact_keys: Vec<Vec<f32>>,
    /// The needle's token positions.
    needle: Range<usize>,
    /// The first query position scored.
    from: usize,
    record: NeedleAttention,
}

impl<'a> NeedleAttentionProbe<'a> {
    /// A probe over `attention` for a model of `layers` layers, measuring the weight on the
    /// tokens `needle` of query rows at positions `from` and later. A sliding-window layer
    /// scores only the tokens its window shows the query ([`KvCache::visible`]).
    ///
    /// [`KvCache::visible`]: tq_cache::kv_cache::KvCache::visible
    pub(super) fn new(
        attention: CpuAttention<'a>,
        layers: usize,
        needle: Range<usize>,
        from: usize,
    ) -> Self {
        Self {
            attention,
            exact_keys: vec![Vec::new(); layers],
            needle,
            from,
            record: NeedleAttention {
                mass: vec![Vec::new(); layers],
                rows: vec![0; layers],
            },
        }
    }

    /// What was measured.
    pub(super) fn into_record(self) -> NeedleAttention {
        self.record
    }
}

impl AttentionBackend for NeedleAttentionProbe<'_> {
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
        let (Some(exact), Some(mass), Some(rows)) = (
            self.exact_keys.get_mut(layer),
            self.record.mass.get_mut(layer),
            self.record.rows.get_mut(layer),
        ) else {
            return Err(ModelError::InvalidCall(format!(
                "layer {layer} of a needle probe for {layers} layers"
            )));
        };
        exact.extend_from_slice(keys);
        let kv = self.attention.cache.kv(layer)?;
        let (d, kv_heads) = (kv.layout().head_dim, kv.layout().kv_heads);
        let width = kv_heads * d;
        if exact.len() != positions.len() * width || !shape.q_heads.is_multiple_of(kv_heads.max(1))
        {
            return Err(ModelError::InvalidCall(format!(
                "layer {layer}: the needle probe holds {} key floats for {} positions of \
                 {kv_heads}×{d} (a cache that started non-empty, or was truncated?)",
                exact.len(),
                positions.len()
            )));
        }
        mass.resize(shape.q_heads, 0.0);
        let group = shape.q_heads / kv_heads;
        let n = queries.len() / (shape.q_heads * d).max(1);
        let first = positions.len() - n;
        let mut scores = Vec::new();
        for (i, query) in queries.chunks_exact(shape.q_heads * d).enumerate() {
            if first + i < self.from {
                continue;
            }
            // The tokens this layer shows the query (a sliding layer: its window).
            let visible = kv.visible(positions[first + i]);
            for (h, q) in query.chunks_exact(d).enumerate() {
                let g = h / group;
                scores.clear();
                scores.extend(
                    visible
                        .clone()
                        .map(|t| f64::from(shape.scale) * dot(q, &exact[t * width + g * d..][..d])),
                );
                mass[h] += (visible.clone().zip(softmax(&scores)))
                    .filter(|(t, _)| self.needle.contains(t))
                    .map(|(_, w)| w)
                    .sum::<f64>();
            }
            *rows += 1;
        }
        Ok(())
    }

    /// A KV-sharing layer attends as usual and is not measured (its row of the record stays
    /// zero): its keys are its producer's, whose own query heads are.
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
    use tq_cache::states::ModelCache;

    use super::*;

    /// An f16 cache of one layer with one KV head of dimension 2, growing or sliding over
    /// `window` tokens.
    fn cache(tokens: usize, window: Option<usize>) -> ModelCache {
        let f16 = Allocation::preset("f16").expect("the f16 preset");
        super::super::test_cache::one_layer(tokens, 2, window, &f16)
    }

    #[test]
    fn weights_on_the_needle_follow_the_softmax_of_the_exact_scores() {
        let mut cache = cache(8, None);
        let attention = CpuAttention {
            cache: &mut cache,
            kernel: AttentionKernel::Fused,
        };
        // Four tokens in two calls; the needle is token 1. One query head; positions 0-2 come
        // before `from` and are not scored.
        let mut probe = NeedleAttentionProbe::new(attention, 1, 1..2, 3);
        let keys = [0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.5, 0.5];
        let values = [0.0; 8];
        let queries = [0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 2.0, 1.0];
        let positions = [0, 1, 2, 3];
        let shape = AttentionShape {
            q_heads: 1,
            scale: 1.0,
        };
        let mut out = [0.0; 4];
        probe
            .attend(
                0,
                &queries[..4],
                &keys[..4],
                &values[..4],
                &positions[..2],
                shape,
                &mut out,
            )
            .expect("attends");
        let mut out = [0.0; 4];
        probe
            .attend(
                0,
                &queries[4..],
                &keys[4..],
                &values[4..],
                &positions,
                shape,
                &mut out,
            )
            .expect("attends");
        let record = probe.into_record();
        // Position 3's query (2, 1) scores 0, 2, 1, 1.5 against the four keys.
        let scores: [f64; 4] = [0.0, 2.0, 1.0, 1.5];
        let total: f64 = scores.iter().map(|s| s.exp()).sum();
        let expected = 2f64.exp() / total;
        let got = record.mean_per_head()[0][0];
        assert!(
            (f64::from(got) - expected).abs() < 1e-6,
            "{got} vs {expected}"
        );
    }

    #[test]
    fn a_sliding_window_hides_a_needle_behind_it() {
        // The needle is token 0, whose key scores 9 against every query; position 3 with a
        // window of 3 sees tokens 1..=3 only.
        let weight = |window: Option<usize>| {
            let mut cache = cache(8, window);
            let attention = CpuAttention {
                cache: &mut cache,
                kernel: AttentionKernel::Fused,
            };
            let mut probe = NeedleAttentionProbe::new(attention, 1, 0..1, 3);
            let keys = [9.0, 0.0, 0.0, 1.0, 0.5, 0.5, 1.0, 1.0];
            let shape = AttentionShape {
                q_heads: 1,
                scale: 1.0,
            };
            let positions = [0, 1, 2, 3];
            let mut out = [0.0; 8];
            let result = probe.attend(0, &[1.0; 8], &keys, &[0.0; 8], &positions, shape, &mut out);
            result.expect("attends");
            probe.into_record().mean_per_head()[0][0]
        };
        assert_eq!(weight(Some(3)), 0.0);
        assert!(weight(None) > 0.99, "{}", weight(None));
    }
}
