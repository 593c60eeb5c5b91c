//! The up-front resource checks: `cache_bytes_for` is the bytes a built cache reports for the
//! same tokens (so the budget check refuses exactly what would be allocated), and the errors
//! carry the numbers.

mod cache_common;

use tq_cache::allocation::{Allocation, ModelShape};
use tq_cache::kv_cache::{KvKind, KvLayout};
use tq_cache::states::{ModelCache, StateKind, StateSpec};
use tq_cache::token_store::Growth;
use tq_models::eval::perplexity::all_in_bits_per_value;
use tq_models::limits::{
    LimitError, all_in_bits_bound, block_slack_bytes_for_layers, cache_bytes_for,
    cache_bytes_for_layers, check_cache_budget, check_context,
};

const D: usize = 64;
const TOKENS: usize = 48;

fn full_cache(allocation: &Allocation) -> ModelCache {
    let specs = (0..3)
        .map(|layer| StateSpec {
            name: format!("blk.{layer}.kv"),
            kind: StateKind::Kv {
                layer,
                layout: KvLayout {
                    kv_heads: 2,
                    head_dim: D,
                    kind: KvKind::Growing {
                        growth: Growth::Static { capacity: TOKENS },
                    },
                    max_rewind: 0,
                    rope_pairs: tq_cache::basis::RopePairs::Adjacent,
                    rope_base: Default::default(),
                },
            },
        })
        .collect();
    let mut cache = ModelCache::with_allocation(specs, allocation).unwrap();
    cache_common::fill_layers(&mut cache, 3, D, TOKENS);
    cache
}

/// What the budget formula should give for a built `cache` of `allocation`: the formula bytes
/// of its states, plus the outlier channel lists of two-tier streams, which
/// `ModelCache::memory` leaves out and the budget counts (2 bytes per channel per stream), less
/// the heavy hitters' store and counts (`HeavyHitters::formula_bytes`: they depend on the
/// attention the cache drew and on its batches, so the budget leaves them out; the kept copies
/// count in `tq perplexity`'s all-in bits).
fn budgeted_bytes(cache: &ModelCache, allocation: &Allocation, shape: &ModelShape) -> u64 {
    let built: usize = cache.memory().iter().map(|m| m.formula_bytes).sum();
    let channel_lists: usize = allocation
        .plans(shape)
        .map(|p| p.unwrap().metadata_bytes_per_head())
        .sum();
    let heavy_hitters: usize = (0..tq_cache::states::layer_count(cache.specs()))
        .filter(|&layer| cache.kv_index(layer).is_ok_and(|(_, shared)| !shared))
        .filter_map(|layer| cache.kv(layer).ok())
        .flat_map(|kv| (0..kv.layout().kv_heads).flat_map(move |h| [kv.keys(h), kv.values(h)]))
        .filter_map(|s| s.heavy_hitters())
        .map(|h| h.formula_bytes())
        .sum();
    (built + channel_lists - heavy_hitters) as u64
}

/// For every shipped preset, the formula equals the bytes of a built cache holding exactly
/// that many tokens (static pages of that capacity, every window and mean in place), plus the
/// outlier channel lists of two-tier streams, which `ModelCache::memory` leaves out and the
/// budget counts (2 bytes per channel per stream).
#[test]
fn the_formula_is_what_a_full_cache_holds() {
    let shape = ModelShape {
        num_layers: 3,
        num_kv_heads: 2,
        head_dim: D,
    };
    for name in Allocation::preset_names() {
        let allocation = Allocation::preset(name).unwrap();
        let cache = full_cache(&allocation);
        assert_eq!(
            cache_bytes_for(&allocation, &shape, TOKENS).unwrap(),
            budgeted_bytes(&cache, &allocation, &shape),
            "{name}"
        );
    }
}

