//! The fused kernel on every instruction set: bit-identical whatever the rayon thread count,
//! within rounding of the scalar path (bit-identical to it on uncompressed caches), and
//! against the exact reference for every body kind (two-tier allocation presets included).
//!
//! Tolerance against another path or the reference: 2e-4·max|out| + 1e-5, as in
//! `attention_fused.rs` (f32 rounding of softmax-weighted sums over T ≤ 2000 tokens and d ≤ 128
//! stays below 1e-5 relative; any wrong code, sign, scale, channel or mask moves outputs by more
//! than 1e-2).

mod common;

use common::{codec, fill, growing, vectors};
use tq_cache::allocation::Allocation;
use tq_cache::attention::simd::{Isa, fused_attention_on};
use tq_cache::attention::{AttentionKernel, AttentionShape, attend};
use tq_cache::kv_cache::KvCache;

fn shape(q_heads: usize, d: usize) -> AttentionShape {
    AttentionShape {
        q_heads,
        scale: 1.0 / (d as f32).sqrt(),
    }
}

fn in_pool<T: Send>(threads: usize, f: impl FnOnce() -> T + Send) -> T {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("thread pool")
        .install(f)
}

fn run(isa: Isa, cache: &KvCache, q_heads: usize, positions: &[u32], seed: u64) -> Vec<f32> {
    let d = cache.layout().head_dim;
    let queries = vectors(positions.len() * q_heads, d, seed);
    let mut out = vec![0.0f32; queries.len()];
    fused_attention_on(isa, cache, &queries, positions, shape(q_heads, d), &mut out).unwrap();
    out
}

fn close(what: &str, got: &[f32], expected: &[f32]) {
    let scale = expected.iter().fold(0.0f32, |m, v| m.max(v.abs())).max(1.0);
    for (i, (a, b)) in got.iter().zip(expected).enumerate() {
        assert!(
            (a - b).abs() <= 2e-4 * scale + 1e-5,
            "{what}: output {i}: {a} vs {b} (scale {scale})"
        );
    }
}

/// Caches covering every body kind: f16, TQ_prod keys with TQ_mse values, debiased MSE, and
/// the two-tier tq3.5 and k5v4 presets; 1300 tokens (six blocks of 256, the last partial), and
/// one of 9000 tokens (blocks of 1024: the block size grows with the visible range).
fn caches() -> Vec<(String, KvCache, usize)> {
    let mut out = Vec::new();
    for (name, key, value, dim) in [
        ("f16", 1usize, 1usize, 64usize),
        ("prod/mse", 5, 2, 64),
        ("debiased/prod-hadamard", 4, 7, 128),
        ("f32/mse-haar", 0, 3, 96),
    ] {
        let mut cache = KvCache::uniform(
            growing(3, dim),
            codec(key, dim, 4, 17),
            codec(value, dim, 3, 18),
        )
        .unwrap();
        fill(&mut cache, 0, 1300, 19);
        out.push((name.to_string(), cache, dim));
    }
    for (preset, tokens) in [("tq3.5", 1300usize), ("k5v4", 1300), ("k5v4", 9000)] {
        let dim = 128;
        let allocation = Allocation::preset(preset).unwrap();
        let mut cache = KvCache::with_allocation(growing(2, dim), &allocation, 0, 1).unwrap();
        fill(&mut cache, 0, tokens, 23);
        out.push((format!("{preset} ({tokens} tokens)"), cache, dim));
    }
    out
}

#[test]
fn fused_attention_is_bit_identical_across_thread_counts() {
    for (name, cache, _) in caches() {
        let kv = cache.layout().kv_heads;
        let last = cache.len() as u32 - 1;
        let positions = [0u32, 255, 256, 700, 1299, last];
        for isa in Isa::available() {
            let one = in_pool(1, || run(isa, &cache, 4 * kv, &positions, 5));
            for threads in [2, 3] {
                let many = in_pool(threads, || run(isa, &cache, 4 * kv, &positions, 5));
                let same = one
                    .iter()
                    .zip(&many)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{name} on {isa:?}: 1 vs {threads} threads differ");
            }
        }
    }
}

