//! Filling a model cache with deterministic keys, values and queries, for the tests of what is
//! built around caches (prompt-cache files, resource limits).
#![allow(dead_code)]

use tq_cache::attention::{AttentionKernel, AttentionShape};
use tq_cache::states::ModelCache;

/// Runs `tokens` tokens through producer layers `0..layers` of `cache` (2 KV heads of
/// dimension `head_dim`, 4 query heads) from an empty cache, with the same deterministic keys,
/// values and queries in every layer.
pub fn fill_layers(cache: &mut ModelCache, layers: usize, head_dim: usize, tokens: usize) {
    fill_layers_in_chunks(cache, layers, head_dim, tokens, tokens.max(1));
}

/// [`fill_layers`] in forward calls of at most `chunk` tokens (a sliding-window ring only takes
/// chunks it was sized for).
pub fn fill_layers_in_chunks(
    cache: &mut ModelCache,
    layers: usize,
    head_dim: usize,
    tokens: usize,
    chunk: usize,
) {
    let positions: Vec<u32> = (0..tokens as u32).collect();
    let x = |i: usize| ((i * 7919 % 1009) as f32 / 504.5 - 1.0) * 2.0;
    let kv: Vec<f32> = (0..tokens * 2 * head_dim).map(x).collect();
    let q: Vec<f32> = (0..tokens * 4 * head_dim).map(|i| x(i + 17)).collect();
    let mut out = vec![0.0f32; q.len()];
    let shape = AttentionShape {
        q_heads: 4,
        scale: 0.125,
    };
    for start in (0..tokens).step_by(chunk) {
        let end = (start + chunk).min(tokens);
        let (kv, q) = (
            &kv[start * 2 * head_dim..end * 2 * head_dim],
            &q[start * 4 * head_dim..end * 4 * head_dim],
        );
        let out = &mut out[start * 4 * head_dim..end * 4 * head_dim];
        for layer in 0..layers {
            cache
                .forward_layer(
                    layer,
                    q,
                    Some((kv, kv)),
                    &positions[..end],
                    shape,
                    AttentionKernel::Fused,
                    out,
                )
                .unwrap();
        }
    }
}
