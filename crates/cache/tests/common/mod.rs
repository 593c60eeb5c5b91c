//! Builders shared by the cache tests.
#![allow(dead_code)]

use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use rand_distr::{Distribution, StandardNormal};
use tq_cache::CodecSpec;
use tq_cache::codec::{MseSpec, ProdSpec};
use tq_cache::kv_cache::{KvCache, KvKind, KvLayout};
use tq_cache::token_store::Growth;
use tq_qjl::SketchKind;
use tq_rotation::RotationKind;

/// Gaussian vectors with a few outlier channels, like real keys.
pub fn vectors(n: usize, dim: usize, seed: u64) -> Vec<f32> {
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    (0..n * dim)
        .map(|i| {
            let g: f32 = StandardNormal.sample(&mut rng);
            if i % dim % 16 == 3 { 6.0 * g } else { g }
        })
        .collect()
}

/// Every codec family at a given dimension, indexed 0..CODECS.
pub const CODECS: usize = 8;

pub fn codec(kind: usize, dim: usize, bits: u8, seed: u64) -> CodecSpec {
    let mse = |rotation| MseSpec {
        dim,
        bits: bits.clamp(1, 8),
        rotation,
        seed,
        norm_correction: false,
    };
    match kind % CODECS {
        0 => CodecSpec::F32 { dim },
        1 => CodecSpec::F16 { dim },
        2 => CodecSpec::Mse(mse(RotationKind::Hadamard)),
        3 => CodecSpec::Mse(MseSpec {
            norm_correction: true,
            ..mse(RotationKind::Haar)
        }),
        4 => CodecSpec::DebiasedMse(mse(RotationKind::Hadamard)),
        5 => CodecSpec::Prod(ProdSpec::orthogonal(dim, bits.clamp(2, 9), seed).shrinkage(0.7)),
        6 => CodecSpec::Prod(ProdSpec::paper(dim, bits.clamp(2, 9), seed)),
        _ => {
            let mut spec = ProdSpec::orthogonal(dim, bits.clamp(2, 9), seed);
            spec.sketch.kind = SketchKind::Hadamard;
            CodecSpec::Prod(spec)
        }
    }
}

pub fn growing(kv_heads: usize, head_dim: usize) -> KvLayout {
    KvLayout {
        kv_heads,
        head_dim,
        kind: KvKind::Growing {
            growth: Growth::Doubling { initial: 7 },
        },
        max_rewind: 0,
        rope_pairs: tq_cache::basis::RopePairs::Adjacent,
    }
}

pub fn sliding(kv_heads: usize, head_dim: usize, window: usize, max_rewind: usize) -> KvLayout {
    KvLayout {
        kv_heads,
        head_dim,
        kind: KvKind::Sliding { window },
        max_rewind,
        rope_pairs: tq_cache::basis::RopePairs::Adjacent,
    }
}

/// Appends `n` tokens at positions `start..start+n` with deterministic keys and values.
pub fn fill(cache: &mut KvCache, start: u32, n: usize, seed: u64) {
    let width = cache.layout().kv_heads * cache.layout().head_dim;
    let keys = vectors(n, width, seed);
    let values = vectors(n, width, seed ^ 0xFFFF);
    let positions: Vec<u32> = (start..start + n as u32).collect();
    cache.append(&keys, &values, &positions).unwrap();
}

/// Interleaves two heads' `[n, dim]` batches into `[n, 2, dim]`, the layout of a two-KV-head
/// append.
pub fn two_heads(a: &[f32], b: &[f32], dim: usize) -> Vec<f32> {
    a.chunks_exact(dim)
        .zip(b.chunks_exact(dim))
        .flat_map(|(x, y)| x.iter().chain(y).copied())
        .collect()
}

/// The fused kernel's rows `fused` equal the reference kernel's `exact` (rows of `dim`) within
/// what f32 against f64 sums of ≤ 300 tokens allow (attention_fused.rs: `2e-4·max|v| + 1e-5`,
/// `max_v` the largest |value| stored); a token read from the wrong record (codes for a copy)
/// moves a row by ~1e-2 of max|v| at 3 bits.
pub fn assert_rows_match(fused: &[f32], exact: &[f32], max_v: f32, dim: usize) {
    assert_eq!(fused.len(), exact.len());
    for (i, (a, b)) in fused.iter().zip(exact).enumerate() {
        assert!(
            (a - b).abs() <= 2e-4 * max_v + 1e-5,
            "row {} coordinate {}: {a} vs {b}",
            i / dim,
            i % dim
        );
    }
}
