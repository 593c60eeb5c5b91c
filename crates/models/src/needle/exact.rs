//! An oracle for per-token precision: the needle's own tokens read exactly, every other token
//! as the cache stores it — what keeping just those tokens at full precision could buy at
//! most, before anyone builds a policy that would find them.
//!
//! An instrumented [`AttentionBackend`]: attention runs on the CPU cache as usual, then each
//! query row that reads the whole needle from the compressed body has the needle's share of
//! its output swapped for the exact one. With `Z = Σ_t e^{s̃_t}` over the row's visible tokens
//! (the scores of the records the kernel read: body codes, or the 8-bit or f16 copies of the
//! row's window and sinks) and the cache's output `o`, the row becomes
//!
//! ```text
//! (o·Z − Σ_n e^{s̃_n}·ṽ_n + Σ_n e^{s_n}·v_n) / (Z − Σ_n e^{s̃_n} + Σ_n e^{s_n})
//! ```
//!
//! over the needle's tokens `n` (`s`, `v` exact; `s̃`, `ṽ` the stored ones) — the softmax over
//! the same tokens with the needle's scores and values replaced. With keys only, `v_n = ṽ_n`;
//! with values only, `s_n = s̃_n`. Rows whose window still holds part of the needle read it at
//! the window's precision already and are left as the cache wrote them.

use std::ops::Range;

use rayon::prelude::*;
use serde::Serialize;
use tq_cache::CacheError;
use tq_cache::attention::AttentionShape;
use tq_cache::codec::CodecScratch;
use tq_cache::stream::Stream;

use crate::llama::{AttentionBackend, CpuAttention, ModelError};

/// Which of the needle's streams an [`ExactNeedle`] run reads exactly.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum NeedleStreams {
    /// The needle's keys (its values as stored).
    Keys,
    /// The needle's values (its keys as stored).
    Values,
    /// Both.
    Both,
}

impl NeedleStreams {
    fn keys(self) -> bool {
        matches!(self, Self::Keys | Self::Both)
    }

    fn values(self) -> bool {
        matches!(self, Self::Values | Self::Both)
    }
}

/// Read the needle's own tokens exactly, every other token as the cache stores it — an
/// oracle for per-token precision ([`NeedleOptions::exact_needle`](super::NeedleOptions::exact_needle)).
///
/// Each query row that reads the whole needle from the compressed body has the needle's
/// share of its softmax swapped: with the cache's output `o`, `Z = Σ_t e^{s̃_t}` over the
/// records the kernel read, the stored scores and values `s̃`, `ṽ` and the exact `s`, `v` of
/// the needle's tokens `n`, the row becomes
/// `(o·Z − Σ_n e^{s̃_n}·ṽ_n + Σ_n e^{s_n}·v_n) / (Z − Σ_n e^{s̃_n} + Σ_n e^{s_n})`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ExactNeedle {
    /// Which streams.
    pub streams: NeedleStreams,
    /// The layers where the needle is read exactly (the others read the cache as usual).
    pub layers: Range<usize>,
    /// Only the rows from the prompt's last token on (the answer's), as a cache would that
    /// chose the needle's tokens when the prompt ends; otherwise every row after the needle.
    pub answer_only: bool,
}

/// [`CpuAttention`] with the needle's tokens swapped for their exact keys and values.
#[derive(Debug)]
pub(super) struct ExactNeedleAttention<'a> {
    attention: CpuAttention<'a>,
    exact: ExactNeedle,
    /// The needle's token indices.
    needle: Range<usize>,
    /// The first query row (token index) swapped.
    from: usize,
    /// Per layer, the needle's exact `[keys, values]` (`[tokens, kv_heads·head_dim]`), in
    /// token order, as they arrive.
    kept: Vec<[Vec<f32>; 2]>,
    /// Per layer, the query rows (per query head) whose output was swapped.
    swapped: Vec<usize>,
}

impl<'a> ExactNeedleAttention<'a> {
    /// The oracle over `attention` for a model of `layers` layers, the needle at token
    /// indices `needle` and the prompt's last token at `last_prompt_token`.
    pub(super) fn new(
        attention: CpuAttention<'a>,
        layers: usize,
        needle: Range<usize>,
        last_prompt_token: usize,
        exact: ExactNeedle,
    ) -> Self {
        Self {
            attention,
            from: if exact.answer_only {
                last_prompt_token
            } else {
                needle.end
            },
            exact,
            needle,
            kept: vec![[Vec::new(), Vec::new()]; layers],
            swapped: vec![0; layers],
        }
    }

