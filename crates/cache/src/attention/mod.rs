//! Attention over a [`KvCache`]: the exact reference and the fused rotated-domain kernel.
//!
//! Shapes (row-major): queries and outputs `[query_len, q_heads, head_dim]`; query head `h`
//! reads KV head `h / (q_heads / kv_heads)` (GQA). Scores are `scale · ⟨q, k⟩` (times the
//! debiasing factor for debiased-MSE keys), masked by positions (see [`KvCache::visible`]).
//!
//! Mean-centered streams ([`center`](crate::center)) store `x − μ`. The kernels work in that
//! stored domain and need nothing for keys (a common shift of a query's scores leaves its
//! softmax unchanged); [`attend`] adds each KV head's value mean `μ_v` to the outputs of its
//! query heads once, after the kernel (`Σ p·v = μ_v + Σ p·(v − μ_v)` since `Σ p = 1`). Every
//! public entry point — the kernel functions below, [`simd::fused_attention_on`], [`attend_in_step`],
//! [`KvCache::forward`] and `ModelCache::forward_layer` (own or shared KV) — runs through
//! the same function, so each kernel gets it from that one place.
//!
//! Full-precision windows (`recent_fp_tokens`): the queries of a step (the batch just written:
//! [`KvCache::forward`], `ModelCache::forward_layer`, [`attend_in_step`]) each read their own
//! newest tokens from full-precision copies, as a decode step does, so prefill and decode agree
//! whatever the chunking; [`attend`] over a stored cache reads the stream's newest tokens.

pub mod fast_scan;
mod fused;
mod llamacpp;
pub mod primitives;
mod reference;
pub mod simd;

use crate::error::CacheError;
use crate::heavy_hitters::ReceivedWeights;
use crate::kv_cache::KvCache;

/// Which implementation computes attention.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AttentionKernel {
    /// Decode every visible token to f32 and run exact softmax attention (f64 sums).
    Reference,
    /// Score packed codes directly in the rotated domain; one inverse rotation per output.
    #[default]
    Fused,
    /// The f16 arithmetic of llama.cpp's CPU flash attention (f16 caches only), to reproduce
    /// that engine's greedy outputs exactly.
    LlamaCppF16,
    /// [`AttentionKernel::LlamaCppF16`] as llama.cpp rounds when built for a CPU with
    /// AVX512-FP16 (`-march=native` on Sapphire Rapids and later): the f16 dot sums in 16-lane
    /// accumulators and the value accumulator is updated with native f16 multiply-adds, the
    /// softmax weight rounded to f16. The build behind the Gemma 3 reference data.
    LlamaCppF16Avx512Fp16,
    /// [`AttentionKernel::Fused`] on a chosen instruction set instead of the detected one:
    /// each instruction set sums in its own (equally valid) order, so results that must be
    /// bit-identical across machines (golden snapshots) pin one. An instruction set this CPU
    /// lacks is a [`CacheError::InvalidConfig`].
    FusedOn(simd::Isa),
}

/// The shape of an attention call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionShape {
    /// Query heads (a multiple of the cache's KV heads).
    pub q_heads: usize,
    /// Softmax temperature, usually `1/√head_dim`.
    pub scale: f32,
}

/// Checks shapes shared by both kernels; returns `(query_len, group size)`.
pub(crate) fn check_shapes(
    cache: &KvCache,
    queries: &[f32],
    query_positions: &[u32],
    shape: AttentionShape,
    out: &[f32],
) -> Result<(usize, usize), CacheError> {
    let layout = cache.layout();
    if shape.q_heads == 0 || !shape.q_heads.is_multiple_of(layout.kv_heads) {
        return Err(CacheError::InvalidConfig(format!(
            "{} query heads cannot share {} KV heads evenly",
            shape.q_heads, layout.kv_heads
        )));
    }
    let n = query_positions.len();
    let width = shape.q_heads * layout.head_dim;
    for (what, len) in [("queries", queries.len()), ("attention output", out.len())] {
        if len != n * width {
            return Err(CacheError::ShapeMismatch {
                what,
                expected: n * width,
                actual: len,
            });
        }
    }
    if let Some((index, value)) = queries.iter().enumerate().find(|(_, v)| !v.is_finite()) {
        return Err(CacheError::Codec(crate::codec::CodecError::NonFinite {
            index,
            value: *value,
        }));
    }
    Ok((n, shape.q_heads / layout.kv_heads))
}