/// The all-in bound of `all_in_bits_bound` holds for a filled cache of every shipped preset
/// (its fits, means and windows in place): never below what the cache stores, and above it by
/// no more than the basis fits the bound assumes at their most.
#[test]
fn the_all_in_bound_bounds_a_full_cache() {
    let shape = ModelShape {
        num_layers: 3,
        num_kv_heads: 2,
        head_dim: D,
    };
    let rings = vec![None; 3];
    for name in Allocation::preset_names() {
        let allocation = Allocation::preset(name).unwrap();
        let cache = full_cache(&allocation);
        let stored = all_in_bits_per_value(&allocation, &shape, &rings, &cache, TOKENS).unwrap();
        let bound = all_in_bits_bound(&allocation, &shape, TOKENS).unwrap();
        // Planes: at most 64 plane indices (2 B) and 8 groups (8 B) a key stream.
        let slack = 8.0 * (6 * (2 * D + 64)) as f64 / (2 * 6 * D * TOKENS) as f64;
        assert!(
            stored <= bound && bound <= stored + slack,
            "{name}: stored {stored}, bound {bound}"
        );
    }
}

/// Layer 1 of three is a sliding window of 16 tokens with room for chunks of 8 (a ring of 23
/// slots), so after 48 tokens it holds 23.
const RING: usize = 23;

fn mixed_cache(allocation: &Allocation) -> ModelCache {
    let layout = |kind| KvLayout {
        kv_heads: 2,
        head_dim: D,
        kind,
        max_rewind: 0,
        rope_pairs: tq_cache::basis::RopePairs::Adjacent,
        rope_base: Default::default(),
    };
    let growing = KvKind::Growing {
        growth: Growth::Static { capacity: TOKENS },
    };
    let specs = (0..3)
        .map(|layer| StateSpec {
            name: format!("blk.{layer}.kv"),
            kind: StateKind::Kv {
                layer,
                layout: if layer == 1 {
                    KvLayout {
                        max_rewind: RING - 16,
                        ..layout(KvKind::Sliding { window: 16 })
                    }
                } else {
                    layout(growing)
                },
            },
        })
        .collect();
    let mut cache = ModelCache::with_allocation(specs, allocation).unwrap();
    cache_common::fill_layers_in_chunks(&mut cache, 3, D, TOKENS, 8);
    cache
}

/// With a sliding layer, the formula counts its ring (not every token) and resolves its
/// streams as a sliding layer's: it equals a built cache's bytes for every preset and for an
/// allocation that compresses only the global layers.
#[test]
fn the_formula_counts_sliding_layers_at_their_ring() {
    let shape = ModelShape {
        num_layers: 3,
        num_kv_heads: 2,
        head_dim: D,
    };
    let rings = [None, Some(RING), None];
    let global_only = Allocation::from_toml_str(
        r#"
        name = "global-only"
        key = { codec = "mse", bits = 4 }
        value = { codec = "mse", bits = 4 }
        [[override]]
        layer_kind = "sliding"
        key = { codec = "f16" }
        value = { codec = "f16" }
        "#,
    )
    .unwrap();
    // Windows of their own per stream and head, and one a sliding layer ignores.
    let own_windows = Allocation::from_toml_str(
        r#"
        name = "own-windows"
        sink_tokens = 2
        recent_fp_tokens = 6
        key = { codec = "mse", bits = 4, recent_fp_tokens = 9 }
        value = { codec = "mse", bits = 3 }
        [[override]]
        layers = [2]
        heads = [1]
        value = { recent_fp_tokens = 13 }
        [[override]]
        layer_kind = "sliding"
        key = { recent_fp_tokens = 40 }
        "#,
    )
    .unwrap();
    let presets = Allocation::preset_names().map(|n| Allocation::preset(n).unwrap());
    for allocation in presets.chain([global_only, own_windows, eight_bit_window()]) {
        let cache = mixed_cache(&allocation);
        assert_eq!(
            cache_bytes_for_layers(&allocation, &shape, &rings, TOKENS).unwrap(),
            budgeted_bytes(&cache, &allocation, &shape),
            "{}",
            allocation.name
        );
    }
    // The sliding layer's f16 streams cost what an f16 layer of RING tokens costs.
    let f16 = Allocation::preset("f16").unwrap();
    let all = cache_bytes_for(&f16, &shape, TOKENS).unwrap();
    let mixed = cache_bytes_for_layers(&f16, &shape, &rings, TOKENS).unwrap();
    assert_eq!(all - mixed, ((TOKENS - RING) * (2 * 2 * D * 2 + 4)) as u64);
    assert!(cache_bytes_for_layers(&f16, &shape, &[None], TOKENS).is_err());
}