    /// Per layer, how many (query row, query head) outputs were swapped.
    pub(super) fn swapped(&self) -> &[usize] {
        &self.swapped
    }
}

impl AttentionBackend for ExactNeedleAttention<'_> {
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
        let layers = self.kept.len();
        let Some(kept) = self.kept.get_mut(layer) else {
            return Err(ModelError::InvalidCall(format!(
                "layer {layer} of an exact-needle oracle for {layers} layers"
            )));
        };
        let kv = self.attention.cache.kv(layer)?;
        let (d, kv_heads) = (kv.layout().head_dim, kv.layout().kv_heads);
        let width = kv_heads * d;
        let n = keys.len() / width.max(1);
        let first = positions.len() - n;
        for t in self.needle.start.max(first)..self.needle.end.min(positions.len()) {
            let i = t - first;
            kept[0].extend_from_slice(&keys[i * width..(i + 1) * width]);
            kept[1].extend_from_slice(&values[i * width..(i + 1) * width]);
        }
        let held = self.needle.end.min(positions.len()) - self.needle.start.min(positions.len());
        if kept[0].len() != held * width {
            return Err(ModelError::InvalidCall(format!(
                "layer {layer}: the exact-needle oracle holds {} key floats for {held} needle \
                 tokens of {kv_heads}×{d} (a cache that started non-empty, or was truncated?)",
                kept[0].len()
            )));
        }
        if !self.exact.layers.contains(&layer) || held < self.needle.len() || self.needle.is_empty()
        {
            return Ok(());
        }
        if !shape.q_heads.is_multiple_of(kv_heads.max(1)) {
            return Err(ModelError::InvalidCall(format!(
                "{} query heads cannot share {kv_heads} KV heads evenly",
                shape.q_heads
            )));
        }
        // Rows before `from` are left as the cache wrote them.
        let skip = self.from.saturating_sub(first).min(n);
        let row_width = shape.q_heads * d;
        let swapped = swap_needle(
            kv,
            [&kept[0], &kept[1]],
            &self.needle,
            self.exact.streams,
            &queries[skip * row_width..],
            &positions[first + skip..],
            shape,
            &mut out[skip * row_width..],
        )?;
        self.swapped[layer] += swapped;
        Ok(())
    }

    /// A KV-sharing layer attends as usual: its producer's keys and values are swapped where
    /// that layer is.
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

/// One stream's tokens as a query reads them: the body's records (`body`, sinks as their
/// copies) from `first` on, and the window copies (`window`) from `window_from` on, each as a
/// true vector (a centered stream's center added back) with the codec's score correction.
struct Decoded {
    first: usize,
    body: Vec<f32>,
    window_from: usize,
    window: Vec<f32>,
    corrections: [Vec<f32>; 2],
}

impl Decoded {
    /// Decodes tokens `first..body_end` from the body (window start `len`: every token but a
    /// sink from its codes) and `window_from..len` from their copies (window start 0).
    fn new(
        stream: &Stream,
        first: usize,
        body_end: usize,
        window_from: usize,
        d: usize,
    ) -> Result<Self, CacheError> {
        let len = stream.len();
        let mut scratch = CodecScratch::new(d);
        let mut read = |tokens: Range<usize>, window_start: usize| {
            let mut vectors = vec![0.0f32; tokens.len() * d];
            let mut corrections = Vec::with_capacity(tokens.len());
            for (t, row) in tokens.zip(vectors.chunks_exact_mut(d)) {
                let codec = stream.decode_read(t, window_start, &mut scratch, row)?;
                corrections.push(codec.score_correction());
                stream.add_center(t, row);
            }
            Ok::<_, CacheError>((vectors, corrections))
        };
        let (body, body_corrections) = read(first..body_end.max(first), len)?;
        let (window, window_corrections) = read(window_from..len, 0)?;
        Ok(Self {
            first,
            body,
            window_from,
            window,
            corrections: [body_corrections, window_corrections],
        })
    }