/// Runs the chosen kernel, then adds the value means of centered streams (see the module
/// docs): the one place every kernel's output leaves the stored domain.
///
/// Attention over the cache as stored: with a full-precision recent window
/// (`recent_fp_tokens`), every query reads the stream's newest `recent_fp_tokens` tokens from
/// their full-precision copies ([`Stream::window_start`](crate::stream::Stream::window_start)
/// without `in_step`). The queries of a batch that was just appended use
/// [`attend_in_step`], which gives each its own window.
pub fn attend(
    cache: &KvCache,
    queries: &[f32],
    query_positions: &[u32],
    shape: AttentionShape,
    kernel: AttentionKernel,
    out: &mut [f32],
) -> Result<(), CacheError> {
    attend_with_window(
        cache,
        (queries, query_positions),
        shape,
        kernel,
        false,
        (out, None),
    )
}

/// [`attend`] for the queries of the batch the cache's last append wrote (what
/// [`KvCache::forward`] and `ModelCache::forward_layer` run): each query reads its own newest
/// `recent_fp_tokens` tokens from full-precision copies, the window a decode step at that
/// query reads, so a prefill gives every query what decoding token by token would. Without a
/// recent window, or for queries the last append did not write, it is [`attend`].
pub fn attend_in_step(
    cache: &KvCache,
    queries: &[f32],
    query_positions: &[u32],
    shape: AttentionShape,
    kernel: AttentionKernel,
    out: &mut [f32],
) -> Result<(), CacheError> {
    attend_with_window(
        cache,
        (queries, query_positions),
        shape,
        kernel,
        true,
        (out, None),
    )
}

/// [`attend_in_step`] that also hands back, in `received`, the share of attention each query
/// gave each token of its windows ([`ReceivedWeights`]): what a cache with heavy hitters
/// ([`heavy_hitters`](crate::heavy_hitters)) counts. The reference and fused kernels give it;
/// the llama.cpp-compatible ones (all-f16 caches, which keep no heavy hitters) refuse.
pub fn attend_in_step_gathering(
    cache: &KvCache,
    queries: &[f32],
    query_positions: &[u32],
    shape: AttentionShape,
    kernel: AttentionKernel,
    (out, received): (&mut [f32], &mut ReceivedWeights),
) -> Result<(), CacheError> {
    attend_with_window(
        cache,
        (queries, query_positions),
        shape,
        kernel,
        true,
        (out, Some(received)),
    )
}

fn attend_with_window(
    cache: &KvCache,
    (queries, query_positions): (&[f32], &[u32]),
    shape: AttentionShape,
    kernel: AttentionKernel,
    in_step: bool,
    (out, received): (&mut [f32], Option<&mut ReceivedWeights>),
) -> Result<(), CacheError> {
    match kernel {
        AttentionKernel::Reference => reference::run(
            cache,
            (queries, query_positions),
            shape,
            in_step,
            out,
            received,
        ),
        AttentionKernel::Fused | AttentionKernel::FusedOn(_) => {
            let isa = match kernel {
                AttentionKernel::FusedOn(isa) if !isa.is_available() => {
                    return Err(CacheError::InvalidConfig(format!(
                        "the fused kernel cannot run on {isa:?}: this CPU lacks it"
                    )));
                }
                AttentionKernel::FusedOn(isa) => isa,
                _ => simd::Isa::detect(),
            };
            fused::fused_attention_on(
                isa,
                cache,
                queries,
                query_positions,
                shape,
                in_step,
                out,
                received,
            )
        }
        AttentionKernel::LlamaCppF16 | AttentionKernel::LlamaCppF16Avx512Fp16
            if received.is_some() =>
        {
            Err(CacheError::InvalidConfig(
                "the llama.cpp-compatible kernels read all-f16 caches, which keep no heavy \
                 hitters: they gather no attention weights"
                    .into(),
            ))
        }
        AttentionKernel::LlamaCppF16 => llamacpp::run(
            cache,
            queries,
            query_positions,
            shape,
            llamacpp::LlamaCppBuild::Avx2,
            out,
        ),
        AttentionKernel::LlamaCppF16Avx512Fp16 => llamacpp::run(
            cache,
            queries,
            query_positions,
            shape,
            llamacpp::LlamaCppBuild::Avx512Fp16,
            out,
        ),
    }?;
    add_value_means(cache, query_positions, shape, out);
    Ok(())
}

