//! Cache semantics: ring = linear last W, chunking = one pass, rewind = never appended, the
//! ring-wrap caveat, byte accounting, typed errors.

mod common;

use common::{CODECS, codec, growing, sliding, vectors};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};
use tq_cache::attention::{AttentionKernel, AttentionShape};
use tq_cache::kv_cache::{KvCache, KvKind, KvLayout, uniform_streams};
use tq_cache::stream::StreamLayout;
use tq_cache::token_store::Growth;
use tq_cache::{CacheError, CodecSpec};

const KV: usize = 2;
const Q: usize = 4;
const D: usize = 64;

fn config(cases: u32) -> Config {
    Config {
        cases,
        rng_seed: RngSeed::Fixed(0x5E3A_0000),
        failure_persistence: None,
        ..Config::default()
    }
}

fn shape() -> AttentionShape {
    AttentionShape {
        q_heads: Q,
        scale: 0.125,
    }
}

/// Deterministic per-token tensors: token `t` always gets the same q, k, v.
fn token_tensors(t: usize, seed: u64) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let s = seed.wrapping_mul(1_000_003).wrapping_add(t as u64);
    (
        vectors(Q, D, s),
        vectors(KV, D, s ^ 0xAAAA),
        vectors(KV, D, s ^ 0x5555),
    )
}

/// Feeds tokens `range` as one forward call and returns the outputs `[n, Q, D]`.
fn feed(
    cache: &mut KvCache,
    range: std::ops::Range<usize>,
    seed: u64,
    kernel: AttentionKernel,
) -> Vec<f32> {
    let (mut q, mut k, mut v) = (Vec::new(), Vec::new(), Vec::new());
    for t in range.clone() {
        let (a, b, c) = token_tensors(t, seed);
        q.extend(a);
        k.extend(b);
        v.extend(c);
    }
    let positions: Vec<u32> = (0..range.end as u32).collect();
    let mut out = vec![0.0; q.len()];
    cache
        .forward(&q, &k, &v, &positions, shape(), kernel, &mut out)
        .unwrap();
    out
}

/// Feeds `total` tokens in the given chunk sizes (cycled), returns all outputs.
fn feed_chunked(cache: &mut KvCache, total: usize, chunks: &[usize], seed: u64) -> Vec<f32> {
    let mut out = Vec::new();
    let mut t = 0;
    let mut i = 0;
    while t < total {
        let n = chunks[i % chunks.len()].clamp(1, total - t);
        out.extend(feed(cache, t..t + n, seed, AttentionKernel::Fused));
        t += n;
        i += 1;
    }
    out
}

