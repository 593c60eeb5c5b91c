//! An instrumented [`AttentionBackend`]: attention runs on the CPU cache as usual, and every
//! layer call also scores its queries twice — against the exact keys (f32, kept by the probe)
//! and against the keys as the compressed cache stores them — to measure per layer how far
//! quantization moves the attention scores and weights.
//!
//! Both score sets use the same queries and the same RoPE'd keys of *this* run, so the error
//! is the cache's alone, not the drift of the hidden states that earlier quantized layers
//! cause (that drift is what the KL divergence measures).

use std::time::Instant;

use rayon::prelude::*;
use serde::Serialize;
use tq_cache::CacheError;
use tq_cache::attention::{AttentionKernel, AttentionShape};
use tq_cache::codec::CodecScratch;
use tq_cache::kv_cache::KvCache;
use tq_cache::states::ModelCache;

use crate::llama::{AttentionBackend, CpuAttention, ModelError};

/// Sums of the score differences of one layer over all its query rows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct LayerScoreStats {
    /// `Σ (s̃ − s)²` over every (query row, visible key) pair, `s = scale·⟨q, k⟩`.
    pub squared_error: f64,
    /// `Σ s²` over the same pairs.
    pub squared_exact: f64,
    /// `Σ` over query rows of the total-variation distance `½ Σ_t |p̃_t − p_t|` between the
    /// softmax weights of the compressed and the exact scores.
    pub weight_tv_sum: f64,
    /// Query rows (query token × query head) scored.
    pub rows: usize,
}

impl LayerScoreStats {
    /// `‖s̃ − s‖ / ‖s‖` over every score of the layer (0 when nothing was scored).
    pub fn relative_error(&self) -> f64 {
        if self.squared_exact > 0.0 {
            (self.squared_error / self.squared_exact).sqrt()
        } else {
            0.0
        }
    }

    /// Mean total-variation distance of the attention weights per query row, in [0, 1].
    pub fn mean_weight_tv(&self) -> f64 {
        self.weight_tv_sum / self.rows.max(1) as f64
    }

    fn merge(self, other: Self) -> Self {
        Self {
            squared_error: self.squared_error + other.squared_error,
            squared_exact: self.squared_exact + other.squared_exact,
            weight_tv_sum: self.weight_tv_sum + other.weight_tv_sum,
            rows: self.rows + other.rows,
        }
    }
}

/// Squared reconstruction error of one layer's key (or value) vectors as the compressed body
/// stores them, against the vectors themselves: what the distance to the rate-distortion
/// limit is computed from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct ReconstructionStats {
    /// `Σ ‖x − x̃‖²` over every appended vector of every KV head.
    pub squared_error: f64,
    /// `Σ ‖x‖²` over the same vectors (the uncentered energy: a lever that shrinks the source,
    /// such as mean-centering, counts as a gain).
    pub squared_energy: f64,
    /// Vectors measured.
    pub vectors: usize,
}

impl ReconstructionStats {
    /// `Σ ‖x − x̃‖² / Σ ‖x‖²`: the MSE per coordinate for a source of unit variance per
    /// coordinate (0 when nothing was measured).
    pub fn relative_mse(&self) -> f64 {
        if self.squared_energy > 0.0 {
            self.squared_error / self.squared_energy
        } else {
            0.0
        }
    }

    /// `10·log10(relative MSE · 4^bits)`: dB above the Gaussian rate-distortion limit `4^(−b)`
    /// at `bits` per value (0 dB = the limit; scalar Lloyd-Max sits 2.6–3.9 dB above it at
    /// 2–4 code bits). `None` when nothing was measured or the error is exactly zero.
    pub fn distance_db(&self, bits: f64) -> Option<f64> {
        let mse = self.relative_mse();
        (mse > 0.0).then(|| 10.0 * (mse * 4f64.powf(bits)).log10())
    }

    fn add(&mut self, exact: &[f32], stored: &[f32]) {
        for (&x, &y) in exact.iter().zip(stored) {
            let (x, y) = (f64::from(x), f64::from(y));
            self.squared_error += (x - y) * (x - y);
            self.squared_energy += x * x;
        }
        self.vectors += 1;
    }
}

/// What a [`ScoreProbe`] keeps between calls: the exact keys and values of every layer and the
/// running statistics. Owned by the caller so that one record spans many forward calls (chunks).
#[derive(Clone, Debug, Default)]
pub struct ScoreRecord {
    /// Per layer, the exact keys `[tokens, kv_heads·head_dim]` in append order.
    exact_keys: Vec<Vec<f32>>,
    /// Per layer, the exact values, likewise: a token whose codes are written late (an 8-bit
    /// window holds the only copy of its tokens until they leave it) is compared when they are.
    exact_values: Vec<Vec<f32>>,
    /// Per layer, `[keys, values]`, per KV head: the tokens of a growing stream whose body
    /// records were compared so far.
    measured: Vec<[Vec<usize>; 2]>,
    /// Per layer statistics.
    stats: Vec<LayerScoreStats>,
    /// Per layer `[keys, values]` reconstruction error of the compressed body.
    reconstruction: Vec<[ReconstructionStats; 2]>,
    /// Seconds spent on the extra scoring (to subtract from throughput figures).
    seconds: f64,
}

