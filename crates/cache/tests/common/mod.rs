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
        rope_base: Default::default(),
    }
}

pub fn sliding(kv_heads: usize, head_dim: usize, window: usize, max_rewind: usize) -> KvLayout {
    KvLayout {
        kv_heads,
        head_dim,
        kind: KvKind::Sliding { window },
        max_rewind,
        rope_pairs: tq_cache::basis::RopePairs::Adjacent,
        rope_base: Default::default(),
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

/// Keys, values (`[n, kv_heads, dim]`) and queries (`[n, q_heads, dim]`) of `n` tokens, from
/// seeds `seed`, `seed + 1` and `seed + 2`.
pub struct Tokens {
    pub keys: Vec<f32>,
    pub values: Vec<f32>,
    pub queries: Vec<f32>,
}

impl Tokens {
    pub fn new(n: usize, kv_heads: usize, q_heads: usize, dim: usize, seed: u64) -> Self {
        Self {
            keys: vectors(n * kv_heads, dim, seed),
            values: vectors(n * kv_heads, dim, seed + 1),
            queries: vectors(n * q_heads, dim, seed + 2),
        }
    }
}

/// Runs tokens `from..to` of `t` through `cache.forward` (fused kernel) in pieces of `piece`
/// tokens; the output rows.
pub fn forward_in_pieces(
    cache: &mut KvCache,
    t: &Tokens,
    from: usize,
    to: usize,
    piece: usize,
    shape: tq_cache::attention::AttentionShape,
) -> Vec<f32> {
    let fused = tq_cache::attention::AttentionKernel::Fused;
    forward_in_pieces_with(cache, t, (from, to), piece, shape, fused)
}

/// [`forward_in_pieces`] through `kernel`.
#[allow(dead_code)]
pub fn forward_in_pieces_with(
    cache: &mut KvCache,
    t: &Tokens,
    (from, to): (usize, usize),
    piece: usize,
    shape: tq_cache::attention::AttentionShape,
    kernel: tq_cache::attention::AttentionKernel,
) -> Vec<f32> {
    let dim = cache.layout().head_dim;
    let (kw, qw) = (cache.layout().kv_heads * dim, shape.q_heads * dim);
    let mut out = Vec::new();
    let mut start = from;
    while start < to {
        let end = (start + piece).min(to);
        let positions: Vec<u32> = (0..end as u32).collect();
        let mut rows = vec![0.0f32; (end - start) * qw];
        cache
            .forward(
                &t.queries[start * qw..end * qw],
                &t.keys[start * kw..end * kw],
                &t.values[start * kw..end * kw],
                &positions,
                shape,
                kernel,
                &mut rows,
            )
            .unwrap();
        out.extend(rows);
        start = end;
    }
    out
}

/// The bit patterns of `x`, for comparisons that must be exact.
pub fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

/// The centroid bytes of the fast-scan integer value sums: `γ = max|c| / 127` and each
/// centroid's byte `e_k = round(c_k / γ)` (as f64, for sums computed here).
pub fn centroid_bytes(centroids: &[f32]) -> (f32, Vec<f64>) {
    let gamma = centroids.iter().fold(0.0f32, |m, c| m.max(c.abs())) / 127.0;
    let e = centroids
        .iter()
        .map(|c| f64::from((c / gamma).round_ties_even().clamp(-127.0, 127.0)))
        .collect();
    (gamma, e)
}

/// Adds one block's integer value sum, with the kernel's f32 steps, to `rotated` (in units of
/// `γ`): the block's weights `w` (here each token's norm) round to bytes `round(w / s)`, `s`
/// their largest over 127, each times the centroid bytes `e` of its token's codes, scaled by `s`.
pub fn add_block_sum(block: &[(Vec<u8>, f32)], e: &[f64], rotated: &mut [f64]) {
    let scale = block.iter().fold(0.0f32, |m, (_, w)| m.max(*w)) / 127.0;
    for (codes, w) in block {
        let u = f64::from((w / scale).min(127.0).round_ties_even());
        for (r, &c) in rotated.iter_mut().zip(codes) {
            *r += f64::from(scale) * u * e[usize::from(c)];
        }
    }
}
