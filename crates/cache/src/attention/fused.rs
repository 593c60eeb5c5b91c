//! Fused rotated-domain attention over packed codes.
//!
//! Per query head: rotate the (scaled) query once, `q̃ = Π_K·q`, and for TQ_prod keys project it
//! once more, `α·s·S·q̃` (the sketch query). A compressed key then costs one unpack of its codes
//! into centroids, shared by every query head of the GQA group, and per head one dot product
//! with the centroids and one with the ±1 signs: `score = norm·⟨q̃, c[idx]⟩ + γ·⟨α·s·S·q̃, z⟩`.
//! Values accumulate in the rotated domain, `Σ p·norm·c[idx]`, and for TQ_prod values in the
//! sketch domain too, `Σ p·γ·z`; each output then costs one `Sᵀ` and one `Π_Vᵀ`, not one per
//! token. Full-precision tokens (f16/f32 streams, sinks, the recent window) accumulate in the
//! original domain beside them. A two-tier record is two parts, each with its own channels,
//! codec and rotation: scores add over the parts, and each part's output is mapped back and
//! scattered to its channels. The inner loops are the run kernels of [`simd`](super::simd)
//! (AVX2, NEON or scalar, chosen once per call).
//!
//! Work splits into blocks of [`block_tokens`] visible tokens per (query, KV head) (256 up
//! to 2048, growing with the visible range so per-block costs stay small), flash-decoding style: each block keeps its own max, sum and accumulators, and blocks are
//! combined in order afterwards. Block boundaries depend only on the visible range, so the
//! result is bit-identical whatever the number of threads.

use half::f16;
use rayon::prelude::*;
use tq_qjl::QjlSketch;
use tq_rotation::Rotation;

use super::simd::{self, CodedRun, Isa, KeyQueries, PlainKind, PlainRun};
use super::{AttentionShape, check_shapes};
use crate::error::CacheError;
use crate::kv_cache::KvCache;
use crate::stream::{Stream, TokenSource};
use crate::token_codec::TokenCodec;

/// Fewest visible tokens per work item.
pub const BLOCK_TOKENS: usize = 256;

/// Most visible tokens per work item.
pub const MAX_BLOCK_TOKENS: usize = 2048;

/// Tokens per block for a visible range of `len` tokens: about `len/16` (so each (query, KV
/// head) still splits into a dozen or more blocks to spread over threads), rounded to a power of
/// two within `[BLOCK_TOKENS, MAX_BLOCK_TOKENS]`. A pure function of the range, so block
/// boundaries, and with them the result, never depend on the thread count.
pub fn block_tokens(len: usize) -> usize {
    (len / 16)
        .next_power_of_two()
        .clamp(BLOCK_TOKENS, MAX_BLOCK_TOKENS)
}

/// How the vectors of one part are stored.
enum Body<'a> {
    Plain(PlainKind),
    Codes {
        bits: u8,
        centroids: &'a [f32],
        rotation: &'a Rotation,
        /// Words of codes at the start of the part (sign words follow for TQ_prod).
        code_words: usize,
        sketch: Option<&'a QjlSketch>,
        correction: f32,
    },
}

/// One part of a record: the whole record, or one tier of a two-tier record.
struct Part<'a> {
    body: Body<'a>,
    /// Dimension of the part's vectors.
    dim: usize,
    /// The head channels of the part's coordinates (`None`: all, in order).
    channels: Option<&'a [u16]>,
    /// Word index of the part within a record.
    word_offset: usize,
    /// Index of the part's first scale within a record's scales.
    scale_offset: usize,
    /// The part's scales per token.
    scales: usize,
}

impl Part<'_> {
    /// Sketch dimension `m` (0 without QJL signs).
    fn sketch_dim(&self) -> usize {
        match &self.body {
            Body::Codes {
                sketch: Some(s), ..
            } => s.rows(),
            _ => 0,
        }
    }

    /// A coded run of this part over `words` (whole records of `record_words`) with the
    /// part's f32 `scales`; `None` for plain parts.
    fn coded_run<'b>(
        &'b self,
        words: &'b [u32],
        record_words: usize,
        scales: &'b [f32],
    ) -> Option<CodedRun<'b>> {
        match &self.body {
            Body::Codes {
                bits,
                centroids,
                code_words,
                ..
            } => Some(CodedRun {
                words,
                record_words,
                code_offset: self.word_offset,
                bits: *bits,
                dim: self.dim,
                centroids,
                sign_offset: self.word_offset + code_words,
                sketch_dim: self.sketch_dim(),
                scales,
            }),
            Body::Plain(_) => None,
        }
    }
}