    /// Token `t`'s vector and score correction for a query whose window starts at
    /// `window_start`.
    fn token(&self, t: usize, window_start: usize, d: usize) -> (&[f32], f32) {
        if t >= window_start {
            let i = t - self.window_from;
            (&self.window[i * d..(i + 1) * d], self.corrections[1][i])
        } else {
            let i = t - self.first;
            (&self.body[i * d..(i + 1) * d], self.corrections[0][i])
        }
    }
}

/// Swaps the needle's share of each query row's output (see the module documentation) where
/// the row reads the whole needle from the compressed body; returns how many (row, query head)
/// outputs it swapped.
#[allow(clippy::too_many_arguments)]
fn swap_needle(
    kv: &tq_cache::kv_cache::KvCache,
    exact: [&[f32]; 2],
    needle: &Range<usize>,
    streams: NeedleStreams,
    queries: &[f32],
    query_positions: &[u32],
    shape: AttentionShape,
    out: &mut [f32],
) -> Result<usize, ModelError> {
    let layout = kv.layout();
    let (d, kv_heads) = (layout.head_dim, layout.kv_heads);
    let width = kv_heads * d;
    let group = shape.q_heads / kv_heads;
    // Per query row, where its key and value windows start, per KV head; `None` where the row
    // does not read the whole needle from the body.
    let windows: Vec<Option<Vec<[usize; 2]>>> = query_positions
        .iter()
        .map(|&p| {
            let visible = kv.visible(p);
            (0..kv_heads)
                .map(|h| {
                    let starts =
                        [kv.keys(h), kv.values(h)].map(|s| s.window_start(visible.end, true));
                    let stored = [kv.keys(h), kv.values(h)]
                        .iter()
                        .all(|s| needle.start >= s.sink_end().max(s.first_stored()));
                    let body = needle.start >= visible.start
                        && needle.end <= starts[0].min(starts[1])
                        && stored;
                    body.then_some(starts)
                })
                .collect()
        })
        .collect();
    let len = kv.len();
    let first = kv.first_stored();
    // Per KV head, the keys of every token its rows read, in both versions where rows differ
    // (the body's codes before the row's window, copies in it); the needle's values.
    let decoded: Vec<Option<[Decoded; 2]>> = (0..kv_heads)
        .into_par_iter()
        .map(|h| -> Result<_, CacheError> {
            let starts = windows.iter().flatten().map(|heads| heads[h][0]);
            let (Some(earliest), Some(latest)) = (starts.clone().min(), starts.max()) else {
                return Ok(None);
            };
            Ok(Some([
                Decoded::new(kv.keys(h), first, latest, earliest, d)?,
                Decoded::new(kv.values(h), needle.start, needle.end, len, d)?,
            ]))
        })
        .collect::<Result<_, _>>()?;
    let scale = f64::from(shape.scale);
    let swapped = out
        .par_chunks_mut(d)
        .enumerate()
        .map(|(row, o)| {
            let (i, h) = (row / shape.q_heads, row % shape.q_heads);
            let g = h / group;
            let Some(heads) = &windows[i] else {
                return 0;
            };
            let [key_window, _] = heads[g];
            let q = &queries[row * d..(row + 1) * d];
            let Some([keys, values]) = &decoded[g] else {
                return 0;
            };
            let visible = kv.visible(query_positions[i]);
            let stored: Vec<f64> = visible
                .clone()
                .map(|t| {
                    let (k, correction) = keys.token(t, key_window, d);
                    scale * lanes_dot(q, k) * f64::from(correction)
                })
                .collect();
            let needle_stored = &stored[needle.start - visible.start..needle.end - visible.start];
            let needle_exact: Vec<f64> = needle
                .clone()
                .map(|t| {
                    let k = &exact[0][(t - needle.start) * width + g * d..][..d];
                    scale * lanes_dot(q, k)
                })
                .collect();
            let new_scores = if streams.keys() {
                &needle_exact[..]
            } else {
                needle_stored
            };
            let max = stored
                .iter()
                .chain(new_scores)
                .copied()
                .fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = stored.iter().map(|s| (s - max).exp()).sum();
            let mut total = z;
            let mut sum: Vec<f64> = o.iter().map(|&x| f64::from(x) * z).collect();
            for (j, t) in needle.clone().enumerate() {
                let (old_w, new_w) = ((needle_stored[j] - max).exp(), (new_scores[j] - max).exp());
                let (stored_v, _) = values.token(t, len, d);
                let new_v = if streams.values() {
                    &exact[1][(t - needle.start) * width + g * d..][..d]
                } else {
                    stored_v
                };
                for ((s, &a), &b) in sum.iter_mut().zip(stored_v).zip(new_v) {
                    *s += new_w * f64::from(b) - old_w * f64::from(a);
                }
                total += new_w - old_w;
            }
            for (x, s) in o.iter_mut().zip(&sum) {
                *x = (s / total) as f32;
            }
            1
        })
        .sum();
    Ok(swapped)
}

