//! The exact reference: decode every visible key and value to f32, softmax in f64.
//!
//! Every fast path is tested against this function.

use rayon::prelude::*;

use super::{AttentionShape, check_shapes};
use crate::codec::CodecScratch;
use crate::error::CacheError;
use crate::heavy_hitters::{GatheredRow, ReceivedWeights};
use crate::kv_cache::KvCache;
/// Exact attention over the decoded cache, in the stored domain: the value means of centered
/// streams are added by [`attend`](super::attend), through which the public
/// [`reference_attention`](super::reference_attention) runs. `in_step`: see
/// [`attend_in_step`](super::attend_in_step).
///
/// `received`: also hand back each query's share of attention for the tokens of its windows
/// (the heavy-hitter counts, [`ReceivedWeights`]), the mean over each KV head's query heads.
pub(super) fn run(
    cache: &KvCache,
    (queries, query_positions): (&[f32], &[u32]),
    shape: AttentionShape,
    in_step: bool,
    out: &mut [f32],
    received: Option<&mut ReceivedWeights>,
) -> Result<(), CacheError> {
    let (n, group) = check_shapes(cache, queries, query_positions, shape, out)?;
    let d = cache.layout().head_dim;
    let q_heads = shape.q_heads;
    let kv_heads = cache.layout().kv_heads;
    let rows: Vec<GatheredRow> = match &received {
        Some(_) => (0..n * kv_heads)
            .map(|k| GatheredRow::of(cache, query_positions, k, in_step))
            .collect(),
        None => Vec::new(),
    };
    let gather = received.is_some();
    let probabilities: Vec<Vec<f64>> = out
        .par_chunks_mut(d)
        .enumerate()
        .map(|(row, o)| -> Result<Vec<f64>, CacheError> {
            let (i, h) = (row / q_heads, row % q_heads);
            let q = &queries[row * d..(row + 1) * d];
            let kv = h / group;
            let keys = cache.keys(kv);
            let values = cache.values(kv);
            let range = cache.visible(query_positions[i]);
            let range_start = range.start;
            let key_window = keys.window_start(range.end, in_step);
            let value_window = values.window_start(range.end, in_step);
            let mut scratch = CodecScratch::new(d);
            let mut k = vec![0.0f32; d];
            let mut v = vec![0.0f32; d];
            let mut scores = Vec::with_capacity(range.len());
            // A RoPE-aware center `c(t)` was subtracted from each stored key: `q·c(t)` back.
            let rope = keys.rope_center();
            let mut center = vec![0.0f32; d];
            let dot = |a: &[f32], b: &[f32]| -> f64 {
                a.iter()
                    .zip(b)
                    .map(|(x, y)| f64::from(*x) * f64::from(*y))
                    .sum()
            };
            for t in range.clone() {
                let codec = keys.decode_read(t, key_window, &mut scratch, &mut k)?;
                let correction = f64::from(codec.score_correction());
                let mut score = dot(q, &k) * correction;
                if let Some((m, pairs, angles)) = &rope {
                    crate::rope_center::center_at(m, t, *pairs, angles, &mut center);
                    score += dot(q, &center);
                }
                scores.push(f64::from(shape.scale) * score);
            }
            let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let mut acc = vec![0.0f64; d];
            let mut total = 0.0f64;
            for (t, s) in range.zip(&scores) {
                let p = (s - max).exp();
                total += p;
                values.decode_read(t, value_window, &mut scratch, &mut v)?;
                for (a, x) in acc.iter_mut().zip(&v) {
                    *a += p * f64::from(*x);
                }
            }
            for (o, a) in o.iter_mut().zip(&acc) {
                // A query that sees no token (possible only with an empty window) outputs zero.
                *o = if total > 0.0 { (a / total) as f32 } else { 0.0 };
            }
            if !gather || total <= 0.0 {
                return Ok(Vec::new());
            }
            let item = rows[i * kv_heads + kv];
            Ok(scores[item.first - range_start..]
                .iter()
                .map(|s| (s - max).exp() / total)
                .collect())
        })
        .collect::<Result<_, _>>()?;
    if let Some(received) = received {
        received.reset(rows.iter().copied());
        let stride = received.stride;
        for (row, p) in probabilities.iter().enumerate() {
            let item = (row / q_heads) * kv_heads + (row % q_heads) / group;
            let weights = &mut received.weights[item * stride..];
            for (w, &p) in weights.iter_mut().zip(p) {
                *w += (p / group as f64) as f32;
            }
        }
    }
    Ok(())
}
