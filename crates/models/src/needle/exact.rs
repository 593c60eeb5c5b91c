//! An oracle for per-token precision: chosen tokens read exactly, every other token as the
//! cache stores it — what keeping just those tokens at full precision could buy at most.
//! The tokens are the needle's own ([`ExactChoice::Needle`]: the upper bound, before anyone
//! builds a policy that would find them), or those a heavy-hitter policy would keep, decided
//! while each token sits in a recent window from the attention it receives there
//! ([`ExactChoice::HeavyHitters`]: a simulation of that policy, before the cache has it).
//!
//! An instrumented [`AttentionBackend`]: attention runs on the CPU cache as usual, then each
//! query row that reads chosen tokens from the compressed body has their share of its output
//! swapped for the exact one. With `Z = Σ_t e^{s̃_t}` over the row's visible tokens (the
//! scores of the records the kernel read: body codes, or the 8-bit or f16 copies of the row's
//! window and sinks) and the cache's output `o`, the row becomes
//!
//! ```text
//! (o·Z − Σ_n e^{s̃_n}·ṽ_n + Σ_n e^{s_n}·v_n) / (Z − Σ_n e^{s̃_n} + Σ_n e^{s_n})
//! ```
//!
//! over the chosen tokens `n` (`s`, `v` exact; `s̃`, `ṽ` the stored ones) — the softmax over
//! the same tokens with their scores and values replaced. With keys only, `v_n = ṽ_n`; with
//! values only, `s_n = s̃_n`. A token the row still reads from its window or a sink is read at
//! that precision already and left alone; with the needle, a row swaps only when the whole
//! needle has left its window.

use std::ops::Range;

use rayon::prelude::*;
use serde::Serialize;
use tq_cache::CacheError;
use tq_cache::attention::AttentionShape;
use tq_cache::codec::CodecScratch;
use tq_cache::kv_cache::KvCache;
use tq_cache::stream::Stream;

use super::window_attention::add_window_weights;
use crate::llama::{AttentionBackend, CpuAttention, ModelError};

/// Which of the chosen tokens' streams an [`ExactNeedle`] run reads exactly.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum NeedleStreams {
    /// The keys (the values as stored).
    Keys,
    /// The values (the keys as stored).
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

/// Which tokens an [`ExactNeedle`] run reads exactly.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ExactChoice {
    /// The needle's own tokens, in every KV head (the oracle's upper bound).
    Needle,
    /// Per layer and KV head, each token whose attention received from the queries of the
    /// `window` tokens from it on (exact keys, summed over those rows, averaged over the KV
    /// head's query heads) reaches `factor` times what uniform attention over each row's
    /// visible tokens would give it — decided once the last of those rows is read, so a row
    /// only uses what a cache could have known when the token left a window of `window`
    /// tokens.
    HeavyHitters {
        /// The window the attention is gathered over, in tokens.
        window: usize,
        /// The threshold, in multiples of uniform attention.
        factor: f64,
    },
    /// Every `every`-th token (`t mod every = 0`), in every KV head, once it has left the
    /// window: the control for [`HeavyHitters`](Self::HeavyHitters) — as many tokens kept
    /// without looking at them.
    Every {
        /// The stride, in tokens (at least 1).
        every: usize,
    },
}

/// Read chosen tokens exactly, every other token as the cache stores it — an oracle for
/// per-token precision ([`NeedleOptions::exact_needle`](super::NeedleOptions::exact_needle)).
///
/// Each query row that reads chosen tokens from the compressed body has their share of its
/// softmax swapped: with the cache's output `o`, `Z = Σ_t e^{s̃_t}` over the records the
/// kernel read, the stored scores and values `s̃`, `ṽ` and the exact `s`, `v` of the chosen
/// tokens `n`, the row becomes
/// `(o·Z − Σ_n e^{s̃_n}·ṽ_n + Σ_n e^{s_n}·v_n) / (Z − Σ_n e^{s̃_n} + Σ_n e^{s_n})`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ExactNeedle {
    /// Which streams.
    pub streams: NeedleStreams,
    /// The layers where the tokens are read exactly (the others read the cache as usual).
    pub layers: Range<usize>,
    /// Only the rows from the prompt's last token on (the answer's), as a cache would that
    /// chose the tokens when the prompt ends; otherwise every row.
    pub answer_only: bool,
    /// Which tokens.
    pub choice: ExactChoice,
}