/// Windows of their own per stream, in 8 bits: the global layers' windows hold the only copy
/// of their tokens (no codes), the sliding layer ignores them.
fn eight_bit_window() -> Allocation {
    Allocation::from_toml_str(
        r#"
        name = "q8-window"
        sink_tokens = 2
        recent_fp_tokens = 6
        recent_dtype = "q8"
        key = { codec = "mse", bits = 4, recent_fp_tokens = 9, center = "first-chunk" }
        value = { codec = "mse", bits = 3 }
        [[override]]
        layers = [2]
        heads = [1]
        value = { recent_fp_tokens = 13 }
        "#,
    )
    .unwrap()
}

/// `tq perplexity`'s all-in bits count a sliding layer at its ring and resolve its streams as
/// a sliding layer's, as the budget formula does: for every preset, the bits times the values
/// the layers hold are the formula's bytes less the position table (which the bits leave
/// out), and an f16 cache is 16 bits.
#[test]
fn all_in_bits_count_sliding_layers_at_their_ring() {
    let shape = ModelShape {
        num_layers: 3,
        num_kv_heads: 2,
        head_dim: D,
    };
    let rings = [None, Some(RING), None];
    let held = 2 * TOKENS + RING;
    let values = (2 * 2 * D * held) as f64;
    let presets = Allocation::preset_names().map(|n| Allocation::preset(n).unwrap());
    for allocation in presets.chain([eight_bit_window()]) {
        let cache = mixed_cache(&allocation);
        let bits = all_in_bits_per_value(&allocation, &shape, &rings, &cache, TOKENS).unwrap();
        let formula = cache_bytes_for_layers(&allocation, &shape, &rings, TOKENS).unwrap();
        // Stored bits: the empty slots of whole fast-scan blocks are allocated, not stored.
        let slack = block_slack_bytes_for_layers(&allocation, &shape, &rings, TOKENS).unwrap();
        assert_eq!(
            (bits * values / 8.0).round() as u64,
            formula - slack - 4 * held as u64,
            "{}",
            allocation.name
        );
    }
    // The 8-bit window's bits, by hand: keys 4-bit codes + f16 norm (34 bytes), values 3-bit
    // (24 + 2), for the tokens outside each global stream's window; 8-bit copies (64 + 2 bytes)
    // of the window; f16 sinks; the keys' means; the sliding layer's RING tokens of codes.
    let q8 = eight_bit_window();
    let cache = mixed_cache(&q8);
    let bits = all_in_bits_per_value(&q8, &shape, &rings, &cache, TOKENS).unwrap();
    let global_streams =
        |window: usize, record: usize| (TOKENS - window) * record + window * 66 + 2 * 128;
    let by_hand = 4 * global_streams(9, 34) + 4 * 4 * D // keys of layers 0, 2 (2 heads), means
        + 3 * global_streams(6, 26) + global_streams(13, 26) // values
        + 2 * RING * (34 + 26) + 2 * 4 * D; // the sliding layer (its keys centered too)
    assert_eq!((bits * values / 8.0).round() as usize, by_hand);
    let f16 = Allocation::preset("f16").unwrap();
    let cache = mixed_cache(&f16);
    let bits = all_in_bits_per_value(&f16, &shape, &rings, &cache, TOKENS).unwrap();
    assert_eq!(bits, 16.0);
    assert!(all_in_bits_per_value(&f16, &shape, &[None], &cache, TOKENS).is_err());
}

