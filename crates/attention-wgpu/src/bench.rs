//! Decode-step timing on the device: one query token (all query heads of one layer) against a
//! cache of `tokens` tokens, wall time per step including the readback that ends it.
//!
//! The cache is filled with random valid records (uniform codes, norms near 1), which costs
//! attention exactly what real records cost; nothing is encoded. On a software adapter
//! (lavapipe) the figures measure a correctness run, not GPU speed: [`DecodeTiming::software`]
//! says which.

use std::sync::Arc;
use std::time::Instant;

use half::f16;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tq_cache::allocation::Allocation;
use tq_cache::attention::AttentionShape;
use tq_cache::kv_cache::{KvCache, KvKind, KvLayout};
use tq_cache::token_store::Growth;

use crate::append::EncodedTokens;
use crate::cache::GpuKvCache;
use crate::context::GpuContext;
use crate::error::GpuError;

/// What to time.
#[derive(Clone, Debug)]
pub struct DecodeConfig {
    /// Allocation preset or TOML path (`mse-k4v4`, `k5v4`, `f16`, ...).
    pub allocation: String,
    /// Head dimension.
    pub head_dim: usize,
    /// Query heads.
    pub q_heads: usize,
    /// KV heads.
    pub kv_heads: usize,
    /// Cached tokens.
    pub tokens: usize,
    /// Timed decode steps (after `warmup` untimed ones).
    pub steps: usize,
    /// Untimed steps first.
    pub warmup: usize,
}

/// The result of [`decode_step_timing`].
#[derive(Clone, Debug)]
pub struct DecodeTiming {
    /// Adapter name and backend.
    pub adapter: String,
    /// Whether the adapter is a software rasterizer: then this is a correctness run, not a
    /// speed figure.
    pub software: bool,
    /// Cached tokens.
    pub tokens: usize,
    /// Median seconds per decode step (upload query, all kernels, read back the output).
    pub seconds_per_step: f64,
    /// Fastest step.
    pub min_seconds: f64,
    /// Bytes of cache a step reads (records, scales and positions of every KV head).
    pub bytes_per_step: u64,
    /// `bytes_per_step / seconds_per_step / 1e9`.
    pub gb_per_second: f64,
}

impl DecodeTiming {
    /// `"correctness run, not a speed figure"` on a software adapter, else empty.
    pub fn label(&self) -> &'static str {
        if self.software {
            "correctness run, not a speed figure"
        } else {
            ""
        }
    }
}

/// Fills a GPU cache with `tokens` random records of `config`'s allocation and times
/// `config.steps` decode steps of one query token at position `tokens − 1`.
pub fn decode_step_timing(
    ctx: &Arc<GpuContext>,
    config: &DecodeConfig,
) -> Result<DecodeTiming, GpuError> {
    let allocation = Allocation::load(&config.allocation).map_err(tq_cache::CacheError::from)?;
    let layout = KvLayout {
        kv_heads: config.kv_heads,
        head_dim: config.head_dim,
        kind: KvKind::Growing {
            growth: Growth::Doubling { initial: 16 },
        },
        max_rewind: 0,
        rope_pairs: tq_cache::basis::RopePairs::Adjacent,
        rope_base: Default::default(),
    };
    let template = KvCache::with_allocation(layout, &allocation, 1, 3)?;
    let mut gpu = GpuKvCache::new(ctx, &template)?;
    let mut rng = ChaCha8Rng::seed_from_u64(0x7157_0001);
    let (kc, vc) = (template.keys(0).codec(), template.values(0).codec());
    let chunk = 4096usize;
    let mut filled = 0;
    while filled < config.tokens {
        let n = chunk.min(config.tokens - filled);
        let vectors = n * config.kv_heads;
        let mut records = |words: usize| -> Vec<u32> {
            (0..vectors * words)
                .map(|_| rng.random::<u32>() & 0x3fff_3fff)
                .collect()
        };
        let (kr, vr) = (records(kc.record_words()), records(vc.record_words()));
        let mut scales = |per: usize| -> Vec<f16> {
            (0..vectors * per)
                .map(|_| f16::from_f32(rng.random_range(0.5f32..1.5)))
                .collect()
        };
        let (ks, vs) = (scales(kc.scales_per_token()), scales(vc.scales_per_token()));
        let positions: Vec<u32> = (filled..filled + n).map(|t| t as u32).collect();
        gpu.append_encoded(
            EncodedTokens {
                records: &kr,
                scales: &ks,
            },
            EncodedTokens {
                records: &vr,
                scales: &vs,
            },
            &positions,
        )?;
        filled += n;
    }
    let shape = AttentionShape {
        q_heads: config.q_heads,
        scale: 1.0 / (config.head_dim as f32).sqrt(),
    };
    let queries: Vec<f32> = (0..config.q_heads * config.head_dim)
        .map(|_| rng.random_range(-1.0f32..1.0))
        .collect();
    let mut out = vec![0.0f32; queries.len()];
    let position = [config.tokens.saturating_sub(1) as u32];
    for _ in 0..config.warmup {
        gpu.attend(&queries, &position, shape, &mut out)?;
    }
    let mut times = Vec::with_capacity(config.steps.max(1));
    for _ in 0..config.steps.max(1) {
        let start = Instant::now();
        gpu.attend(&queries, &position, shape, &mut out)?;
        times.push(start.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    let bytes = (config.tokens * gpu.bytes_per_token()) as u64;
    let info = ctx.adapter_info();
    Ok(DecodeTiming {
        adapter: format!("{} ({:?})", info.name, info.backend),
        software: ctx.is_software(),
        tokens: config.tokens,
        seconds_per_step: median,
        min_seconds: times[0],
        bytes_per_step: bytes,
        gb_per_second: bytes as f64 / median / 1e9,
    })
}