impl ScoreRecord {
    /// An empty record for a model of `layers` layers.
    pub fn new(layers: usize) -> Self {
        Self {
            exact_keys: vec![Vec::new(); layers],
            exact_values: vec![Vec::new(); layers],
            measured: vec![[Vec::new(), Vec::new()]; layers],
            stats: vec![LayerScoreStats::default(); layers],
            reconstruction: vec![[ReconstructionStats::default(); 2]; layers],
            seconds: 0.0,
        }
    }

    /// Per layer statistics so far.
    pub fn stats(&self) -> &[LayerScoreStats] {
        &self.stats
    }

    /// Per layer `[keys, values]` reconstruction error of the compressed body so far.
    pub fn reconstruction(&self) -> &[[ReconstructionStats; 2]] {
        &self.reconstruction
    }

    /// Seconds the probe spent on its own scoring so far.
    pub fn seconds(&self) -> f64 {
        self.seconds
    }
}

/// [`CpuAttention`] plus the per layer score comparison.
#[derive(Debug)]
pub struct ScoreProbe<'a> {
    /// The attention that produces the model's output (unchanged by the probe).
    pub attention: CpuAttention<'a>,
    /// Where the exact keys and statistics accumulate.
    pub record: &'a mut ScoreRecord,
}

impl<'a> ScoreProbe<'a> {
    /// A probe over `cache` with `kernel`, accumulating into `record`.
    pub fn new(
        cache: &'a mut ModelCache,
        kernel: AttentionKernel,
        record: &'a mut ScoreRecord,
    ) -> Self {
        Self {
            attention: CpuAttention { cache, kernel },
            record,
        }
    }
}

impl AttentionBackend for ScoreProbe<'_> {
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
        let clock = Instant::now();
        let layers = self.record.exact_keys.len();
        let (Some(exact), Some(stats)) = (
            self.record.exact_keys.get_mut(layer),
            self.record.stats.get_mut(layer),
        ) else {
            return Err(ModelError::InvalidCall(format!(
                "layer {layer} of a score record for {layers} layers"
            )));
        };
        exact.extend_from_slice(keys);
        let kv = self.attention.cache.kv(layer)?;
        let width = shape.q_heads * kv.layout().head_dim;
        let n = queries.len() / width.max(1);
        let query_positions = &positions[positions.len().saturating_sub(n)..];
        let layer_stats = score_error(kv, exact, queries, query_positions, shape)?;
        *stats = stats.merge(layer_stats);
        let new_tokens = keys.len() / (kv.layout().kv_heads * kv.layout().head_dim).max(1);
        let exact_values = &mut self.record.exact_values[layer];
        exact_values.extend_from_slice(values);
        if let Some(record) = self.record.reconstruction.get_mut(layer) {
            let exact = [&exact[..], &exact_values[..]];
            body_error(
                kv,
                exact,
                new_tokens,
                &mut self.record.measured[layer],
                record,
            )?;
        }
        self.record.seconds += clock.elapsed().as_secs_f64();
        Ok(())
    }
}

