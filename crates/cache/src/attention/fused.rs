//! Fused rotated-domain attention over packed codes.
//!
//! Per query head: rotate the (scaled) query once, `q̃ = Π_K·q`, and for TQ_prod keys project it
//! once more, `S·q̃`, into byte tables (`m/8` look-ups per key). A compressed key then costs one
//! unpack of its codes into centroids and one dot product per query head of the GQA group
//! (the unpacked centroids are shared by the group): `score = norm·⟨q̃, c[idx]⟩ + γ·⟨α·s·S·q̃, z⟩`.
//! Values accumulate in the rotated domain, `Σ p·norm·c[idx]`, and for TQ_prod values in the
//! sketch domain too, `Σ p·γ·z`; each output then costs one `Sᵀ` and one `Π_Vᵀ`, not one per
//! token. Full-precision tokens (f16/f32 streams, sinks, the recent window) accumulate in the
//! original domain beside them.
//!
//! Work splits into fixed blocks of [`BLOCK_TOKENS`] visible tokens per (query, KV head),
//! flash-decoding style: each block keeps its own max, sum and accumulators, and blocks are
//! combined in order afterwards. Block boundaries depend only on the visible range, so the
//! result is bit-identical whatever the number of threads.

use half::f16;
use rayon::prelude::*;
use tq_qjl::QjlSketch;
use tq_rotation::Rotation;

use super::primitives::{
    accumulate_signs, axpy, decode_f16_pairs, decode_f32_words, dequantize_codes, dot,
    sign_byte_tables, signed_sum,
};
use super::{AttentionShape, check_shapes};
use crate::error::CacheError;
use crate::kv_cache::KvCache;
use crate::stream::{Stream, TokenSource};
use crate::token_codec::TokenCodec;

/// Visible tokens per work item.
pub const BLOCK_TOKENS: usize = 256;

/// What the kernel needs to read one stream's compressed body.
enum Body<'a> {
    F32,
    F16,
    Codes {
        bits: u8,
        centroids: &'a [f32],
        rotation: &'a Rotation,
        /// Words of codes at the start of each record (sign words follow for TQ_prod).
        code_words: usize,
        sketch: Option<&'a QjlSketch>,
        correction: f32,
    },
}

impl<'a> Body<'a> {
    fn of(codec: &'a TokenCodec) -> Self {
        match codec {
            TokenCodec::F32 { .. } => Body::F32,
            TokenCodec::F16 { .. } => Body::F16,
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
        }
    }
}

/// One query head prepared against one key stream.
struct PreparedHead {
    /// `scale·q`, for full-precision keys.
    plain: Vec<f32>,
    /// `scale·correction·Π_K·q`, for coded keys.
    rotated: Vec<f32>,
    /// Byte tables of `α·s·S·(scale·Π_K·q)`, for TQ_prod keys.
    sign_tables: Vec<f32>,
}

fn prepare(body: &Body<'_>, q: &[f32], scale: f32) -> Result<PreparedHead, CacheError> {
    let plain: Vec<f32> = q.iter().map(|v| v * scale).collect();
    let mut rotated = Vec::new();
    let mut sign_tables = Vec::new();
    if let Body::Codes {
        rotation,
        sketch,
        correction,
        ..
    } = body
    {
        rotated = vec![0.0; q.len()];
        rotation
            .apply(&plain, &mut rotated)
            .map_err(crate::codec::CodecError::from)?;
        if let Some(sketch) = sketch {
            let mut projected = vec![0.0; q.len()];
            sketch
                .project(&rotated, &mut projected)
                .map_err(crate::codec::CodecError::from)?;
            let gain = sketch.gain() as f32;
            projected.iter_mut().for_each(|v| *v *= gain);
            sign_byte_tables(&projected, &mut sign_tables);
        }
        if *correction != 1.0 {
            rotated.iter_mut().for_each(|v| *v *= correction);
        }
    }
    Ok(PreparedHead {
        plain,
        rotated,
        sign_tables,
    })
}

/// The partial result of one block for the heads of one GQA group.
struct BlockPartial {
    max: Vec<f32>,
    sum: Vec<f32>,
    /// `[group, d]` accumulators: original domain, rotated domain, sketch domain.
    plain: Vec<f32>,
    rotated: Vec<f32>,
    signs: Vec<f32>,
}