/// Adds `μ_v` of KV head `g` to the output row of every query head of `g`'s group.
///
/// Runs after a kernel succeeded, so the shapes are checked. A query that sees no token keeps
/// the zero output every kernel gives it (it has no weights to sum to one). Zero coordinates
/// of `μ_v` are skipped rather than added: `o + 0.0` turns `−0.0` into `+0.0`, and a stream
/// whose first batch was too short (`μ = 0`) must give exactly an uncentered stream's bits.
fn add_value_means(
    cache: &KvCache,
    query_positions: &[u32],
    shape: AttentionShape,
    out: &mut [f32],
) {
    let layout = cache.layout();
    if (0..layout.kv_heads).all(|g| cache.values(g).mean().is_none()) {
        return;
    }
    let d = layout.head_dim;
    let group = shape.q_heads / layout.kv_heads;
    for (rows, &p) in out.chunks_exact_mut(shape.q_heads * d).zip(query_positions) {
        if cache.visible(p).is_empty() {
            continue;
        }
        for (h, row) in rows.chunks_exact_mut(d).enumerate() {
            if let Some(mean) = cache.values(h / group).mean() {
                for (o, &m) in row.iter_mut().zip(mean) {
                    if m != 0.0 {
                        *o += m;
                    }
                }
            }
        }
    }
}

/// Exact attention over the decoded cache: every visible key and value decoded to f32, softmax
/// and sums in f64. Every fast path is tested against it. The same as [`attend`] with
/// [`AttentionKernel::Reference`] (value means of centered streams included).
pub fn reference_attention(
    cache: &KvCache,
    queries: &[f32],
    query_positions: &[u32],
    shape: AttentionShape,
    out: &mut [f32],
) -> Result<(), CacheError> {
    attend(
        cache,
        queries,
        query_positions,
        shape,
        AttentionKernel::Reference,
        out,
    )
}

/// Fused attention on the compressed cache (rotated-domain scoring on packed codes, see
/// [`AttentionKernel::Fused`]), on the instruction set [`simd::Isa::detect`] picks. The same as
/// [`attend`] with [`AttentionKernel::Fused`] (value means of centered streams included).
pub fn fused_attention(
    cache: &KvCache,
    queries: &[f32],
    query_positions: &[u32],
    shape: AttentionShape,
    out: &mut [f32],
) -> Result<(), CacheError> {
    attend(
        cache,
        queries,
        query_positions,
        shape,
        AttentionKernel::Fused,
        out,
    )
}

/// llama.cpp-compatible attention over an all-f16 cache (see
/// [`AttentionKernel::LlamaCppF16`]). The same as [`attend`] with that kernel (value means of
/// centered streams included).
pub fn llamacpp_f16_attention(
    cache: &KvCache,
    queries: &[f32],
    query_positions: &[u32],
    shape: AttentionShape,
    out: &mut [f32],
) -> Result<(), CacheError> {
    attend(
        cache,
        queries,
        query_positions,
        shape,
        AttentionKernel::LlamaCppF16,
        out,
    )
}
