//! The one-layer caches the needle instruments' unit tests run on.

use tq_cache::allocation::Allocation;
use tq_cache::kv_cache::{KvKind, KvLayout};
use tq_cache::states::{ModelCache, StateKind, StateSpec};
use tq_cache::token_store::Growth;

/// A cache of one layer with one KV head of dimension `head_dim` under `allocation`, growing
/// (room for `tokens`) or sliding over `window` tokens; a ring takes a whole call's tokens at
/// once.
pub(super) fn one_layer(
    tokens: usize,
    head_dim: usize,
    window: Option<usize>,
    allocation: &Allocation,
) -> ModelCache {
    let kind = match window {
        Some(window) => KvKind::Sliding { window },
        None => KvKind::Growing {
            growth: Growth::Static { capacity: tokens },
        },
    };
    let specs = vec![StateSpec {
        name: "blk.0.kv".into(),
        kind: StateKind::Kv {
            layer: 0,
            layout: KvLayout {
                kv_heads: 1,
                head_dim,
                kind,
                max_rewind: tokens,
                rope_pairs: tq_cache::basis::RopePairs::Adjacent,
                rope_base: tq_cache::rope_center::RopeBase::UNKNOWN,
            },
        },
    }];
    ModelCache::with_allocation(specs, allocation).expect("a one-layer cache")
}
