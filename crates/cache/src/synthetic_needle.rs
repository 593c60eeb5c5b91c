//! A needle among distractor keys, beyond any model's context window.
//!
//! One KV head of dimension `d` holds `tokens` keys drawn like real keys — Gaussian with a few
//! outlier channels (×8 scale) and a per-channel offset, as real post-RoPE keys have — and one
//! planted needle key at a chosen depth. The query points at the needle, scaled so that, with
//! exact keys, the needle receives exactly `target_weight` of the softmax mass (the scale is
//! solved by bisection on the exact scores). Then each bit allocation stores the same keys and
//! we read back, from the scores of its stored keys (the codec's own estimator), whether the
//! needle still has the top score and what share of the mass it keeps.
//!
//! This isolates what compression does to retrieval at 16K–128K tokens, where the reference
//! model (8K context) cannot go.

use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use rand_distr::{Distribution, StandardNormal};
use serde::Serialize;

use crate::allocation::Allocation;
use crate::codec::CodecScratch;
use crate::error::CacheError;
use crate::kv_cache::{KvCache, KvKind, KvLayout};
use crate::token_store::Growth;

/// One experiment's shape.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NeedleSetup {
    /// Keys in the cache, needle included.
    pub tokens: usize,
    /// Head dimension.
    pub head_dim: usize,
    /// Where the needle sits, as a fraction of the context (0 = first token).
    pub depth: f64,
    /// Softmax mass the needle gets with exact keys.
    pub target_weight: f64,
    /// Seed of the keys.
    pub seed: u64,
}

/// What one allocation kept.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct NeedleOutcome {
    /// Allocation name.
    pub alloc: String,
    /// Keys in the cache.
    pub tokens: usize,
    /// Needle depth.
    pub depth: f64,
    /// 1 if the needle keeps the top score, else its rank.
    pub needle_rank: usize,
    /// Softmax mass on the needle from the stored keys.
    pub needle_weight: f64,
    /// Softmax mass on the needle with exact keys (the target).
    pub exact_weight: f64,
    /// Cache bytes per token of this head (keys and values, with the 4-byte position).
    pub bytes_per_token: usize,
}

/// The keys `[tokens, d]` and the needle's index.
pub fn keys(setup: &NeedleSetup) -> (Vec<f32>, usize) {
    let d = setup.head_dim;
    let mut rng = ChaCha20Rng::seed_from_u64(setup.seed);
    // Per-channel scale and offset, drawn once: a few loud channels, as real keys have.
    let scale: Vec<f32> = (0..d)
        .map(|j| if j % 16 == 5 { 8.0 } else { 1.0 })
        .collect();
    let offset: Vec<f32> = (0..d)
        .map(|_| {
            let g: f32 = StandardNormal.sample(&mut rng);
            0.5 * g
        })
        .collect();
    let mut keys: Vec<f32> = (0..setup.tokens * d)
        .map(|i| {
            let g: f32 = StandardNormal.sample(&mut rng);
            offset[i % d] + scale[i % d] * g
        })
        .collect();
    // The needle: a random direction at the typical key norm, so it is the key the query
    // aligned with it prefers (a distractor's projection on a random direction is ~N(0, 2²)).
    let typical_norm = scale
        .iter()
        .zip(&offset)
        .map(|(s, o)| s * s + o * o)
        .sum::<f32>()
        .sqrt();
    let direction: Vec<f32> = (0..d).map(|_| StandardNormal.sample(&mut rng)).collect();
    let length = direction.iter().map(|v| v * v).sum::<f32>().sqrt();
    let needle = ((setup.tokens as f64 - 1.0) * setup.depth.clamp(0.0, 1.0)).round() as usize;
    for (k, u) in keys[needle * d..(needle + 1) * d]
        .iter_mut()
        .zip(&direction)
    {
        *k = u / length * typical_norm;
    }
    (keys, needle)
}

fn log_mass(scores: &[f64], needle: usize) -> f64 {
    let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let total: f64 = scores.iter().map(|s| (s - max).exp()).sum();
    scores[needle] - max - total.ln()
}