#[test]
fn over_the_window_or_the_budget_is_refused_with_the_numbers() {
    let err = check_context("the prompt plus --max-tokens", 9000, 8192).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("9000") && text.contains("8192"), "{text}");
    assert!(check_context("x", 8192, 8192).is_ok());
    let shape = ModelShape {
        num_layers: 30,
        num_kv_heads: 3,
        head_dim: D,
    };
    let f16 = Allocation::preset("f16").unwrap();
    let needed = cache_bytes_for(&f16, &shape, 8192).unwrap();
    assert!(check_cache_budget(&f16, &shape, 8192, needed).is_ok());
    let err = check_cache_budget(&f16, &shape, 8192, needed - 1).unwrap_err();
    assert!(matches!(err, LimitError::OverBudget { needed: n, .. } if n == needed));
    assert!(err.to_string().contains(&needed.to_string()), "{err}");
    // A compressed allocation fits where f16 does not.
    let small = Allocation::preset("rec4.25").unwrap();
    assert!(check_cache_budget(&small, &shape, 8192, needed / 3).is_ok());
}

/// The recommended presets and the 8-bit-window lever files stay within the bits their names
/// promise on SmolLM2's shape (30 layers, 3 KV heads, d = 64) at 2048 tokens and, their
/// windows growing with the context beyond 2048, at every longer context too — counted by the budget formula (codes of the tokens outside each window, 8-bit window copies,
/// f16 sinks, means; the position tables left out as the all-in bits leave them out) plus a
/// bound on the plane fits (data: at most 64 plane indices and 8 groups per key stream), use
/// that budget (within 0.03
/// bits at 2048), and hold windows more than twice as long as their f16-window versions.
#[test]
fn recommended_presets_and_eight_bit_levers_stay_within_their_budget() {
    let shape = ModelShape {
        num_layers: 30,
        num_kv_heads: 3,
        head_dim: D,
    };
    let presets = concat!(env!("CARGO_MANIFEST_DIR"), "/../cache/presets");
    let load = |path: String| Allocation::load(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    for (lever, base, budget) in [
        ("rec4.25.toml", "levers/rec4.25-w56.toml", 4.25),
        (
            "levers/rec4.25-layers-q8.toml",
            "levers/rec4.25-layers.toml",
            4.25,
        ),
        ("rec3.25.toml", "levers/rec3.25-w56.toml", 3.25),
        (
            "levers/rec3.25-layers-q8.toml",
            "levers/rec3.25-layers.toml",
            3.25,
        ),
        ("rec2.5.toml", "levers/rec2.5-w24.toml", 2.5),
    ] {
        let a = load(format!("{presets}/{lever}"));
        let b = load(format!("{presets}/{base}"));
        assert!(a.window_defers_codes(), "{lever}");
        assert!(
            a.longest_recent_window(2048) > 2 * b.longest_recent_window(2048),
            "{lever}"
        );
        for tokens in [2048, 4096, 8192, 20000] {
            let values = (2 * shape.num_layers * shape.num_kv_heads * D * tokens) as f64;
            let positions = (4 * tokens * shape.num_layers) as u64;
            // Stored bits: the empty slots of whole fast-scan blocks are left out.
            let rings = vec![None; shape.num_layers];
            let slack = block_slack_bytes_for_layers(&a, &shape, &rings, tokens).unwrap();
            let bytes = cache_bytes_for(&a, &shape, tokens).unwrap() - positions - slack;
            // The plane fits at their most: 2 bytes a plane index, 8 a group (at most 8
            // groups, one per width) — `FittedBasis::bytes` — per key stream.
            let fits = (shape.num_layers * shape.num_kv_heads * (2 * D + 64)) as f64;
            let bits = 8.0 * (bytes as f64 + fits) / values;
            // The library's bound is this count (`the_all_in_bound_bounds_a_full_cache` holds
            // it to built caches).
            let bound = all_in_bits_bound(&a, &shape, tokens).unwrap();
            assert!(
                (bound - bits).abs() < 1e-12,
                "{lever} at {tokens}: {bound} vs {bits}"
            );
            // Sized at 2048: longer contexts spread the fixed costs (sinks, means) thinner.
            let used = if tokens == 2048 { 0.03 } else { 0.06 };
            assert!(
                bits <= budget && bits > budget - used,
                "{lever} at {tokens}: {bits} bits"
            );
        }
    }
}