proptest! {
    #![proptest_config(config(32))]

    /// Any chunking of a prefill gives bit-identical outputs to one pass, for every codec
    /// (each vector's code depends only on the vector, and each query's output only on the
    /// tokens it sees — so the compressed caches are exact here too, not just f32).
    #[test]
    fn any_chunking_equals_one_pass(
        total in 1usize..200,
        chunks in prop::collection::vec(1usize..50, 1..6),
        key_codec in 0usize..CODECS,
        value_codec in 0usize..CODECS,
        seed in any::<u64>(),
    ) {
        let make = || KvCache::uniform(growing(KV, D), codec(key_codec, D, 4, seed), codec(value_codec, D, 3, seed)).unwrap();
        let mut one = make();
        let whole = feed(&mut one, 0..total, seed, AttentionKernel::Fused);
        let mut chunked = make();
        prop_assert_eq!(whole, feed_chunked(&mut chunked, total, &chunks, seed));
    }

    /// A sliding ring of width W gives, token by token, exactly what a linear cache holding
    /// only the last W tokens gives.
    #[test]
    fn ring_equals_linear_cache_of_last_w(
        window in 1usize..40,
        total in 1usize..150,
        key_codec in 0usize..CODECS,
        seed in any::<u64>(),
    ) {
        let key = codec(key_codec, D, 4, seed);
        let value = codec(2, D, 4, seed);
        let mut ring = KvCache::uniform(sliding(KV, D, window, 0), key, value).unwrap();
        for t in 0..total {
            let got = feed(&mut ring, t..t + 1, seed, AttentionKernel::Fused);
            // The linear reference: a growing cache with the last W tokens at their positions.
            let mut linear = KvCache::uniform(growing(KV, D), key, value).unwrap();
            let first = (t + 1).saturating_sub(window);
            for u in first..=t {
                let (_, k, v) = token_tensors(u, seed);
                linear.append(&k, &v, &[u as u32]).unwrap();
            }
            let (q, _, _) = token_tensors(t, seed);
            let mut expected = vec![0.0; q.len()];
            tq_cache::attention::attend(&linear, &q, &[t as u32], shape(), AttentionKernel::Fused, &mut expected).unwrap();
            prop_assert_eq!(&got, &expected, "token {}", t);
        }
    }

    /// Rewinding then re-appending equals never having appended: same outputs afterwards and
    /// the same stored state (checked through every later output), for growing caches with
    /// sinks and a recent window, and for rings.
    #[test]
    fn rewind_then_reappend_equals_never_appended(
        prefix in 1usize..120,
        dropped in 1usize..=8,
        after in 1usize..20,
        sliding_layer in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let layout = if sliding_layer { sliding(KV, D, 16, 8) } else { KvLayout { max_rewind: 8, ..growing(KV, D) } };
        let streams = |c: CodecSpec| -> Vec<StreamLayout> {
            uniform_streams(&layout, c).into_iter().map(|mut s| { s.sink_tokens = 2; s.recent_tokens = 5; s }).collect()
        };
        let make = || KvCache::new(layout, &streams(codec(5, D, 5, seed)), &streams(codec(2, D, 4, seed))).unwrap();
        let mut straight = make();
        feed(&mut straight, 0..prefix, seed, AttentionKernel::Fused);
        let expected = feed(&mut straight, prefix..prefix + after, seed, AttentionKernel::Fused);

        let mut rewound = make();
        feed(&mut rewound, 0..prefix, seed, AttentionKernel::Fused);
        // Speculative tokens that get rejected: different content at the same positions.
        feed(&mut rewound, prefix..prefix + dropped, seed ^ 0xDEAD, AttentionKernel::Fused);
        rewound.truncate(prefix).unwrap();
        prop_assert_eq!(rewound.len(), prefix);
        let got = feed(&mut rewound, prefix..prefix + after, seed, AttentionKernel::Fused);
        prop_assert_eq!(got, expected);
    }
}

/// The seed's caveat: a prefill chunk that wraps the ring overwrites in-window keys of its own
/// non-final tokens; the final token stays exact. From position 0, chunks ≤ W are exact.
#[test]
fn chunk_that_wraps_the_ring_loses_keys_for_non_final_tokens() {
    let window = 8;
    let key = codec(0, D, 4, 1);
    let make = || KvCache::uniform(sliding(KV, D, window, 0), key, key).unwrap();
    let mut stepwise = make();
    let exact: Vec<f32> = (0..14)
        .flat_map(|t| feed(&mut stepwise, t..t + 1, 3, AttentionKernel::Reference))
        .collect();
    let row = Q * D;

    // From zero, a chunk of W tokens is exact.
    let mut from_zero = make();
    assert_eq!(
        feed(&mut from_zero, 0..window, 3, AttentionKernel::Reference),
        exact[..window * row]
    );

    // The next chunk (6 tokens, positions 8..14) wraps: its tokens overwrite slots 0..6, which
    // held positions 0..6 — still inside the window of positions 8..12.
    let wrapped = feed(&mut from_zero, window..14, 3, AttentionKernel::Reference);
    let per_token = |v: &[f32], i: usize| v[i * row..(i + 1) * row].to_vec();
    for i in 0..5 {
        assert_ne!(
            per_token(&wrapped, i),
            per_token(&exact[window * row..], i),
            "token {} should have lost keys",
            window + i
        );
    }
    assert_eq!(
        per_token(&wrapped, 5),
        per_token(&exact[window * row..], 5),
        "the final token is exact"
    );
}