/// Solves the query scale so exact keys give the needle `target` mass; returns the query.
pub fn query(keys: &[f32], needle: usize, d: usize, target: f64) -> Vec<f32> {
    let k = &keys[needle * d..(needle + 1) * d];
    let dots: Vec<f64> = keys
        .chunks_exact(d)
        .map(|t| {
            t.iter()
                .zip(k)
                .map(|(a, b)| f64::from(*a) * f64::from(*b))
                .sum()
        })
        .collect();
    let scaled = |c: f64| -> Vec<f64> { dots.iter().map(|v| c * v).collect() };
    let (mut lo, mut hi) = (0.0f64, 1.0f64);
    while log_mass(&scaled(hi), needle).exp() < target && hi < 1e6 {
        hi *= 2.0;
    }
    for _ in 0..100 {
        let mid = 0.5 * (lo + hi);
        if log_mass(&scaled(mid), needle).exp() < target {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    k.iter().map(|v| (f64::from(*v) * hi) as f32).collect()
}

/// Runs the experiment for one allocation.
///
/// ```
/// use tq_cache::allocation::Allocation;
/// use tq_cache::synthetic_needle::{run, NeedleSetup};
/// let setup = NeedleSetup { tokens: 2048, head_dim: 64, depth: 0.5, target_weight: 0.5, seed: 1 };
/// let outcome = run(&Allocation::preset("f16").unwrap(), &setup).unwrap();
/// assert_eq!(outcome.needle_rank, 1);
/// assert!((outcome.needle_weight - 0.5).abs() < 0.01); // f16 keys barely move the scores
/// ```
pub fn run(allocation: &Allocation, setup: &NeedleSetup) -> Result<NeedleOutcome, CacheError> {
    let d = setup.head_dim;
    if setup.tokens == 0 || d == 0 {
        return Err(CacheError::InvalidConfig(
            "a needle test needs tokens and a dimension".into(),
        ));
    }
    let (keys, needle) = keys(setup);
    let q = query(&keys, needle, d, setup.target_weight);
    let layout = KvLayout {
        kv_heads: 1,
        head_dim: d,
        kind: KvKind::Growing {
            growth: Growth::Static {
                capacity: setup.tokens,
            },
        },
        max_rewind: 0,
        rope_pairs: crate::basis::RopePairs::Adjacent,
        rope_base: Default::default(),
    };
    // One middle layer of a 30-layer model, so boundary rules don't apply.
    let mut cache = KvCache::with_allocation(layout, allocation, 15, 30)?;
    let positions: Vec<u32> = (0..setup.tokens as u32).collect();
    // Append in prefill-sized chunks, as a model would (two-tier streams calibrate on the first).
    for chunk in positions.chunks(512) {
        let start = chunk[0] as usize * d;
        let slice = &keys[start..start + chunk.len() * d];
        cache.append(slice, slice, chunk)?;
    }
    let stream = cache.keys(0);
    let mut scratch = CodecScratch::new(d);
    let mut decoded = vec![0.0f32; d];
    let mut scores = Vec::with_capacity(setup.tokens);
    for t in 0..setup.tokens {
        let (codec, _, _) = stream
            .token(t)
            .ok_or(CacheError::InvalidConfig("token missing".into()))?;
        let correction = f64::from(codec.score_correction());
        stream.decode(t, &mut scratch, &mut decoded)?;
        let s: f64 = decoded
            .iter()
            .zip(&q)
            .map(|(a, b)| f64::from(*a) * f64::from(*b))
            .sum();
        scores.push(s * correction);
    }
    let exact: Vec<f64> = keys
        .chunks_exact(d)
        .map(|t| {
            t.iter()
                .zip(&q)
                .map(|(a, b)| f64::from(*a) * f64::from(*b))
                .sum()
        })
        .collect();
    let needle_score = scores[needle];
    let rank = 1 + scores.iter().filter(|&&s| s > needle_score).count();
    Ok(NeedleOutcome {
        alloc: allocation.name.clone(),
        tokens: setup.tokens,
        depth: setup.depth,
        needle_rank: rank,
        needle_weight: log_mass(&scores, needle).exp(),
        exact_weight: log_mass(&exact, needle).exp(),
        bytes_per_token: cache.bytes_per_token(),
    })
}