fn body_of(codec: &TokenCodec) -> Result<Body<'_>, CacheError> {
    Ok(match codec {
        TokenCodec::F32 { .. } => Body::Plain(PlainKind::F32),
        TokenCodec::F16 { .. } => Body::Plain(PlainKind::F16),
        TokenCodec::Mse(c) => Body::Codes {
            bits: c.spec().bits,
            centroids: c.codebook().centroids_f32(),
            rotation: c.rotation(),
            code_words: c.words_per_vector(),
            sketch: None,
            correction: 1.0,
        },
        TokenCodec::DebiasedMse(d) => Body::Codes {
            bits: d.codec().spec().bits,
            centroids: d.codec().codebook().centroids_f32(),
            rotation: d.codec().rotation(),
            code_words: d.codec().words_per_vector(),
            sketch: None,
            correction: d.correction(),
        },
        TokenCodec::Prod(c) => Body::Codes {
            bits: c.mse().spec().bits,
            centroids: c.mse().codebook().centroids_f32(),
            rotation: c.mse().rotation(),
            code_words: c.mse().words_per_vector(),
            sketch: Some(c.sketch()),
            correction: 1.0,
        },
        TokenCodec::TwoTier(_) => {
            return Err(CacheError::InvalidConfig(
                "a two-tier codec cannot be a tier of another".into(),
            ));
        }
    })
}

/// The parts of a stream codec's records.
fn parts_of(codec: &TokenCodec) -> Result<Vec<Part<'_>>, CacheError> {
    match codec {
        TokenCodec::TwoTier(c) => Ok(vec![
            Part {
                body: body_of(c.outlier())?,
                dim: c.outlier().dim(),
                channels: Some(c.channels()),
                word_offset: 0,
                scale_offset: 0,
                scales: c.outlier().scales_per_token(),
            },
            Part {
                body: body_of(c.rest())?,
                dim: c.rest().dim(),
                channels: Some(c.rest_channels()),
                word_offset: c.outlier().record_words(),
                scale_offset: c.outlier().scales_per_token(),
                scales: c.rest().scales_per_token(),
            },
        ]),
        _ => Ok(vec![Part {
            body: body_of(codec)?,
            dim: codec.dim(),
            channels: None,
            word_offset: 0,
            scale_offset: 0,
            scales: codec.scales_per_token(),
        }]),
    }
}

fn plain_kind(codec: &TokenCodec) -> PlainKind {
    match codec {
        TokenCodec::F32 { .. } => PlainKind::F32,
        _ => PlainKind::F16,
    }
}

/// The key and value parts of one KV head.
struct HeadPlan<'a> {
    keys: &'a Stream,
    values: &'a Stream,
    key_parts: Vec<Part<'a>>,
    value_parts: Vec<Part<'a>>,
}

/// The query heads of one GQA group prepared against one key part, `[group, ·]` row-major.
enum PreparedPart {
    /// `scale·q` on the part's channels.
    Plain(Vec<f32>),
    /// `scale·correction·Π_K·q` and, for TQ_prod parts, `α·s·S·(scale·Π_K·q)`.
    Coded(KeyQueries),
}

/// The query heads of one GQA group prepared against one key stream.
struct PreparedGroup {
    /// `scale·q` over the whole head, for full-precision copies (`[group, d]`).
    plain: Vec<f32>,
    parts: Vec<PreparedPart>,
}