/// `q·k` in f32 over eight lanes (vectorized), summed in f64: the instruments score every
/// visible token of a row (here for the partition function, whose precision only scales the
/// swap; in the window probe for ranks).
pub(super) fn lanes_dot(q: &[f32], k: &[f32]) -> f64 {
    let mut lanes = [0.0f32; 8];
    let (q8, k8) = (q.chunks_exact(8), k.chunks_exact(8));
    let tail: f32 = q8
        .remainder()
        .iter()
        .zip(k8.remainder())
        .map(|(a, b)| a * b)
        .sum();
    for (a, b) in q8.zip(k8) {
        for j in 0..8 {
            lanes[j] += a[j] * b[j];
        }
    }
    lanes.iter().map(|&x| f64::from(x)).sum::<f64>() + f64::from(tail)
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;
    use tq_cache::allocation::Allocation;
    use tq_cache::attention::AttentionKernel;
    use tq_cache::states::ModelCache;

    use super::*;

    const D: usize = 16;
    const TOKENS: usize = 12;
    const NEEDLE: Range<usize> = 4..6;
    const SHAPE: AttentionShape = AttentionShape {
        q_heads: 2,
        scale: 0.25,
    };

    fn allocation(extra: &str) -> Allocation {
        Allocation::from_toml_str(&format!(
            "name = \"t\"\nkey = {{ codec = \"mse\", bits = 2{extra} }}\n\
             value = {{ codec = \"mse\", bits = 2 }}\n"
        ))
        .expect("a test allocation")
    }

    /// `[queries, keys, values]` of `TOKENS` tokens, random.
    fn inputs() -> [Vec<f32>; 3] {
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let mut draw = |n: usize| (0..n).map(|_| rng.random_range(-2.0f32..2.0)).collect();
        [draw(TOKENS * 2 * D), draw(TOKENS * D), draw(TOKENS * D)]
    }

    /// The attention output of every row (one call over all tokens), with the oracle reading
    /// `streams` exactly, or the plain cache; the cache after it; the swapped count.
    fn run(alloc: &Allocation, streams: Option<NeedleStreams>) -> (Vec<f32>, ModelCache, usize) {
        let mut cache = crate::needle::test_cache::one_layer(TOKENS, D, None, alloc);
        let [queries, keys, values] = inputs();
        let positions: Vec<u32> = (0..TOKENS as u32).collect();
        let mut out = vec![0.0f32; queries.len()];
        let attention = CpuAttention {
            cache: &mut cache,
            kernel: AttentionKernel::Fused,
        };
        let swapped = match streams {
            Some(streams) => {
                let exact = ExactNeedle {
                    streams,
                    layers: 0..1,
                    answer_only: false,
                };
                let mut oracle = ExactNeedleAttention::new(attention, 1, NEEDLE, TOKENS - 1, exact);
                oracle
                    .attend(0, &queries, &keys, &values, &positions, SHAPE, &mut out)
                    .expect("attends");
                oracle.swapped()[0]
            }
            None => {
                let mut attention = attention;
                attention
                    .attend(0, &queries, &keys, &values, &positions, SHAPE, &mut out)
                    .expect("attends");
                0
            }
        };
        (out, cache, swapped)
    }

    /// Row `i`, head `h` by hand: the softmax over tokens `0..=i` of the cache's decoded keys
    /// and values, the needle's replaced by the exact ones where `streams` says.
    fn by_hand(cache: &ModelCache, i: usize, h: usize, streams: NeedleStreams) -> Vec<f64> {
        let [queries, keys, values] = inputs();
        let kv = cache.kv(0).expect("layer 0");
        let mut scratch = CodecScratch::new(D);
        let q = &queries[(i * 2 + h) * D..][..D];
        let mut scores = Vec::new();
        let mut vectors = Vec::new();
        for t in 0..=i {
            let (mut k, mut v) = (vec![0.0f32; D], vec![0.0f32; D]);
            kv.keys(0)
                .reconstruct(t, &mut scratch, &mut k)
                .expect("key");
            kv.values(0)
                .reconstruct(t, &mut scratch, &mut v)
                .expect("value");
            if NEEDLE.contains(&t) && streams.keys() {
                k.copy_from_slice(&keys[t * D..(t + 1) * D]);
            }
            if NEEDLE.contains(&t) && streams.values() {
                v.copy_from_slice(&values[t * D..(t + 1) * D]);
            }
            let s: f64 = q
                .iter()
                .zip(&k)
                .map(|(&a, &b)| f64::from(a) * f64::from(b))
                .sum();
            scores.push(f64::from(SHAPE.scale) * s);
            vectors.push(v);
        }
        let weights: Vec<f64> = crate::eval::score_probe::softmax(&scores).collect();
        (0..D)
            .map(|j| {
                (weights.iter().zip(&vectors))
                    .map(|(w, v)| w * f64::from(v[j]))
                    .sum()
            })
            .collect()
    }

    #[test]
    fn swapped_rows_are_the_softmax_with_the_needles_exact_keys_and_values() {
        let alloc = allocation("");
        let (plain, _, _) = run(&alloc, None);
        for streams in [
            NeedleStreams::Keys,
            NeedleStreams::Values,
            NeedleStreams::Both,
        ] {
            let (out, cache, swapped) = run(&alloc, Some(streams));
            // Rows 6..12 read the whole needle, from its codes (no window): 6 rows, 2 heads.
            assert_eq!(swapped, 12, "{streams:?}");
            for i in 0..TOKENS {
                for h in 0..2 {
                    let row = &out[(i * 2 + h) * D..][..D];
                    if i < NEEDLE.end {
                        assert_eq!(row, &plain[(i * 2 + h) * D..][..D], "row {i} unchanged");
                        continue;
                    }
                    let expected = by_hand(&cache, i, h, streams);
                    for (j, (&got, &want)) in row.iter().zip(&expected).enumerate() {
                        assert!(
                            (f64::from(got) - want).abs() < 1e-5,
                            "{streams:?} row {i} head {h} [{j}]: {got} vs {want}"
                        );
                    }
                    // The swap moved the output: the 2-bit needle is not its exact self.
                    assert_ne!(row, &plain[(i * 2 + h) * D..][..D], "row {i} swapped");
                }
            }
        }
    }

    #[test]
    fn rows_whose_window_holds_the_needle_are_left_as_the_cache_wrote_them() {
        // A 3-token f16 key window: row i reads tokens i-2..=i from copies, so the needle
        // (4..6) leaves it at row 8.
        let alloc = allocation(", recent_fp_tokens = 3");
        let (plain, _, _) = run(&alloc, None);
        let (out, _, swapped) = run(&alloc, Some(NeedleStreams::Both));
        assert_eq!(swapped, 2 * (TOKENS - 8));
        assert_eq!(out[..8 * 2 * D], plain[..8 * 2 * D]);
        assert_ne!(out[8 * 2 * D..], plain[8 * 2 * D..]);
    }

    #[test]
    fn layers_outside_the_range_are_not_swapped() {
        let mut cache = crate::needle::test_cache::one_layer(TOKENS, D, None, &allocation(""));
        let [queries, keys, values] = inputs();
        let positions: Vec<u32> = (0..TOKENS as u32).collect();
        let mut out = vec![0.0f32; queries.len()];
        let attention = CpuAttention {
            cache: &mut cache,
            kernel: AttentionKernel::Fused,
        };
        let exact = ExactNeedle {
            streams: NeedleStreams::Both,
            layers: 1..2,
            answer_only: false,
        };
        let mut oracle = ExactNeedleAttention::new(attention, 1, NEEDLE, TOKENS - 1, exact);
        oracle
            .attend(0, &queries, &keys, &values, &positions, SHAPE, &mut out)
            .expect("attends");
        assert_eq!(oracle.swapped(), &[0]);
        assert_eq!(out, run(&allocation(""), None).0);
    }
}