/// [`CpuAttention`] with chosen tokens swapped for their exact keys and values.
#[derive(Debug)]
pub(super) struct ExactNeedleAttention<'a> {
    attention: CpuAttention<'a>,
    exact: ExactNeedle,
    /// The needle's token indices.
    needle: Range<usize>,
    /// The first query row (token index) swapped.
    from: usize,
    /// Per layer, every token's exact `[keys, values]` (`[tokens, kv_heads·head_dim]`).
    exact_kv: Vec<[Vec<f32>; 2]>,
    /// Per layer and KV head, the attention each token received in its window (heavy
    /// hitters).
    received: Vec<Vec<Vec<f64>>>,
    /// Per layer and KV head, the tokens kept so far, ascending (heavy hitters).
    kept: Vec<Vec<Vec<usize>>>,
    /// Per layer, the tokens decided so far (heavy hitters).
    decided: Vec<usize>,
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
            from: match (exact.answer_only, exact.choice) {
                (true, _) => last_prompt_token,
                (false, ExactChoice::Needle) => needle.end,
                (false, ExactChoice::HeavyHitters { .. } | ExactChoice::Every { .. }) => 0,
            },
            exact,
            needle,
            exact_kv: vec![[Vec::new(), Vec::new()]; layers],
            received: vec![Vec::new(); layers],
            kept: vec![Vec::new(); layers],
            decided: vec![0; layers],
            swapped: vec![0; layers],
        }
    }

    /// Per layer, how many (query row, query head) outputs were swapped.
    pub(super) fn swapped(&self) -> &[usize] {
        &self.swapped
    }

    /// Per layer, the share of the decided tokens kept, over the KV heads (heavy hitters and
    /// their control; zeros for the needle).
    pub(super) fn kept_share(&self) -> Vec<f64> {
        self.kept
            .iter()
            .zip(&self.decided)
            .map(|(heads, &decided)| {
                let kept: usize = heads.iter().map(Vec::len).sum();
                kept as f64 / (decided * heads.len()).max(1) as f64
            })
            .collect()
    }

    /// Adds this call's rows to the attention each token received in its window, then keeps
    /// the tokens whose window is complete and whose received attention reaches the
    /// threshold.
    #[allow(clippy::too_many_arguments)]
    fn gather(
        &mut self,
        layer: usize,
        queries: &[f32],
        positions: &[u32],
        shape: AttentionShape,
        window: usize,
        factor: f64,
    ) -> Result<(), ModelError> {
        let kv = self.attention.cache.kv(layer)?;
        let kv_heads = kv.layout().kv_heads;
        let group = shape.q_heads / kv_heads;
        let exact = &self.exact_kv[layer][0];
        let received = &mut self.received[layer];
        received.resize(kv_heads, Vec::new());
        for heads in received.iter_mut() {
            heads.resize(positions.len(), 0.0);
        }
        let per_head = 1.0 / group as f64;
        add_window_weights(kv, exact, queries, positions, shape, window, |g, t, w| {
            received[g][t] += per_head * w;
        });
        // Token t's window is complete once row t + window − 1 is read.
        let complete = (positions.len() + 1).saturating_sub(window);
        let kept = &mut self.kept[layer];
        kept.resize(kv_heads, Vec::new());
        for t in self.decided[layer]..complete {
            let uniform: f64 = (t..t + window)
                .map(|r| 1.0 / kv.visible(positions[r]).len().max(1) as f64)
                .sum();
            for (heads, drawn) in kept.iter_mut().zip(received.iter()) {
                if drawn[t] >= factor * uniform {
                    heads.push(t);
                }
            }
        }
        self.decided[layer] = self.decided[layer].max(complete);
        Ok(())
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
        let layers = self.exact_kv.len();
        let Some(exact) = self.exact_kv.get_mut(layer) else {
            return Err(ModelError::InvalidCall(format!(
                "layer {layer} of an exact-token oracle for {layers} layers"
            )));
        };
        exact[0].extend_from_slice(keys);
        exact[1].extend_from_slice(values);
        let kv = self.attention.cache.kv(layer)?;
        let (d, kv_heads) = (kv.layout().head_dim, kv.layout().kv_heads);
        let width = kv_heads * d;
        if exact[0].len() != positions.len() * width {
            return Err(ModelError::InvalidCall(format!(
                "layer {layer}: the exact-token oracle holds {} key floats for {} positions of \
                 {kv_heads}×{d} (a cache that started non-empty, or was truncated?)",
                exact[0].len(),
                positions.len()
            )));
        }
        if !self.exact.layers.contains(&layer) {
            return Ok(());
        }
        if !shape.q_heads.is_multiple_of(kv_heads.max(1)) {
            return Err(ModelError::InvalidCall(format!(
                "{} query heads cannot share {kv_heads} KV heads evenly",
                shape.q_heads
            )));
        }
        let n = queries.len() / (shape.q_heads * d).max(1);
        let first = positions.len() - n;
        let choice = match self.exact.choice {
            ExactChoice::Needle => {
                if positions.len() < self.needle.end || self.needle.is_empty() {
                    return Ok(());
                }
                Chosen::Needle(&self.needle)
            }
            ExactChoice::HeavyHitters { window, factor } => {
                self.gather(layer, queries, positions, shape, window.max(1), factor)?;
                Chosen::Kept {
                    tokens: &self.kept[layer],
                    window: window.max(1),
                }
            }
            ExactChoice::Every { every } => {
                let every = every.max(1);
                let kept = &mut self.kept[layer];
                kept.resize(kv_heads, Vec::new());
                for heads in kept.iter_mut() {
                    heads.extend((self.decided[layer]..positions.len()).filter(|t| t % every == 0));
                }
                self.decided[layer] = positions.len();
                Chosen::Kept {
                    tokens: &self.kept[layer],
                    window: 1,
                }
            }
        };
        // Rows before `from` are left as the cache wrote them.
        let skip = self.from.saturating_sub(first).min(n);
        let row_width = shape.q_heads * d;
        let kv = self.attention.cache.kv(layer)?;
        let swapped = swap_tokens(
            kv,
            [&self.exact_kv[layer][0], &self.exact_kv[layer][1]],
            choice,
            self.exact.streams,
            &queries[skip * row_width..],
            (&positions[first + skip..], first + skip),
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

/// The tokens a call swaps.
#[derive(Clone, Copy)]
enum Chosen<'a> {
    /// The needle, in every KV head, and only whole.
    Needle(&'a Range<usize>),
    /// Per KV head, the kept tokens, each from the row that completes its window on.
    Kept {
        tokens: &'a [Vec<usize>],
        window: usize,
    },
}

impl Chosen<'_> {
    /// The chosen tokens that row `row` (a token index) of KV head `g` reads from the body:
    /// before `body_end` (its windows' start), at or after `stored` (sinks and overwritten
    /// tokens aside). `None` where the row swaps nothing.
    fn for_row(self, g: usize, row: usize, stored: usize, body_end: usize) -> Option<Vec<usize>> {
        match self {
            Chosen::Needle(needle) => {
                (needle.start >= stored && needle.end <= body_end).then(|| needle.clone().collect())
            }
            Chosen::Kept { tokens, window } => {
                let tokens = tokens.get(g)?;
                let end = body_end.min((row + 2).saturating_sub(window));
                let from = tokens.partition_point(|&t| t < stored);
                let to = tokens.partition_point(|&t| t < end);
                (from < to).then(|| tokens[from..to].to_vec())
            }
        }
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

/// A row's key window start and the chosen tokens it reads from the body, for one KV head.
type RowPlan = (usize, Vec<usize>);

/// Swaps the chosen tokens' share of each query row's output (see the module documentation);
/// returns how many (row, query head) outputs it swapped. `rows`: the rows' positions and the
/// first row's token index.
#[allow(clippy::too_many_arguments)]
fn swap_tokens(
    kv: &KvCache,
    exact: [&[f32]; 2],
    chosen: Chosen<'_>,
    streams: NeedleStreams,
    queries: &[f32],
    rows: (&[u32], usize),
    shape: AttentionShape,
    out: &mut [f32],
) -> Result<usize, ModelError> {
    let (query_positions, first_row) = rows;
    let layout = kv.layout();
    let (d, kv_heads) = (layout.head_dim, layout.kv_heads);
    let width = kv_heads * d;
    let group = shape.q_heads / kv_heads;
    // Per query row and KV head, the key window's start and the chosen tokens the row reads
    // from the body (`None`: nothing to swap).
    let plan: Vec<Vec<Option<RowPlan>>> = query_positions
        .iter()
        .enumerate()
        .map(|(i, &p)| {
            let visible = kv.visible(p);
            (0..kv_heads)
                .map(|h| {
                    let streams = [kv.keys(h), kv.values(h)];
                    let starts = streams.map(|s| s.window_start(visible.end, true));
                    let stored = streams
                        .iter()
                        .map(|s| s.sink_end().max(s.first_stored()))
                        .fold(visible.start, usize::max);
                    let tokens =
                        chosen.for_row(h, first_row + i, stored, starts[0].min(starts[1]))?;
                    Some((starts[0], tokens))
                })
                .collect()
        })
        .collect();
    let len = kv.len();
    let first = kv.first_stored();
    // Per KV head, the keys of every token its rows read, in both versions where rows differ
    // (the body's codes before the row's window, copies in it); the body's values up to the
    // last chosen token.
    let decoded: Vec<Option<[Decoded; 2]>> = (0..kv_heads)
        .into_par_iter()
        .map(|h| -> Result<_, CacheError> {
            let heads = plan.iter().filter_map(|row| row[h].as_ref());
            let starts = heads.clone().map(|(start, _)| *start);
            let (Some(earliest), Some(latest)) = (starts.clone().min(), starts.max()) else {
                return Ok(None);
            };
            let last = heads
                .filter_map(|(_, tokens)| tokens.last())
                .max()
                .map_or(first, |t| t + 1);
            Ok(Some([
                Decoded::new(kv.keys(h), first, latest, earliest, d)?,
                Decoded::new(kv.values(h), first, last, len, d)?,
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
            let (Some((key_window, tokens)), Some([keys, values])) = (&plan[i][g], &decoded[g])
            else {
                return 0;
            };
            let q = &queries[row * d..(row + 1) * d];
            let visible = kv.visible(query_positions[i]);
            let stored: Vec<f64> = visible
                .clone()
                .map(|t| {
                    let (k, correction) = keys.token(t, *key_window, d);
                    scale * lanes_dot(q, k) * f64::from(correction)
                })
                .collect();
            let old_scores: Vec<f64> = tokens.iter().map(|&t| stored[t - visible.start]).collect();
            let new_scores: Vec<f64> = if streams.keys() {
                tokens
                    .iter()
                    .map(|&t| scale * lanes_dot(q, &exact[0][t * width + g * d..][..d]))
                    .collect()
            } else {
                old_scores.clone()
            };
            let max = stored
                .iter()
                .chain(&new_scores)
                .copied()
                .fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = stored.iter().map(|s| (s - max).exp()).sum();
            let mut total = z;
            let mut sum: Vec<f64> = o.iter().map(|&x| f64::from(x) * z).collect();
            for (j, &t) in tokens.iter().enumerate() {
                let (old_w, new_w) = ((old_scores[j] - max).exp(), (new_scores[j] - max).exp());
                let (stored_v, _) = values.token(t, len, d);
                let new_v = if streams.values() {
                    &exact[1][t * width + g * d..][..d]
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

    /// The attention output of every row (one call over all of `inputs`' tokens) with the
    /// oracle reading `exact` (streams, tokens) exactly, or the plain cache; the cache after
    /// it; the swapped count; the kept tokens of the one KV head (heavy hitters).
    fn run_on(
        alloc: &Allocation,
        inputs: &[Vec<f32>; 3],
        exact: Option<(NeedleStreams, ExactChoice)>,
    ) -> (Vec<f32>, ModelCache, usize, Vec<usize>) {
        let mut cache = crate::needle::test_cache::one_layer(TOKENS, D, None, alloc);
        let [queries, keys, values] = inputs;
        let positions: Vec<u32> = (0..TOKENS as u32).collect();
        let mut out = vec![0.0f32; queries.len()];
        let attention = CpuAttention {
            cache: &mut cache,
            kernel: AttentionKernel::Fused,
        };
        let (swapped, kept) = match exact {
            Some((streams, choice)) => {
                let exact = ExactNeedle {
                    streams,
                    layers: 0..1,
                    answer_only: false,
                    choice,
                };
                let mut oracle = ExactNeedleAttention::new(attention, 1, NEEDLE, TOKENS - 1, exact);
                oracle
                    .attend(0, queries, keys, values, &positions, SHAPE, &mut out)
                    .expect("attends");
                let kept = oracle.kept[0].first().cloned().unwrap_or_default();
                (oracle.swapped()[0], kept)
            }
            None => {
                let mut attention = attention;
                attention
                    .attend(0, queries, keys, values, &positions, SHAPE, &mut out)
                    .expect("attends");
                (0, Vec::new())
            }
        };
        (out, cache, swapped, kept)
    }

    /// [`run_on`] the random inputs, the needle or the plain cache.
    fn run(alloc: &Allocation, streams: Option<NeedleStreams>) -> (Vec<f32>, ModelCache, usize) {
        let exact = streams.map(|s| (s, ExactChoice::Needle));
        let (out, cache, swapped, _) = run_on(alloc, &inputs(), exact);
        (out, cache, swapped)
    }

    /// Row `i`, head `h` by hand: the softmax over tokens `0..=i` of the cache's decoded keys
    /// and values, those of the tokens `replaced` says replaced by the exact ones where
    /// `streams` says.
    fn by_hand_on(
        cache: &ModelCache,
        inputs: &[Vec<f32>; 3],
        (i, h): (usize, usize),
        streams: NeedleStreams,
        replaced: impl Fn(usize) -> bool,
    ) -> Vec<f64> {
        let [queries, keys, values] = inputs;
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
            if replaced(t) && streams.keys() {
                k.copy_from_slice(&keys[t * D..(t + 1) * D]);
            }
            if replaced(t) && streams.values() {
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

    /// [`by_hand_on`] the random inputs with the needle replaced.
    fn by_hand(cache: &ModelCache, i: usize, h: usize, streams: NeedleStreams) -> Vec<f64> {
        by_hand_on(cache, &inputs(), (i, h), streams, |t| NEEDLE.contains(&t))
    }

    #[test]
    fn heavy_hitters_are_kept_once_their_window_is_read_and_swapped_from_then_on() {
        // Queries with a positive mean and token 2's key along it: token 2 draws most of
        // every later row's weight, far above uniform attention.
        let mut inputs = inputs();
        for q in inputs[0].iter_mut() {
            *q += 1.0;
        }
        inputs[1][2 * D..3 * D].fill(1.5);
        let alloc = allocation("");
        let (window, factor) = (3, 2.0);
        let choice = ExactChoice::HeavyHitters { window, factor };
        let (plain, _, _, _) = run_on(&alloc, &inputs, None);
        let (out, cache, swapped, kept) =
            run_on(&alloc, &inputs, Some((NeedleStreams::Both, choice)));
        assert!(kept.contains(&2), "{kept:?}");
        // Decided: tokens whose 3 rows were all read (t + 3 ≤ 12); each row swaps the kept
        // tokens whose window it completed or passed.
        assert!(kept.iter().all(|&t| t + window <= TOKENS), "{kept:?}");
        let mut rows = 0;
        for i in 0..TOKENS {
            let replaced = |t: usize| kept.contains(&t) && t + window <= i + 1;
            for h in 0..2 {
                let row = &out[(i * 2 + h) * D..][..D];
                if !(0..=i).any(replaced) {
                    assert_eq!(row, &plain[(i * 2 + h) * D..][..D], "row {i} unchanged");
                    continue;
                }
                rows += 1;
                let expected = by_hand_on(&cache, &inputs, (i, h), NeedleStreams::Both, replaced);
                for (&got, &want) in row.iter().zip(&expected) {
                    assert!(
                        (f64::from(got) - want).abs() < 1e-5,
                        "row {i}: {got} vs {want}"
                    );
                }
            }
        }
        assert_eq!(swapped, rows);
        // Token 2's window completes at row 4: rows 0-3 are the cache's own.
        assert!(rows > 0 && rows <= 2 * (TOKENS - 4), "{rows}");
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
            choice: ExactChoice::Needle,
        };
        let mut oracle = ExactNeedleAttention::new(attention, 1, NEEDLE, TOKENS - 1, exact);
        oracle
            .attend(0, &queries, &keys, &values, &positions, SHAPE, &mut out)
            .expect("attends");
        assert_eq!(oracle.swapped(), &[0]);
        assert_eq!(out, run(&allocation(""), None).0);
    }
}
