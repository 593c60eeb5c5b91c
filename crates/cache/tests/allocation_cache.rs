//! Caches built from bit allocations: every preset on real model shapes, byte accounting,
//! two-tier calibration from the prefill, save/restore of the chosen channels.

mod common;

use common::vectors;
use tq_cache::TokenCodec;
use tq_cache::allocation::Allocation;
use tq_cache::attention::{AttentionKernel, AttentionShape};
use tq_cache::kv_cache::{KvCache, KvKind, KvLayout};
use tq_cache::persist::{from_bytes, to_bytes};
use tq_cache::states::{ModelCache, StateKind, StateSpec};
use tq_cache::token_store::Growth;

fn layout(kv_heads: usize, head_dim: usize) -> KvLayout {
    KvLayout {
        kv_heads,
        head_dim,
        kind: KvKind::Growing {
            growth: Growth::Doubling { initial: 64 },
        },
        max_rewind: 0,
        rope_pairs: tq_cache::basis::RopePairs::Adjacent,
        rope_base: Default::default(),
    }
}

/// Keys whose channels 5 and 40 (of each head) carry 10× the energy.
fn keys_with_outliers(n: usize, kv_heads: usize, head_dim: usize, seed: u64) -> Vec<f32> {
    let mut k = vectors(n, kv_heads * head_dim, seed);
    for (i, v) in k.iter_mut().enumerate() {
        let channel = i % head_dim;
        if channel == 5 || channel == 40 {
            *v *= 10.0;
        }
    }
    k
}

#[test]
fn every_preset_builds_caches_whose_bytes_match_the_formula() {
    for name in Allocation::preset_names() {
        let allocation = Allocation::preset(name).unwrap();
        for (kv_heads, head_dim, layers) in [(3usize, 64usize, 30usize), (8, 128, 32)] {
            for layer in [0, layers / 2, layers - 1] {
                let mut cache = KvCache::with_allocation(
                    layout(kv_heads, head_dim),
                    &allocation,
                    layer,
                    layers,
                )
                .unwrap();
                let n = 300;
                let k = keys_with_outliers(n, kv_heads, head_dim, 1);
                let v = vectors(n, kv_heads * head_dim, 2);
                let positions: Vec<u32> = (0..n as u32).collect();
                cache.append(&k, &v, &positions).unwrap();
                assert_eq!(
                    cache.formula_bytes(),
                    cache.allocated_bytes(),
                    "{name} d={head_dim} layer {layer}"
                );
                let q = vectors(2 * kv_heads, head_dim, 3);
                let mut out = vec![0.0; q.len()];
                let shape = AttentionShape {
                    q_heads: 2 * kv_heads,
                    scale: 1.0 / (head_dim as f32).sqrt(),
                };
                tq_cache::attention::attend(
                    &cache,
                    &q,
                    &[299],
                    shape,
                    AttentionKernel::Fused,
                    &mut out,
                )
                .unwrap();
                assert!(out.iter().all(|v| v.is_finite()), "{name}");
            }
        }
    }
}

#[test]
fn two_tier_streams_pick_the_prefill_outlier_channels_and_reload_them() {
    let allocation = Allocation::preset("tq3.5").unwrap();
    let specs = vec![StateSpec {
        name: "l0".into(),
        kind: StateKind::Kv {
            layer: 0,
            layout: layout(2, 64),
        },
    }];
    let mut cache = ModelCache::with_allocation(specs, &allocation).unwrap();
    let k = keys_with_outliers(200, 2, 64, 7);
    let v = vectors(200, 128, 8);
    let q = vectors(200 * 4, 64, 9);
    let positions: Vec<u32> = (0..200).collect();
    let mut out = vec![0.0; q.len()];
    let shape = AttentionShape {
        q_heads: 4,
        scale: 0.125,
    };
    cache
        .forward_layer(
            0,
            &q,
            Some((&k, &v)),
            &positions,
            shape,
            AttentionKernel::Fused,
            &mut out,
        )
        .unwrap();
    for head in 0..2 {
        let TokenCodec::TwoTier(tiers) = cache.kv(0).unwrap().keys(head).codec() else {
            panic!("tq3.5 keys are two-tier");
        };
        assert_eq!(tiers.channels().len(), 16, "25% of 64 channels");
        assert!(tiers.channels().contains(&5) && tiers.channels().contains(&40));
    }
    let bytes = to_bytes(&cache).unwrap();
    let reloaded = from_bytes(&bytes).unwrap();
    assert_eq!(to_bytes(&reloaded).unwrap(), bytes);
    let TokenCodec::TwoTier(tiers) = reloaded.kv(0).unwrap().keys(1).codec() else {
        panic!("two-tier after reload");
    };
    assert!(tiers.channels().contains(&5) && tiers.channels().contains(&40));
    // A reset forgets the channels: the next prefill chooses again.
    let mut reset = reloaded.fork();
    reset.reset();
    let fresh = vectors(50, 128, 10);
    let positions: Vec<u32> = (0..50).collect();
    let q = vectors(50 * 4, 64, 11);
    let mut out = vec![0.0; q.len()];
    reset
        .forward_layer(
            0,
            &q,
            Some((&fresh, &fresh)),
            &positions,
            shape,
            AttentionKernel::Fused,
            &mut out,
        )
        .unwrap();
    let TokenCodec::TwoTier(tiers) = reset.kv(0).unwrap().keys(0).codec() else {
        panic!("two-tier after reset");
    };
    assert!(!(tiers.channels().contains(&5) && tiers.channels().contains(&40)));
}