fn prepare(
    isa: Isa,
    parts: &[Part<'_>],
    queries: &[f32],
    d: usize,
    scale: f32,
) -> Result<PreparedGroup, CacheError> {
    let plain: Vec<f32> = queries.iter().map(|v| v * scale).collect();
    let group = plain.len() / d;
    let mut prepared = Vec::with_capacity(parts.len());
    for part in parts {
        let dp = part.dim;
        let mut gathered = vec![0.0f32; group * dp];
        for (row, q) in gathered.chunks_exact_mut(dp).zip(plain.chunks_exact(d)) {
            match part.channels {
                Some(channels) => {
                    for (v, &c) in row.iter_mut().zip(channels) {
                        *v = q[usize::from(c)];
                    }
                }
                None => row.copy_from_slice(q),
            }
        }
        let mut sketch_rows = Vec::new();
        let Body::Codes {
            rotation,
            sketch,
            correction,
            ..
        } = &part.body
        else {
            prepared.push(PreparedPart::Plain(gathered));
            continue;
        };
        {
            let mut rotated = vec![0.0f32; gathered.len()];
            for (q, r) in gathered.chunks_exact(dp).zip(rotated.chunks_exact_mut(dp)) {
                rotation
                    .apply(q, r)
                    .map_err(crate::codec::CodecError::from)?;
            }
            if let Some(sketch) = sketch {
                let m = sketch.rows();
                let gain = sketch.gain() as f32;
                sketch_rows = vec![0.0; m * group];
                for (r, p) in rotated
                    .chunks_exact(dp)
                    .zip(sketch_rows.chunks_exact_mut(m))
                {
                    sketch
                        .project(r, p)
                        .map_err(crate::codec::CodecError::from)?;
                    p.iter_mut().for_each(|v| *v *= gain);
                }
            }
            if *correction != 1.0 {
                rotated.iter_mut().for_each(|v| *v *= correction);
            }
            let m = part.sketch_dim();
            let keys = KeyQueries::new(isa, rotated, sketch_rows, dp, m, true);
            prepared.push(PreparedPart::Coded(keys));
        }
    }
    Ok(PreparedGroup {
        plain,
        parts: prepared,
    })
}

/// One part's accumulators in a block: `[group, dim]` (original domain for plain parts,
/// rotated domain for coded ones) and `[group, m]` in the sketch domain; empty when unused.
#[derive(Default)]
struct PartAccumulators {
    values: Vec<f32>,
    signs: Vec<f32>,
}

/// The partial result of one block for the heads of one GQA group.
struct BlockPartial {
    max: Vec<f32>,
    sum: Vec<f32>,
    /// `[group, d]` accumulator of the full-precision copies (empty when unused).
    full: Vec<f32>,
    parts: Vec<PartAccumulators>,
}

/// Calls `visit(first_token, words, scales, tokens, is_body)` for consecutive runs of records
/// covering `range`: body records in contiguous runs, full-precision copies one at a time.
fn walk(
    stream: &Stream,
    range: std::ops::Range<usize>,
    mut visit: impl FnMut(usize, &[u32], &[f16], usize, bool),
) {
    let body = stream.body();
    let recent_start = stream.recent_start();
    let mut t = range.start;
    while t < range.end {
        match stream.source(t) {
            TokenSource::Body(slot) => {
                let limit = range.end.min(recent_start.max(t + 1)) - t;
                let Some((w, s, n)) = body.run(slot, limit) else {
                    return;
                };
                visit(t, w, s, n, true);
                t += n;
            }
            TokenSource::Sink(_) | TokenSource::Recent(_) => {
                if let Some((_, record, s)) = stream.token(t) {
                    visit(t, record, s, 1, false);
                }
                t += 1;
            }
        }
    }
}

/// Grows `buffer` to `len` zeros if it is empty; returns it.
fn ensure(buffer: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if buffer.is_empty() {
        buffer.resize(len, 0.0);
    }
    buffer
}

/// Reusable per-block buffers for the f32 scales of a run.
#[derive(Default)]
struct Scales {
    /// Every scale of the run, `[n, per_token]`.
    all: Vec<f32>,
    /// Each part's scales, `[n, part scales]` (filled only for records of several parts).
    parts: Vec<Vec<f32>>,
    per_token: usize,
}

impl Scales {
    /// Converts the run's scales and splits them per part.
    fn load(&mut self, isa: Isa, halves: &[f16], n: usize, parts: &[Part<'_>]) {
        self.all.resize(halves.len(), 0.0);
        simd::f16_to_f32(isa, halves, &mut self.all);
        self.per_token = halves.len() / n.max(1);
        self.parts.resize(parts.len(), Vec::new());
        for (part, buffer) in parts.iter().zip(self.parts.iter_mut()) {
            if part.scales == 0 || part.scales == self.per_token {
                continue;
            }
            buffer.resize(n * part.scales, 0.0);
            for (dst, src) in buffer
                .chunks_exact_mut(part.scales)
                .zip(self.all.chunks_exact(self.per_token))
            {
                for (d, s) in dst.iter_mut().zip(&src[part.scale_offset..]) {
                    *d = *s;
                }
            }
        }
    }

    /// The scales of part `k`, compact.
    fn of(&self, k: usize, part: &Part<'_>) -> &[f32] {
        if part.scales == self.per_token {
            &self.all
        } else {
            &self.parts[k]
        }
    }
}

/// `out[k·group + h] = weights[k·group + h]·scales[k·per_token + which]`: the token-major
/// probabilities of a run times each token's norm (`which` = 0) or `γ` (1).
fn scale_rows(
    weights: &[f32],
    scales: &[f32],
    per_token: usize,
    which: usize,
    group: usize,
    out: &mut Vec<f32>,
) {
    out.clear();
    out.resize(weights.len(), 0.0);
    for ((o, w), s) in out
        .chunks_exact_mut(group)
        .zip(weights.chunks_exact(group))
        .zip(scales.iter().skip(which).step_by(per_token))
    {
        for (o, w) in o.iter_mut().zip(w) {
            *o = w * s;
        }
    }
}

fn run_block(
    isa: Isa,
    plan: &HeadPlan<'_>,
    prepared: &PreparedGroup,
    range: std::ops::Range<usize>,
    d: usize,
) -> BlockPartial {
    let group = prepared.plain.len() / d;
    let len = range.len();
    let start = range.start;
    let mut scores = vec![0.0f32; group * len];
    let mut scales = Scales::default();
    walk(plan.keys, range.clone(), |t, words, halves, n, is_body| {
        let out = &mut scores[t - start..];
        let record_words = words.len() / n;
        if !is_body {
            let run = PlainRun {
                words,
                record_words,
                offset: 0,
                kind: plain_kind(plan.keys.fp_codec()),
                dim: d,
            };
            simd::score_plain(isa, &run, &prepared.plain, out, len);
            return;
        }
        scales.load(isa, halves, n, &plan.key_parts);
        let mut runs = Vec::with_capacity(plan.key_parts.len());
        let mut keys = Vec::with_capacity(plan.key_parts.len());
        for (k, (part, pp)) in plan.key_parts.iter().zip(&prepared.parts).enumerate() {
            match (&part.body, pp) {
                (Body::Plain(kind), PreparedPart::Plain(queries)) => {
                    let run = PlainRun {
                        words,
                        record_words,
                        offset: part.word_offset,
                        kind: *kind,
                        dim: part.dim,
                    };
                    simd::score_plain(isa, &run, queries, out, len);
                }
                (Body::Codes { .. }, PreparedPart::Coded(queries)) => {
                    if let Some(run) = part.coded_run(words, record_words, scales.of(k, part)) {
                        runs.push(run);
                        keys.push(queries);
                    }
                }
                _ => unreachable!("queries are prepared from the same parts"),
            }
        }
        simd::score_coded_parts(isa, &runs, &keys, out, len);
    });
    let mut max = vec![f32::NEG_INFINITY; group];
    let mut sum = vec![0.0f32; group];
    for h in 0..group {
        let row = &mut scores[h * len..(h + 1) * len];
        max[h] = simd::max(isa, row);
        sum[h] = simd::exp_shifted_sum(isa, row, max[h]);
    }
    let mut full = Vec::new();
    let mut parts: Vec<PartAccumulators> = plan
        .value_parts
        .iter()
        .map(|_| PartAccumulators::default())
        .collect();
    // Token-major probabilities `[len, group]`: the value kernels' weight layout.
    let mut probabilities = vec![0.0f32; len * group];
    for (h, row) in scores.chunks_exact(len).enumerate() {
        for (p, &s) in probabilities.iter_mut().skip(h).step_by(group).zip(row) {
            *p = s;
        }
    }
    let mut code_weights = Vec::new();
    let mut sign_weights = Vec::new();
    walk(plan.values, range, |t, words, halves, n, is_body| {
        let i = t - start;
        let record_words = words.len() / n;
        let weights = &probabilities[i * group..(i + n) * group];
        if !is_body {
            let run = PlainRun {
                words,
                record_words,
                offset: 0,
                kind: plain_kind(plan.values.fp_codec()),
                dim: d,
            };
            simd::accumulate_plain(isa, &run, weights, ensure(&mut full, group * d));
            return;
        }
        scales.load(isa, halves, n, &plan.value_parts);
        for (k, (part, acc)) in plan.value_parts.iter().zip(parts.iter_mut()).enumerate() {
            match &part.body {
                Body::Plain(kind) => {
                    let run = PlainRun {
                        words,
                        record_words,
                        offset: part.word_offset,
                        kind: *kind,
                        dim: part.dim,
                    };
                    let values = ensure(&mut acc.values, group * part.dim);
                    simd::accumulate_plain(isa, &run, weights, values);
                }
                Body::Codes { .. } => {
                    let part_scales = scales.of(k, part);
                    let Some(run) = part.coded_run(words, record_words, part_scales) else {
                        continue;
                    };
                    let spt = run.scales_per_token();
                    let m = run.sketch_dim;
                    scale_rows(weights, part_scales, spt, 0, group, &mut code_weights);
                    if m > 0 {
                        scale_rows(weights, part_scales, spt, 1, group, &mut sign_weights);
                        ensure(&mut acc.signs, group * m);
                    }
                    let values = ensure(&mut acc.values, group * part.dim);
                    simd::accumulate_coded(
                        isa,
                        &run,
                        &code_weights,
                        &sign_weights,
                        values,
                        &mut acc.signs,
                    );
                }
            }
        }
    });
    BlockPartial {
        max,
        sum,
        full,
        parts,
    }
}

/// Fused attention on the compressed cache (see the module docs), on the instruction set
/// [`Isa::detect`] picks.
pub fn fused_attention(
    cache: &KvCache,
    queries: &[f32],
    query_positions: &[u32],
    shape: AttentionShape,
    out: &mut [f32],
) -> Result<(), CacheError> {
    fused_attention_on(Isa::detect(), cache, queries, query_positions, shape, out)
}

/// [`fused_attention`] on a given (available) instruction set.
pub(super) fn fused_attention_on(
    isa: Isa,
    cache: &KvCache,
    queries: &[f32],
    query_positions: &[u32],
    shape: AttentionShape,
    out: &mut [f32],
) -> Result<(), CacheError> {
    let (n, group) = check_shapes(cache, queries, query_positions, shape, out)?;
    let d = cache.layout().head_dim;
    let kv_heads = cache.layout().kv_heads;
    let plans: Vec<HeadPlan<'_>> = (0..kv_heads)
        .map(|g| {
            let (keys, values) = (cache.keys(g), cache.values(g));
            Ok(HeadPlan {
                keys,
                values,
                key_parts: parts_of(keys.codec())?,
                value_parts: parts_of(values.codec())?,
            })
        })
        .collect::<Result<_, CacheError>>()?;
    // One item per (query token, KV head): its prepared heads and its blocks.
    let items: Vec<(usize, usize)> = (0..n)
        .flat_map(|i| (0..kv_heads).map(move |g| (i, g)))
        .collect();
    let prepared: Vec<PreparedGroup> = items
        .par_iter()
        .map(|&(i, g)| {
            let first = (i * shape.q_heads + g * group) * d;
            prepare(
                isa,
                &plans[g].key_parts,
                &queries[first..first + group * d],
                d,
                shape.scale,
            )
        })
        .collect::<Result<_, _>>()?;
    let mut tasks = Vec::new();
    for (item, &(i, _)) in items.iter().enumerate() {
        let range = cache.visible(query_positions[i]);
        let block = block_tokens(range.len());
        let mut start = range.start;
        while start < range.end {
            let end = (start + block).min(range.end);
            tasks.push((item, start..end));
            start = end;
        }
    }
    let partials: Vec<BlockPartial> = tasks
        .par_iter()
        .map(|(item, range)| {
            let g = items[*item].1;
            run_block(isa, &plans[g], &prepared[*item], range.clone(), d)
        })
        .collect();
    // Combine the blocks of each item in order; items are independent.
    let mut first_task = vec![usize::MAX; items.len()];
    let mut task_count = vec![0usize; items.len()];
    for (k, (item, _)) in tasks.iter().enumerate() {
        first_task[*item] = first_task[*item].min(k);
        task_count[*item] += 1;
    }
    let outputs: Vec<Result<Vec<f32>, CacheError>> = items
        .par_iter()
        .enumerate()
        .map(|(item, &(_, g))| {
            let blocks = if task_count[item] == 0 {
                &[][..]
            } else {
                &partials[first_task[item]..first_task[item] + task_count[item]]
            };
            combine(isa, &plans[g].value_parts, blocks, group, d)
        })
        .collect();
    for (item, result) in outputs.into_iter().enumerate() {
        let (i, g) = items[item];
        let rows = result?;
        let first = (i * shape.q_heads + g * group) * d;
        out[first..first + group * d].copy_from_slice(&rows);
    }
    Ok(())
}

/// Merges block partials (fixed order) and maps each part's accumulators back to the original
/// domain: one `Sᵀ` (TQ_prod values) and one `Π_Vᵀ` per output row and coded part, then
/// scatters the part to its channels.
fn combine(
    isa: Isa,
    parts: &[Part<'_>],
    blocks: &[BlockPartial],
    group: usize,
    d: usize,
) -> Result<Vec<f32>, CacheError> {
    let mut out = vec![0.0f32; group * d];
    if blocks.is_empty() {
        return Ok(out);
    }
    let mut full = vec![0.0f32; d];
    for h in 0..group {
        let max = blocks
            .iter()
            .map(|b| b.max[h])
            .fold(f32::NEG_INFINITY, f32::max);
        let weights: Vec<f32> = blocks.iter().map(|b| (b.max[h] - max).exp()).collect();
        let mut total = 0.0f32;
        full.fill(0.0);
        for (b, &w) in blocks.iter().zip(&weights) {
            total += w * b.sum[h];
            if !b.full.is_empty() {
                simd::axpy(isa, w, &b.full[h * d..(h + 1) * d], &mut full);
            }
        }
        let row = &mut out[h * d..(h + 1) * d];
        for (p, part) in parts.iter().enumerate() {
            let (dp, m) = (part.dim, part.sketch_dim());
            let mut values = vec![0.0f32; dp];
            let mut signs = vec![0.0f32; m];
            for (b, &w) in blocks.iter().zip(&weights) {
                let acc = &b.parts[p];
                if !acc.values.is_empty() {
                    simd::axpy(isa, w, &acc.values[h * dp..(h + 1) * dp], &mut values);
                }
                if !acc.signs.is_empty() {
                    simd::axpy(isa, w, &acc.signs[h * m..(h + 1) * m], &mut signs);
                }
            }
            let mapped = match &part.body {
                Body::Plain(_) => values,
                Body::Codes {
                    rotation, sketch, ..
                } => {
                    if let Some(sketch) = sketch {
                        let mut back = vec![0.0f32; dp];
                        sketch
                            .project_transpose(&signs, &mut back)
                            .map_err(crate::codec::CodecError::from)?;
                        simd::axpy(isa, sketch.gain() as f32, &back, &mut values);
                    }
                    let mut original = vec![0.0f32; dp];
                    rotation
                        .apply_inverse(&values, &mut original)
                        .map_err(crate::codec::CodecError::from)?;
                    original
                }
            };
            match part.channels {
                Some(channels) => {
                    for (&v, &c) in mapped.iter().zip(channels) {
                        row[usize::from(c)] += v;
                    }
                }
                None => {
                    for (o, v) in row.iter_mut().zip(&mapped) {
                        *o += v;
                    }
                }
            }
        }
        let inv = 1.0 / total;
        for (o, p) in row.iter_mut().zip(&full) {
            *o = (*o + p) * inv;
        }
    }
    Ok(out)
}