/// Calls `visit(token, record, scales, is_body)` for every token of `range`, walking the body in
/// contiguous runs.
fn walk(
    stream: &Stream,
    range: std::ops::Range<usize>,
    mut visit: impl FnMut(usize, &[u32], &[f16], bool),
) {
    let body = stream.body();
    let words = body.record_words();
    let scales = body.scales_per_token();
    let recent_start = stream.recent_start();
    let mut t = range.start;
    while t < range.end {
        match stream.source(t) {
            TokenSource::Body(slot) => {
                let limit = range.end.min(recent_start.max(t + 1)) - t;
                let Some((w, s, n)) = body.run(slot, limit) else {
                    return;
                };
                for j in 0..n {
                    visit(
                        t + j,
                        &w[j * words..(j + 1) * words],
                        &s[j * scales..(j + 1) * scales],
                        true,
                    );
                }
                t += n;
            }
            TokenSource::Sink(_) | TokenSource::Recent(_) => {
                if let Some((_, record, s)) = stream.token(t) {
                    visit(t, record, s, false);
                }
                t += 1;
            }
        }
    }
}

fn decode_plain(codec: &TokenCodec, record: &[u32], out: &mut [f32]) {
    match codec {
        TokenCodec::F32 { .. } => decode_f32_words(record, out),
        _ => decode_f16_pairs(record, out),
    }
}

#[allow(clippy::too_many_arguments)]
fn run_block(
    keys: &Stream,
    values: &Stream,
    key_body: &Body<'_>,
    value_body: &Body<'_>,
    heads: &[PreparedHead],
    range: std::ops::Range<usize>,
    d: usize,
) -> BlockPartial {
    let group = heads.len();
    let len = range.len();
    let mut scores = vec![0.0f32; group * len];
    let mut vector = vec![0.0f32; d];
    let start = range.start;
    walk(keys, range.clone(), |t, record, scales, is_body| {
        let i = t - start;
        match (is_body, key_body) {
            (
                true,
                Body::Codes {
                    bits,
                    centroids,
                    code_words,
                    sketch,
                    ..
                },
            ) => {
                dequantize_codes(&record[..*code_words], *bits, centroids, &mut vector);
                let norm = scales[0].to_f32();
                for (h, head) in heads.iter().enumerate() {
                    let mut s = norm * dot(&head.rotated, &vector);
                    if sketch.is_some() {
                        s += scales[1].to_f32()
                            * signed_sum(&head.sign_tables, &record[*code_words..]);
                    }
                    scores[h * len + i] = s;
                }
            }
            _ => {
                let codec = if is_body {
                    keys.codec()
                } else {
                    keys.fp_codec()
                };
                decode_plain(codec, record, &mut vector);
                for (h, head) in heads.iter().enumerate() {
                    scores[h * len + i] = dot(&head.plain, &vector);
                }
            }
        }
    });
    let mut max = vec![f32::NEG_INFINITY; group];
    let mut sum = vec![0.0f32; group];
    for h in 0..group {
        let row = &mut scores[h * len..(h + 1) * len];
        max[h] = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut total = 0.0f32;
        for s in row.iter_mut() {
            *s = (*s - max[h]).exp();
            total += *s;
        }
        sum[h] = total;
    }
    let mut plain = vec![0.0f32; group * d];
    let mut rotated = vec![0.0f32; group * d];
    let mut signs = vec![0.0f32; group * d];
    walk(values, range, |t, record, scales, is_body| {
        let i = t - start;
        match (is_body, value_body) {
            (
                true,
                Body::Codes {
                    bits,
                    centroids,
                    code_words,
                    sketch,
                    ..
                },
            ) => {
                dequantize_codes(&record[..*code_words], *bits, centroids, &mut vector);
                let norm = scales[0].to_f32();
                for h in 0..group {
                    let p = scores[h * len + i];
                    axpy(p * norm, &vector, &mut rotated[h * d..(h + 1) * d]);
                    if sketch.is_some() {
                        accumulate_signs(
                            p * scales[1].to_f32(),
                            &record[*code_words..],
                            &mut signs[h * d..(h + 1) * d],
                        );
                    }
                }
            }
            _ => {
                let codec = if is_body {
                    values.codec()
                } else {
                    values.fp_codec()
                };
                decode_plain(codec, record, &mut vector);
                for h in 0..group {
                    axpy(scores[h * len + i], &vector, &mut plain[h * d..(h + 1) * d]);
                }
            }
        }
    });
    BlockPartial {
        max,
        sum,
        plain,
        rotated,
        signs,
    }
}