/// The byte formula equals what the buffers hold, for static and doubling growth, rings,
/// sinks and recent windows, every codec.
#[test]
fn byte_formula_equals_allocation() {
    for kind in 0..CODECS {
        for (growth, extras) in [
            (Growth::Static { capacity: 3000 }, false),
            (Growth::Doubling { initial: 16 }, true),
        ] {
            let layout = KvLayout {
                kv_heads: 3,
                head_dim: D,
                kind: KvKind::Growing { growth },
                max_rewind: 4,
                rope_pairs: tq_cache::basis::RopePairs::Adjacent,
                rope_base: Default::default(),
            };
            let streams = |c: CodecSpec| -> Vec<StreamLayout> {
                uniform_streams(&layout, c)
                    .into_iter()
                    .map(|mut s| {
                        if extras {
                            s.sink_tokens = 4;
                            s.recent_tokens = 16;
                        }
                        s
                    })
                    .collect()
            };
            let mut cache = KvCache::new(
                layout,
                &streams(codec(kind, D, 4, 1)),
                &streams(codec(kind, D, 3, 2)),
            )
            .unwrap();
            assert_eq!(cache.formula_bytes(), cache.allocated_bytes());
            let width = 3 * D;
            for chunk in 0..5u32 {
                let n = 333;
                let positions: Vec<u32> = (chunk * n..(chunk + 1) * n).collect();
                cache
                    .append(
                        &vectors(n as usize, width, 1),
                        &vectors(n as usize, width, 2),
                        &positions,
                    )
                    .unwrap();
                assert_eq!(
                    cache.formula_bytes(),
                    cache.allocated_bytes(),
                    "codec {kind} {growth:?}"
                );
            }
        }
        let mut ring = KvCache::uniform(
            sliding(3, D, 100, 4),
            codec(kind, D, 4, 1),
            codec(kind, D, 4, 1),
        )
        .unwrap();
        let before = ring.allocated_bytes();
        common::fill(&mut ring, 0, 1000, 3);
        assert_eq!(
            ring.allocated_bytes(),
            before,
            "a ring's memory is constant in context length"
        );
        assert_eq!(ring.formula_bytes(), ring.allocated_bytes());
    }
}

#[test]
fn bad_calls_are_typed_errors() {
    let f32 = CodecSpec::F32 { dim: D };
    let layout = KvLayout {
        kv_heads: KV,
        head_dim: D,
        kind: KvKind::Growing {
            growth: Growth::Static { capacity: 4 },
        },
        max_rewind: 0,
        rope_pairs: tq_cache::basis::RopePairs::Adjacent,
        rope_base: Default::default(),
    };
    let mut cache = KvCache::uniform(layout, f32, f32).unwrap();
    let (q, k, v) = token_tensors(0, 1);
    let mut out = vec![0.0; q.len()];
    // offset = positions.len − query_len must equal the cached length.
    assert!(matches!(
        cache.forward(
            &q,
            &k,
            &v,
            &[0, 1],
            shape(),
            AttentionKernel::Fused,
            &mut out
        ),
        Err(CacheError::OffsetMismatch {
            cached: 0,
            offset: 1
        })
    ));
    assert!(matches!(
        cache.forward(
            &q[..10],
            &k,
            &v,
            &[0],
            shape(),
            AttentionKernel::Fused,
            &mut out
        ),
        Err(CacheError::ShapeMismatch { .. })
    ));
    let mut nan = k.clone();
    nan[5] = f32::NAN;
    assert!(matches!(
        cache.append(&nan, &v, &[0]),
        Err(CacheError::Codec(
            tq_cache::codec::CodecError::NonFinite { .. }
        ))
    ));
    assert_eq!(cache.len(), 0, "a failed append leaves the cache unchanged");
    common::fill(&mut cache, 0, 4, 1);
    assert!(matches!(
        cache.append(&k, &v, &[4]),
        Err(CacheError::ContextOverflow { capacity: 4 })
    ));
    assert!(matches!(
        cache.append(&k, &v, &[2]),
        Err(CacheError::PositionGap { .. })
    ));
    // Rewinding a ring past what it still holds is refused and changes nothing.
    let mut ring = KvCache::uniform(sliding(KV, D, 4, 1), f32, f32).unwrap();
    common::fill(&mut ring, 0, 20, 2);
    assert!(matches!(
        ring.truncate(17),
        Err(CacheError::RewindTooFar { .. })
    ));
    assert_eq!(ring.len(), 20);
    ring.truncate(19).unwrap();
    // Wrong GQA ratio.
    let bad = AttentionShape {
        q_heads: 3,
        scale: 1.0,
    };
    let mut out3 = vec![0.0; 3 * D];
    assert!(matches!(
        tq_cache::attention::attend(
            &ring,
            &vectors(3, D, 1),
            &[18],
            bad,
            AttentionKernel::Fused,
            &mut out3
        ),
        Err(CacheError::InvalidConfig(_))
    ));
}