/// Scores `queries` (`[n, q_heads·head_dim]` at `query_positions`) against the cache's stored
/// keys and against `exact_keys` (`[kv.len(), kv_heads·head_dim]`), over each query's visible
/// tokens.
fn score_error(
    kv: &KvCache,
    exact_keys: &[f32],
    queries: &[f32],
    query_positions: &[u32],
    shape: AttentionShape,
) -> Result<LayerScoreStats, CacheError> {
    let layout = kv.layout();
    let (d, kv_heads) = (layout.head_dim, layout.kv_heads);
    let width = kv_heads * d;
    if exact_keys.len() != kv.len() * width {
        return Err(CacheError::ShapeMismatch {
            what: "exact keys kept by the score probe (the cache was truncated or shared?)",
            expected: kv.len() * width,
            actual: exact_keys.len(),
        });
    }
    if shape.q_heads == 0 || !shape.q_heads.is_multiple_of(kv_heads) {
        return Err(CacheError::InvalidConfig(format!(
            "{} query heads cannot share {kv_heads} KV heads evenly",
            shape.q_heads
        )));
    }
    if queries.len() != query_positions.len() * shape.q_heads * d {
        return Err(CacheError::ShapeMismatch {
            what: "queries",
            expected: query_positions.len() * shape.q_heads * d,
            actual: queries.len(),
        });
    }
    let group = shape.q_heads / kv_heads;
    let first = kv.first_stored();
    // Decode every stored key once per call (not once per query row): `[len − first, d]` per
    // head with the codec's score correction per token.
    let decoded: Vec<(Vec<f32>, Vec<f32>)> = (0..kv_heads)
        .into_par_iter()
        .map(|h| -> Result<_, CacheError> {
            let stream = kv.keys(h);
            let mut scratch = CodecScratch::new(d);
            let mut keys = vec![0.0f32; (kv.len() - first) * d];
            let mut corrections = Vec::with_capacity(kv.len() - first);
            for (t, row) in (first..kv.len()).zip(keys.chunks_exact_mut(d)) {
                // True keys (a centered stream's mean added back): the exact scores are
                // compared with these, not with the stored domain's shifted ones.
                stream.reconstruct(t, &mut scratch, row)?;
                corrections.push(
                    stream
                        .token(t)
                        .map_or(1.0, |(c, _, _)| c.score_correction()),
                );
            }
            Ok((keys, corrections))
        })
        .collect::<Result<_, _>>()?;
    let rows = query_positions.len() * shape.q_heads;
    let scale = f64::from(shape.scale);
    // Rows are summed in order after a parallel map, not by rayon's `reduce`, whose grouping
    // depends on work stealing: the figures must not change with the thread count.
    let per_row: Vec<LayerScoreStats> = (0..rows)
        .into_par_iter()
        .map(|row| {
            let (i, h) = (row / shape.q_heads, row % shape.q_heads);
            let kv_head = h / group;
            let q = &queries[row * d..(row + 1) * d];
            let (stored, corrections) = &decoded[kv_head];
            let range = kv.visible(query_positions[i]);
            let mut exact = Vec::with_capacity(range.len());
            let mut approx = Vec::with_capacity(range.len());
            for t in range {
                let e = &exact_keys[t * width + kv_head * d..t * width + (kv_head + 1) * d];
                let s = &stored[(t - first) * d..(t - first + 1) * d];
                exact.push(scale * dot(q, e));
                approx.push(scale * dot(q, s) * f64::from(corrections[t - first]));
            }
            row_stats(&exact, &approx)
        })
        .collect();
    Ok(per_row
        .into_iter()
        .fold(LayerScoreStats::default(), LayerScoreStats::merge))
}

/// Adds the reconstruction error of the key and value records the body gained since the last
/// call, as the compressed body stores them — not the full-precision sink or recent copies
/// attention may read instead, so the figure is the codec's — with a centered stream's mean
/// added back. `exact` holds every token's `[keys, values]` (`[tokens, kv_heads·head_dim]`).
/// A growing stream's body holds tokens `0..body.len()` (with an 8-bit window, only those that
/// have left it: their codes are written then), so each token is compared once, when its
/// record appears (`measured` remembers where each stream stopped); a ring compares the `n`
/// newest tokens, whose records it holds.
fn body_error(
    kv: &KvCache,
    exact: [&[f32]; 2],
    n: usize,
    measured: &mut [Vec<usize>; 2],
    out: &mut [ReconstructionStats; 2],
) -> Result<(), CacheError> {
    let layout = kv.layout();
    let (d, heads) = (layout.head_dim, layout.kv_heads);
    let mut scratch = CodecScratch::new(d);
    let mut stored = vec![0.0f32; d];
    let len = kv.len();
    for (which, (slot, done)) in out.iter_mut().zip(measured.iter_mut()).enumerate() {
        done.resize(heads, 0);
        for (h, next) in done.iter_mut().enumerate() {
            let stream = if which == 0 { kv.keys(h) } else { kv.values(h) };
            let tokens = match layout.ring_slots() {
                Some(_) => len - n..len,
                None => *next..stream.body().len().min(len),
            };
            for t in tokens.clone() {
                let index = stream.body_slot(t);
                let Some((record, scales)) = stream.body().record_copy(index) else {
                    continue;
                };
                stream
                    .codec()
                    .decode_into(&record, scales, &mut scratch, &mut stored)?;
                stream.add_center(t, &mut stored);
                let Some(x) = exact[which].get((t * heads + h) * d..(t * heads + h + 1) * d) else {
                    continue;
                };
                slot.add(x, &stored);
            }
            *next = (*next).max(tokens.end);
        }
    }
    Ok(())
}

pub(crate) fn dot(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| f64::from(x) * f64::from(y))
        .sum()
}

/// The softmax weights of `scores` (shifted by their maximum, so no score overflows).
pub(crate) fn softmax(scores: &[f64]) -> impl Iterator<Item = f64> {
    let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let w: Vec<f64> = scores.iter().map(|x| (x - max).exp()).collect();
    let total: f64 = w.iter().sum();
    w.into_iter().map(move |x| x / total)
}

/// The statistics of one query row from its exact and compressed scores.
fn row_stats(exact: &[f64], approx: &[f64]) -> LayerScoreStats {
    if exact.is_empty() {
        return LayerScoreStats::default();
    }
    let squared_error = exact.iter().zip(approx).map(|(e, a)| (a - e).powi(2)).sum();
    let squared_exact = exact.iter().map(|e| e * e).sum();
    let weight_tv_sum = 0.5
        * softmax(exact)
            .zip(softmax(approx))
            .map(|(p, q)| (p - q).abs())
            .sum::<f64>();
    LayerScoreStats {
        squared_error,
        squared_exact,
        weight_tv_sum,
        rows: 1,
    }
}