/// Fused attention on the compressed cache (see the module docs).
pub fn fused_attention(
    cache: &KvCache,
    queries: &[f32],
    query_positions: &[u32],
    shape: AttentionShape,
    out: &mut [f32],
) -> Result<(), CacheError> {
    let (n, group) = check_shapes(cache, queries, query_positions, shape, out)?;
    let d = cache.layout().head_dim;
    let kv_heads = cache.layout().kv_heads;
    // One item per (query token, KV head): its prepared heads and its blocks.
    let items: Vec<(usize, usize)> = (0..n)
        .flat_map(|i| (0..kv_heads).map(move |g| (i, g)))
        .collect();
    let prepared: Vec<Vec<PreparedHead>> = items
        .par_iter()
        .map(|&(i, g)| {
            let body = Body::of(cache.keys(g).codec());
            (0..group)
                .map(|j| {
                    let h = g * group + j;
                    let row = i * shape.q_heads + h;
                    prepare(&body, &queries[row * d..(row + 1) * d], shape.scale)
                })
                .collect::<Result<Vec<_>, _>>()
        })
        .collect::<Result<_, _>>()?;
    let mut tasks = Vec::new();
    for (item, &(i, _)) in items.iter().enumerate() {
        let range = cache.visible(query_positions[i]);
        let mut start = range.start;
        while start < range.end {
            let end = (start + BLOCK_TOKENS).min(range.end);
            tasks.push((item, start..end));
            start = end;
        }
    }
    let partials: Vec<BlockPartial> = tasks
        .par_iter()
        .map(|(item, range)| {
            let g = items[*item].1;
            let keys = cache.keys(g);
            let values = cache.values(g);
            run_block(
                keys,
                values,
                &Body::of(keys.codec()),
                &Body::of(values.codec()),
                &prepared[*item],
                range.clone(),
                d,
            )
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
            combine(cache.values(g), blocks, group, d)
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

/// Merges block partials (fixed order) and maps the coded accumulators back to the original
/// domain: one `Sᵀ` (TQ_prod values) and one `Π_Vᵀ` per output row.
fn combine(
    values: &Stream,
    blocks: &[BlockPartial],
    group: usize,
    d: usize,
) -> Result<Vec<f32>, CacheError> {
    let mut out = vec![0.0f32; group * d];
    if blocks.is_empty() {
        return Ok(out);
    }
    let body = Body::of(values.codec());
    let mut rotated = vec![0.0f32; d];
    let mut signs = vec![0.0f32; d];
    let mut plain = vec![0.0f32; d];
    let mut mapped = vec![0.0f32; d];
    for h in 0..group {
        let max = blocks
            .iter()
            .map(|b| b.max[h])
            .fold(f32::NEG_INFINITY, f32::max);
        let mut total = 0.0f32;
        rotated.fill(0.0);
        signs.fill(0.0);
        plain.fill(0.0);
        for b in blocks {
            let w = (b.max[h] - max).exp();
            total += w * b.sum[h];
            axpy(w, &b.rotated[h * d..(h + 1) * d], &mut rotated);
            axpy(w, &b.signs[h * d..(h + 1) * d], &mut signs);
            axpy(w, &b.plain[h * d..(h + 1) * d], &mut plain);
        }
        let row = &mut out[h * d..(h + 1) * d];
        if let Body::Codes {
            rotation, sketch, ..
        } = &body
        {
            if let Some(sketch) = sketch {
                sketch
                    .project_transpose(&signs, &mut mapped)
                    .map_err(crate::codec::CodecError::from)?;
                axpy(sketch.gain() as f32, &mapped, &mut rotated);
            }
            rotation
                .apply_inverse(&rotated, row)
                .map_err(crate::codec::CodecError::from)?;
        }
        let inv = 1.0 / total;
        for (o, p) in row.iter_mut().zip(&plain) {
            *o = (*o + p) * inv;
        }
    }
    Ok(out)
}
