//! The llama.cpp-compatible f16 kernel (`AttentionKernel::LlamaCppF16`).
//!
//! Its whole purpose is to round exactly where llama.cpp's CPU flash attention rounds, so it is
//! checked bit for bit against a transcription of that loop (`ggml_compute_forward_flash_attn_ext_f16_one_chunk`
//! with f16 K/V: query to f16, AVX2 `ggml_vec_dot_f16` lane order, online softmax with an f16
//! value accumulator, the denominator updated by one fused multiply-add), written here
//! independently from the C code's structure. It is also compared with the exact
//! reference kernel, which it may differ from only by the f16 accumulator's rounding: each of
//! the T updates rounds to f16 (relative 2⁻¹¹), so |Δ| ≤ T·2⁻¹¹·max|v| (T ≤ 40 here: 0.02); a
//! wrong mask, head mapping or scale moves outputs by far more.

mod common;

use common::{codec, fill, growing, vectors};
use half::f16;
use tq_cache::attention::{AttentionKernel, AttentionShape, attend};
use tq_cache::kv_cache::{KvCache, uniform_streams};
use tq_cache::{CacheError, CodecSpec};

const D: usize = 64;

fn f16_cache(kv_heads: usize, tokens: usize, seed: u64) -> KvCache {
    let layout = growing(kv_heads, D);
    let streams = uniform_streams(&layout, CodecSpec::F16 { dim: D });
    let mut cache = KvCache::new(layout, &streams, &streams).unwrap();
    fill(&mut cache, 0, tokens, seed);
    cache
}

/// ggml's AVX2 `ggml_vec_dot_f16` for a length that is a multiple of 32: four 8-lane FMA
/// accumulators, `GGML_F32x8_REDUCE` (0+2, 1+3, then 0+1), low and high 128-bit halves added,
/// then two `_mm_hadd_ps`.
fn ggml_avx2_dot(x: &[f32], y: &[f32]) -> f32 {
    let mut sum = [[0.0f32; 8]; 4];
    for base in (0..x.len()).step_by(32) {
        for (j, acc) in sum.iter_mut().enumerate() {
            for (l, lane) in acc.iter_mut().enumerate() {
                let i = base + 8 * j + l;
                *lane = x[i].mul_add(y[i], *lane);
            }
        }
    }
    let add = |a: [f32; 8], b: [f32; 8]| -> [f32; 8] { std::array::from_fn(|l| a[l] + b[l]) };
    let x = add(add(sum[0], sum[2]), add(sum[1], sum[3]));
    let t: [f32; 4] = std::array::from_fn(|l| x[l] + x[l + 4]);
    let hadd = [t[0] + t[1], t[2] + t[3]];
    hadd[0] + hadd[1]
}

/// The one-chunk loop for one query row over tokens `0..visible` of one KV head.
fn ggml_row(q: &[f32], keys: &[f32], values: &[f32], visible: usize, scale: f32) -> Vec<f32> {
    let q16: Vec<f32> = q.iter().map(|v| f16::from_f32(*v).to_f32()).collect();
    let mut vkq16 = [f16::ZERO; D];
    let (mut s_sum, mut m) = (0.0f32, f32::NEG_INFINITY);
    for ic in 0..visible {
        let k: Vec<f32> = keys[ic * D..(ic + 1) * D]
            .iter()
            .map(|v| f16::from_f32(*v).to_f32())
            .collect();
        let s = ggml_avx2_dot(&k, &q16) * scale;
        let m_old = m;
        let (mut ms, mut vs) = (1.0f32, 1.0f32);
        if s > m {
            m = s;
            ms = (m_old - m).exp();
            for a in vkq16.iter_mut() {
                *a = f16::from_f32(a.to_f32() * ms);
            }
        } else {
            vs = (s - m).exp();
        }
        for (a, v) in vkq16.iter_mut().zip(&values[ic * D..(ic + 1) * D]) {
            let v = f16::from_f32(*v).to_f32();
            *a = f16::from_f32(v.mul_add(vs, a.to_f32()));
        }
        s_sum = s_sum.mul_add(ms, vs);
    }
    let inv = if s_sum == 0.0 { 0.0 } else { 1.0 / s_sum };
    vkq16.iter().map(|a| a.to_f32() * inv).collect()
}

