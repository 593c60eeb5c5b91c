//! The fused kernel against the exact reference over decoded vectors.
//!
//! Both compute the same mathematical quantity from the same stored codes (scores through the
//! codec's estimator, values through its reconstruction), so they may differ only by f32
//! rounding: per output coordinate at most ~ (d + T)·ε·max|v| for softmax-weighted sums.
//! The tolerance 2e-4·max|v| + 1e-5 covers T ≤ 1200 and d ≤ 512 (ε = 6e-8) with margin while
//! catching any wrong code, sign, scale, rotation or mask (those move outputs by > 1e-2).

mod common;

use common::{CODECS, codec, fill, growing, sliding, vectors};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};
use tq_cache::CodecSpec;
use tq_cache::attention::{AttentionKernel, AttentionShape, attend};
use tq_cache::kv_cache::{KvCache, uniform_streams};
use tq_cache::stream::StreamLayout;

fn config(cases: u32) -> Config {
    Config {
        cases,
        rng_seed: RngSeed::Fixed(0xF05E_D000),
        failure_persistence: None,
        ..Config::default()
    }
}

fn compare(cache: &KvCache, q_heads: usize, positions: &[u32], seed: u64) {
    let d = cache.layout().head_dim;
    let queries = vectors(positions.len() * q_heads, d, seed);
    let shape = AttentionShape {
        q_heads,
        scale: 1.0 / (d as f32).sqrt(),
    };
    let mut fused = vec![0.0f32; queries.len()];
    let mut exact = vec![0.0f32; queries.len()];
    attend(
        cache,
        &queries,
        positions,
        shape,
        AttentionKernel::Fused,
        &mut fused,
    )
    .unwrap();
    attend(
        cache,
        &queries,
        positions,
        shape,
        AttentionKernel::Reference,
        &mut exact,
    )
    .unwrap();
    let scale = exact.iter().fold(0.0f32, |m, v| m.max(v.abs())).max(1.0);
    for (i, (a, b)) in fused.iter().zip(&exact).enumerate() {
        assert!(
            (a - b).abs() <= 2e-4 * scale + 1e-5,
            "output {i}: fused {a} vs reference {b} (scale {scale})"
        );
    }
}

proptest! {
    #![proptest_config(config(48))]

    /// Decode and short prefill chunks against a growing cache, every codec family, GQA 1–8,
    /// lengths that are not multiples of the block or page sizes.
    #[test]
    fn fused_matches_reference_on_growing_caches(
        dim in prop_oneof![Just(64usize), Just(128), Just(256), Just(512)],
        kv_heads in 1usize..=3,
        ratio in 1usize..=8,
        tokens in 1usize..700,
        query_len in 1usize..=3,
        key_codec in 0usize..CODECS,
        value_codec in 0usize..CODECS,
        bits in 2u8..=5,
        seed in any::<u64>(),
    ) {
        let tokens = if dim >= 256 { tokens / 4 + 1 } else { tokens };
        let layout = growing(kv_heads, dim);
        let mut cache = KvCache::uniform(
            layout,
            codec(key_codec, dim, bits, seed),
            codec(value_codec, dim, bits, seed ^ 1),
        ).unwrap();
        fill(&mut cache, 0, tokens, seed);
        let first = tokens.saturating_sub(query_len) as u32;
        let positions: Vec<u32> = (first..tokens as u32).collect();
        compare(&cache, kv_heads * ratio, &positions, seed ^ 2);
    }

    /// Sliding windows (ring buffers that have wrapped) with sinks-free streams.
    #[test]
    fn fused_matches_reference_on_sliding_caches(
        window in 1usize..300,
        extra in 0usize..400,
        key_codec in 0usize..CODECS,
        value_codec in 0usize..CODECS,
        seed in any::<u64>(),
    ) {
        let layout = sliding(2, 64, window, 3);
        let mut cache = KvCache::uniform(layout, codec(key_codec, 64, 4, seed), codec(value_codec, 64, 3, seed)).unwrap();
        let total = window + extra;
        fill(&mut cache, 0, total, seed);
        compare(&cache, 4, &[total as u32 - 1], seed);
    }
}

/// Sinks and a full-precision recent window beside compressed tokens.
#[test]
fn fused_matches_reference_with_sinks_and_recent_window() {
    for (key_codec, value_codec) in [(2usize, 5usize), (5, 2), (6, 7), (4, 3)] {
        let dim = 64;
        let layout = growing(3, dim);
        let with_extras = |codec: CodecSpec| -> Vec<StreamLayout> {
            uniform_streams(&layout, codec)
                .into_iter()
                .map(|mut s| {
                    s.sink_tokens = 4;
                    s.recent_tokens = 32;
                    s
                })
                .collect()
        };
        let mut cache = KvCache::new(
            layout,
            &with_extras(codec(key_codec, dim, 4, 9)),
            &with_extras(codec(value_codec, dim, 4, 10)),
        )
        .unwrap();
        fill(&mut cache, 0, 900, 77);
        compare(&cache, 9, &[899], 5);
        compare(&cache, 9, &[2], 6);
    }
}

/// A long prefill chunk (here 64 queries × 3 KV heads × 16 blocks = 3072 blocks and 192
/// items, more than one wave of the fused kernel by either bound) gives every query row bit
/// for bit what attending with that query alone gives: the wave split, like the thread count,
/// never changes a result.
#[test]
fn fused_long_chunk_equals_one_query_at_a_time() {
    let (dim, kv_heads, q_heads, tokens, chunk) = (64, 3, 9, 4096, 64);
    let mut cache = KvCache::uniform(
        growing(kv_heads, dim),
        codec(5, dim, 4, 21),
        codec(2, dim, 4, 22),
    )
    .unwrap();
    fill(&mut cache, 0, tokens, 23);
    let positions: Vec<u32> = (tokens - chunk..tokens).map(|p| p as u32).collect();
    let queries = vectors(chunk * q_heads, dim, 24);
    let shape = AttentionShape {
        q_heads,
        scale: 1.0 / (dim as f32).sqrt(),
    };
    let mut together = vec![0.0f32; queries.len()];
    attend(
        &cache,
        &queries,
        &positions,
        shape,
        AttentionKernel::Fused,
        &mut together,
    )
    .unwrap();
    let width = q_heads * dim;
    for (i, &p) in positions.iter().enumerate() {
        let mut alone = vec![0.0f32; width];
        let q = &queries[i * width..(i + 1) * width];
        attend(&cache, q, &[p], shape, AttentionKernel::Fused, &mut alone).unwrap();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            bits(&together[i * width..(i + 1) * width]),
            bits(&alone),
            "query {i}"
        );
    }
}
