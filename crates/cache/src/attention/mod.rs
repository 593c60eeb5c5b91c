//! Attention over a [`KvCache`]: the exact reference and the fused rotated-domain kernel.
//!
//! Shapes (row-major): queries and outputs `[query_len, q_heads, head_dim]`; query head `h`
//! reads KV head `h / (q_heads / kv_heads)` (GQA). Scores are `scale · ⟨q, k⟩` (times the
//! debiasing factor for debiased-MSE keys), masked by positions (see [`KvCache::visible`]).

mod fused;
mod llamacpp;
pub mod primitives;
mod reference;
pub mod simd;

use crate::error::CacheError;
use crate::kv_cache::KvCache;

pub use fused::fused_attention;
pub use llamacpp::llamacpp_f16_attention;
pub use reference::reference_attention;

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

/// Runs the chosen kernel.
pub fn attend(
    cache: &KvCache,
    queries: &[f32],
    query_positions: &[u32],
    shape: AttentionShape,
    kernel: AttentionKernel,
    out: &mut [f32],
) -> Result<(), CacheError> {
    match kernel {
        AttentionKernel::Reference => {
            reference_attention(cache, queries, query_positions, shape, out)
        }
        AttentionKernel::Fused => fused_attention(cache, queries, query_positions, shape, out),
        AttentionKernel::FusedOn(isa) => {
            if !isa.is_available() {
                return Err(CacheError::InvalidConfig(format!(
                    "the fused kernel cannot run on {isa:?}: this CPU lacks it"
                )));
            }
            fused::fused_attention_on(isa, cache, queries, query_positions, shape, out)
        }
        AttentionKernel::LlamaCppF16 => {
            llamacpp_f16_attention(cache, queries, query_positions, shape, out)
        }
    }
}