fn run(
    cache: &KvCache,
    queries: &[f32],
    positions: &[u32],
    q_heads: usize,
    kernel: AttentionKernel,
) -> Vec<f32> {
    let shape = AttentionShape {
        q_heads,
        scale: 1.0 / (D as f32).sqrt(),
    };
    let mut out = vec![0.0f32; queries.len()];
    attend(cache, queries, positions, shape, kernel, &mut out).unwrap();
    out
}

#[test]
fn matches_ggml_flash_attention_bit_for_bit() {
    for (kv_heads, q_heads, tokens, chunk) in
        [(1, 1, 1, 1), (3, 9, 40, 5), (2, 8, 17, 1), (1, 4, 33, 33)]
    {
        let seed = (tokens * 31 + q_heads) as u64;
        let cache = f16_cache(kv_heads, tokens, seed);
        let width = kv_heads * D;
        let keys = vectors(tokens, width, seed);
        let values = vectors(tokens, width, seed ^ 0xFFFF);
        let positions: Vec<u32> = (tokens - chunk..tokens).map(|p| p as u32).collect();
        let queries = vectors(chunk * q_heads, D, seed ^ 0xABCD);
        let out = run(
            &cache,
            &queries,
            &positions,
            q_heads,
            AttentionKernel::LlamaCppF16,
        );
        let group = q_heads / kv_heads;
        for (i, &p) in positions.iter().enumerate() {
            for h in 0..q_heads {
                let kv = h / group;
                // Head `kv`'s keys of every token, contiguous.
                let head = |all: &[f32]| -> Vec<f32> {
                    (0..tokens)
                        .flat_map(|t| all[t * width + kv * D..t * width + (kv + 1) * D].to_vec())
                        .collect()
                };
                let row = i * q_heads + h;
                let expected = ggml_row(
                    &queries[row * D..(row + 1) * D],
                    &head(&keys),
                    &head(&values),
                    p as usize + 1,
                    1.0 / (D as f32).sqrt(),
                );
                let got = &out[row * D..(row + 1) * D];
                assert!(
                    got.iter()
                        .zip(&expected)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "kv_heads {kv_heads}, q_heads {q_heads}, position {p}, head {h}: {got:?} vs {expected:?}"
                );
            }
        }
    }
}

#[test]
fn stays_within_the_f16_accumulator_error_of_the_reference() {
    let (kv_heads, q_heads, tokens) = (3, 9, 40);
    let cache = f16_cache(kv_heads, tokens, 5);
    let positions: Vec<u32> = (30..40).collect();
    let queries = vectors(positions.len() * q_heads, D, 77);
    let ggml = run(
        &cache,
        &queries,
        &positions,
        q_heads,
        AttentionKernel::LlamaCppF16,
    );
    let exact = run(
        &cache,
        &queries,
        &positions,
        q_heads,
        AttentionKernel::Reference,
    );
    let max_v = vectors(tokens, kv_heads * D, 5 ^ 0xFFFF)
        .iter()
        .fold(0.0f32, |m, v| m.max(v.abs()));
    let bound = tokens as f32 * 2f32.powi(-11) * max_v;
    let worst = ggml
        .iter()
        .zip(&exact)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    assert!(worst <= bound, "max |Δ| {worst} > {bound}");
    assert!(worst > 0.0, "the f16 accumulator should round somewhere");
}

#[test]
fn refuses_compressed_streams() {
    let layout = growing(1, D);
    let keys = uniform_streams(&layout, codec(2, D, 4, 1));
    let values = uniform_streams(&layout, codec(2, D, 4, 2));
    let mut cache = KvCache::new(layout, &keys, &values).unwrap();
    fill(&mut cache, 0, 4, 1);
    let shape = AttentionShape {
        q_heads: 1,
        scale: 0.125,
    };
    let mut out = vec![0.0f32; D];
    let err = attend(
        &cache,
        &vectors(1, D, 3),
        &[3],
        shape,
        AttentionKernel::LlamaCppF16,
        &mut out,
    )
    .unwrap_err();
    assert!(matches!(err, CacheError::InvalidConfig(_)), "{err}");
}
