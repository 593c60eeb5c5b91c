//! Attention with the arithmetic of llama.cpp's CPU flash-attention kernel, for f16 caches.
//!
//! The reference engine's greedy outputs are the ground truth the model runner is tested
//! against, and greedy decoding flips on near-ties, so the baseline must round where that
//! engine rounds: the query is converted to f16 before the dot products with the f16 keys,
//! scores are `scale·⟨q₁₆, k⟩`, and the value accumulator itself is kept in f16 through an
//! online softmax that visits tokens in order (`acc ← f16(acc·e^{m_old−m_new})`, then
//! `acc ← f16(acc + v·e^{s−m})` per token), its denominator updated with one fused
//! multiply-add (`S ← fma(S, e^{m_old−m_new}, e^{s−m})`, as the compiler fuses ggml's C). Only f16 key and value streams without sinks or a
//! recent window qualify; anything else is refused — this kernel exists to reproduce one
//! engine's f16 baseline, not to serve compressed caches.

use half::f16;
use rayon::prelude::*;

use super::{AttentionShape, check_shapes};
use crate::error::CacheError;
use crate::kv_cache::KvCache;
use crate::token_codec::TokenCodec;

/// `⟨q, k⟩` summed as ggml's AVX2 `ggml_vec_dot_f16` sums: four 8-lane FMA accumulators over
/// steps of 32, reduced pairwise (0+2, 1+3, then 0+1), the 8 lanes folded as
/// `((l0+h0)+(l1+h1)) + ((l2+h2)+(l3+h3))`, and the tail added one by one.
fn ggml_dot_f16(q: &[f32], k: &[f32]) -> f32 {
    let n = q.len();
    let steps = n / 32;
    let mut acc = [[0.0f32; 8]; 4];
    for step in 0..steps {
        for (j, lanes) in acc.iter_mut().enumerate() {
            for (l, lane) in lanes.iter_mut().enumerate() {
                let i = step * 32 + j * 8 + l;
                *lane = q[i].mul_add(k[i], *lane);
            }
        }
    }
    let add = |a: [f32; 8], b: [f32; 8]| -> [f32; 8] { std::array::from_fn(|l| a[l] + b[l]) };
    let x0 = add(add(acc[0], acc[2]), add(acc[1], acc[3]));
    let quad: [f32; 4] = std::array::from_fn(|l| x0[l] + x0[l + 4]);
    let mut sum = f64::from((quad[0] + quad[1]) + (quad[2] + quad[3]));
    for i in steps * 32..n {
        sum += f64::from(q[i] * k[i]);
    }
    sum as f32
}

fn f16_row(record: &[u32], out: &mut [f32]) {
    for (i, o) in out.iter_mut().enumerate() {
        let w = record[i / 2];
        let half = if i % 2 == 0 { w & 0xFFFF } else { w >> 16 };
        *o = f16::from_bits(half as u16).to_f32();
    }
}

/// llama.cpp-compatible attention over an all-f16 cache (see the module docs).
pub fn llamacpp_f16_attention(
    cache: &KvCache,
    queries: &[f32],
    query_positions: &[u32],
    shape: AttentionShape,
    out: &mut [f32],
) -> Result<(), CacheError> {
    let (_, group) = check_shapes(cache, queries, query_positions, shape, out)?;
    let layout = cache.layout();
    for h in 0..layout.kv_heads {
        for stream in [cache.keys(h), cache.values(h)] {
            let plain = matches!(stream.codec(), TokenCodec::F16 { .. })
                && stream.sink_end() == 0
                && stream.recent_start() == stream.len();
            if !plain {
                return Err(CacheError::InvalidConfig(
                    "the llama.cpp-compatible kernel needs f16 streams without sinks or recent windows"
                        .into(),
                ));
            }
        }
    }
    let d = layout.head_dim;
    let q_heads = shape.q_heads;
    out.par_chunks_mut(d)
        .enumerate()
        .try_for_each(|(row, o)| -> Result<(), CacheError> {
            let (i, h) = (row / q_heads, row % q_heads);
            let kv = h / group;
            let q: Vec<f32> = queries[row * d..(row + 1) * d]
                .iter()
                .map(|v| f16::from_f32(*v).to_f32())
                .collect();
            let keys = cache.keys(kv);
            let values = cache.values(kv);
            let mut k = vec![0.0f32; d];
            let mut v = vec![0.0f32; d];
            let mut acc = vec![f16::ZERO; d];
            let (mut max, mut sum) = (f32::NEG_INFINITY, 0.0f32);
            for t in cache.visible(query_positions[i]) {
                let (_, record, _) = keys
                    .token(t)
                    .ok_or(CacheError::InvalidConfig("token missing".into()))?;
                f16_row(record, &mut k);
                let s = ggml_dot_f16(&q, &k) * shape.scale;
                let old = max;
                let mut rescale = 1.0f32;
                let weight;
                if s > max {
                    max = s;
                    rescale = (old - max).exp();
                    for a in acc.iter_mut() {
                        *a = f16::from_f32(a.to_f32() * rescale);
                    }
                    weight = 1.0;
                } else {
                    weight = (s - max).exp();
                }
                let (_, record, _) = values
                    .token(t)
                    .ok_or(CacheError::InvalidConfig("token missing".into()))?;
                f16_row(record, &mut v);
                for (a, x) in acc.iter_mut().zip(&v) {
                    *a = f16::from_f32(x.mul_add(weight, a.to_f32()));
                }
                // ggml writes `S = S*ms + vs;`, which GCC (its default `-ffp-contract=fast`
                // with FMA enabled by `-march=native`) compiles to one fused multiply-add.
                // Rounding the product separately flips two of the four reference
                // continuations at near-ties.
                sum = sum.mul_add(rescale, weight);
            }
            let inv = if sum > 0.0 { 1.0 / sum } else { 0.0 };
            for (o, a) in o.iter_mut().zip(&acc) {
                *o = a.to_f32() * inv;
            }
            Ok(())
        })
}