#[test]
fn vector_paths_match_the_scalar_path() {
    for (name, cache, _) in caches() {
        let kv = cache.layout().kv_heads;
        let positions = [3u32, 1000, 1299, cache.len() as u32 - 1];
        let scalar = run(Isa::Scalar, &cache, 3 * kv, &positions, 9);
        for isa in Isa::available() {
            let got = run(isa, &cache, 3 * kv, &positions, 9);
            close(&format!("{name} {isa:?} vs scalar"), &got, &scalar);
        }
    }
}

#[test]
fn every_cache_kind_matches_the_reference() {
    for (name, cache, d) in caches() {
        let kv = cache.layout().kv_heads;
        let positions = [0u32, 511, 1299];
        let q_heads = 2 * kv;
        let queries = vectors(positions.len() * q_heads, d, 31);
        let mut exact = vec![0.0f32; queries.len()];
        attend(
            &cache,
            &queries,
            &positions,
            shape(q_heads, d),
            AttentionKernel::Reference,
            &mut exact,
        )
        .unwrap();
        for isa in Isa::available() {
            let got = run(isa, &cache, q_heads, &positions, 31);
            close(&format!("{name} {isa:?} vs reference"), &got, &exact);
        }
    }
}

/// Uncompressed caches attend with the same bits on every instruction set: plain records
/// score in one order everywhere (`primitives::lane8_dot`), values accumulate with one fused
/// multiply-add per token in order, and the softmax's `exp` and sum are the scalar bits. Head
/// dimensions 64 and 256 (AVX-512's pair kernel), 72 (a masked 8-lane value chunk on AVX-512)
/// and 36 (trailing values after the lanes); 700 tokens (partial blocks and token batches).
#[test]
fn plain_caches_attend_with_the_same_bits_on_every_isa() {
    for (kind, dim) in [(1usize, 64usize), (1, 256), (0, 72), (1, 36)] {
        let mut cache = KvCache::uniform(
            growing(2, dim),
            codec(kind, dim, 4, 3),
            codec(kind, dim, 4, 4),
        )
        .unwrap();
        fill(&mut cache, 0, 700, 41);
        let positions = [0u32, 15, 16, 333, 699];
        let scalar = run(Isa::Scalar, &cache, 6, &positions, 43);
        for isa in Isa::available() {
            let got = run(isa, &cache, 6, &positions, 43);
            let differing = got
                .iter()
                .zip(&scalar)
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count();
            assert_eq!(
                differing, 0,
                "d = {dim}, {isa:?}: outputs differ from scalar"
            );
        }
    }
}

/// `AttentionKernel::FusedOn(isa)` is the fused kernel on exactly that instruction set (what
/// golden snapshots pin so they match on every machine), and one this CPU lacks is refused.
#[test]
fn the_fused_on_kernel_runs_the_chosen_instruction_set() {
    let (_, cache, d) = caches().swap_remove(1);
    let q_heads = 2 * cache.layout().kv_heads;
    let positions = [0u32, 640, 1299];
    let queries = vectors(positions.len() * q_heads, d, 9);
    for isa in Isa::available() {
        let mut out = vec![0.0f32; queries.len()];
        attend(
            &cache,
            &queries,
            &positions,
            shape(q_heads, d),
            AttentionKernel::FusedOn(isa),
            &mut out,
        )
        .unwrap();
        let direct = run(isa, &cache, q_heads, &positions, 9);
        assert!(
            out.iter()
                .zip(&direct)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "FusedOn({isa:?}) is not the {isa:?} kernel"
        );
    }
    let missing = [Isa::Avx2, Isa::Avx512, Isa::Neon]
        .into_iter()
        .find(|isa| !isa.is_available());
    if let Some(isa) = missing {
        let mut out = vec![0.0f32; queries.len()];
        let refused = attend(
            &cache,
            &queries,
            &positions,
            shape(q_heads, d),
            AttentionKernel::FusedOn(isa),
            &mut out,
        );
        assert!(
            matches!(refused, Err(tq_cache::CacheError::InvalidConfig(_))),
            "{isa:?}: {refused:?}"
        );
    }
}
