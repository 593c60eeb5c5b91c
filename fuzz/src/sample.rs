//! A small model cache with every state kind, used by the allocation target (which builds one
//! from each accepted allocation) and by the saved-cache seeds.

use tq_cache::CacheError;
use tq_cache::allocation::{Allocation, ModelShape};
use tq_cache::attention::{AttentionKernel, AttentionShape};
use tq_cache::kv_cache::{KvKind, KvLayout};
use tq_cache::states::{ModelCache, StateKind, StateSpec};
use tq_cache::token_store::Growth;

const KV_HEADS: usize = 2;
const Q_HEADS: usize = 4;
/// Small enough that building a cache costs microseconds, large enough for quantized tiers
/// (`d ≥ 3`) and a two-tier split.
const HEAD_DIM: usize = 16;
/// The ring's window: a few appends wrap it.
const WINDOW: usize = 4;

/// The shape [`specs`] declares, as [`Allocation::validate_for`] takes it.
pub const SHAPE: ModelShape = ModelShape {
    num_layers: 3,
    num_kv_heads: KV_HEADS,
    head_dim: HEAD_DIM,
};

/// Layer 0: a growing cache; layer 1: a sliding-window ring; layer 2: shares layer 0's cache;
/// and a fixed state.
pub fn specs() -> Vec<StateSpec> {
    let layout = |kind| KvLayout {
        kv_heads: KV_HEADS,
        head_dim: HEAD_DIM,
        kind,
        max_rewind: 2,
        rope_pairs: tq_cache::basis::RopePairs::Adjacent,
        // A model's base, so allocations with `center = "rope"` build (and fuzz that path).
        rope_base: tq_cache::rope_center::RopeBase::new(10_000.0),
    };
    vec![
        StateSpec {
            name: "l0".into(),
            kind: StateKind::Kv {
                layer: 0,
                layout: layout(KvKind::Growing {
                    growth: Growth::Doubling { initial: 4 },
                }),
            },
        },
        StateSpec {
            name: "l1".into(),
            kind: StateKind::Kv {
                layer: 1,
                layout: layout(KvKind::Sliding { window: WINDOW }),
            },
        },
        StateSpec {
            name: "l2".into(),
            kind: StateKind::SharedKv {
                layer: 2,
                source_layer: 0,
            },
        },
        StateSpec {
            name: "conv".into(),
            kind: StateKind::Fixed { shape: vec![2, 3] },
        },
    ]
}

/// An empty cache of [`specs`] with `allocation`'s codecs.
pub fn cache(allocation: &Allocation) -> Result<ModelCache, CacheError> {
    ModelCache::with_allocation(specs(), allocation)
}

/// Runs `tokens` more tokens through every layer (queries, keys and values drawn from `seed`,
/// with a common offset so centered streams have a mean to remove) and bumps the fixed state.
pub fn append(cache: &mut ModelCache, tokens: usize, seed: u32) -> Result<(), CacheError> {
    let start = cache.len();
    let positions: Vec<u32> = (0..(start + tokens) as u32).collect();
    let shape = AttentionShape {
        q_heads: Q_HEADS,
        scale: 1.0 / (HEAD_DIM as f32).sqrt(),
    };
    let mut out = vec![0.0; tokens * Q_HEADS * HEAD_DIM];
    for layer in 0..SHAPE.num_layers {
        let salt = seed.wrapping_mul(31).wrapping_add(layer as u32);
        let q = values(tokens * Q_HEADS * HEAD_DIM, salt);
        let k = values(tokens * KV_HEADS * HEAD_DIM, salt ^ 0x5555);
        let v = values(tokens * KV_HEADS * HEAD_DIM, salt ^ 0xAAAA);
        let kv = (layer != 2).then_some((&k[..], &v[..]));
        cache.forward_layer(
            layer,
            &q,
            kv,
            &positions,
            shape,
            AttentionKernel::Fused,
            &mut out,
        )?;
    }
    cache.fixed_mut("conv")?[start % 6] += 1.0;
    Ok(())
}

/// `n` deterministic values in about [0.5, 2.5): an integer hash, so no generator is needed.
fn values(n: usize, salt: u32) -> Vec<f32> {
    (0..n as u32)
        .map(|i| {
            let h = (i ^ salt.rotate_left(7))
                .wrapping_mul(0x9E37_79B9)
                .rotate_left(13)
                .wrapping_mul(0x85EB_CA6B);
            0.5 + 2.0 * (h >> 8) as f32 / (1 << 24) as f32
        })
        .collect()
}
