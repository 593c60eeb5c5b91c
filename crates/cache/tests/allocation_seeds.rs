//! Seeds of rotations and sketches: independent across layers, heads, streams, tiers and
//! roles, and a pure function of the allocation. Catches: heads sharing a rotation (correlated
//! errors across heads), the mixing function changing (a saved cache would rebuild other
//! matrices; the pinned values below guard that), and resolve not using the documented seeds.

use std::collections::HashSet;

use tq_cache::CodecSpec;
use tq_cache::allocation::{
    Allocation, DEFAULT_SEED, SeedRole, StreamKind, StreamPlan, Tier, derive_seed, splitmix64,
};

#[test]
fn splitmix64_matches_the_reference_sequence() {
    // The first outputs of SplitMix64 seeded with 0 (state advances by the golden gamma).
    let gamma = 0x9E37_79B9_7F4A_7C15u64;
    assert_eq!(splitmix64(0), 0xE220_A839_7B1D_CDAF);
    assert_eq!(splitmix64(gamma), 0x6E78_9E6A_A1B9_65F4);
}

#[test]
fn derived_seeds_are_pinned() {
    // If these change, every saved cache's rotations change: bump the cache format version.
    assert_eq!(
        derive_seed(
            DEFAULT_SEED,
            0,
            0,
            StreamKind::Key,
            Tier::Whole,
            SeedRole::Rotation
        ),
        PINNED[0]
    );
    assert_eq!(
        derive_seed(
            DEFAULT_SEED,
            31,
            7,
            StreamKind::Value,
            Tier::Outlier,
            SeedRole::Sketch
        ),
        PINNED[1]
    );
}

/// Computed independently (Python, from the formula in the module docs).
const PINNED: [u64; 2] = [0xA8D0_5943_8A5B_0FDE, 0x7516_F4E5_2AB6_4B25];

#[test]
fn derived_seeds_are_distinct_across_every_coordinate() {
    let mut seen = HashSet::new();
    for layer in 0..32 {
        for head in 0..8 {
            for stream in StreamKind::BOTH {
                for tier in [Tier::Whole, Tier::Outlier, Tier::Rest] {
                    for role in [SeedRole::Rotation, SeedRole::Sketch] {
                        let seed = derive_seed(1, layer, head, stream, tier, role);
                        assert!(seen.insert(seed), "collision at {layer} {head} {stream}");
                    }
                }
            }
        }
    }
    assert_ne!(
        derive_seed(1, 0, 0, StreamKind::Key, Tier::Whole, SeedRole::Rotation),
        derive_seed(2, 0, 0, StreamKind::Key, Tier::Whole, SeedRole::Rotation)
    );
}

fn prod_seeds(plan: &StreamPlan) -> (u64, u64) {
    match plan.single() {
        Some(CodecSpec::Prod(s)) => (s.seed, s.sketch.seed),
        other => panic!("expected prod, got {other:?}"),
    }
}

#[test]
fn resolve_uses_the_derived_seeds() {
    let k5v4 = Allocation::preset("k5v4").unwrap();
    let plan = k5v4.resolve(4, 30, 2, 64, StreamKind::Key).unwrap();
    let (rotation, sketch) = prod_seeds(&plan);
    let at = |role| derive_seed(k5v4.seed, 4, 2, StreamKind::Key, Tier::Whole, role);
    assert_eq!(
        (rotation, sketch),
        (at(SeedRole::Rotation), at(SeedRole::Sketch))
    );
    // Same allocation, same seeds; another head, another rotation.
    let again = Allocation::preset("k5v4").unwrap();
    assert_eq!(again.resolve(4, 30, 2, 64, StreamKind::Key).unwrap(), plan);
    let other = k5v4.resolve(4, 30, 1, 64, StreamKind::Key).unwrap();
    assert_ne!(prod_seeds(&other).0, rotation);

    let tq = Allocation::preset("tq3.5").unwrap();
    let tiers = *tq
        .resolve(7, 32, 3, 128, StreamKind::Value)
        .unwrap()
        .two_tier()
        .unwrap();
    let seed_of = |spec: CodecSpec| match spec {
        CodecSpec::Mse(s) => s.seed,
        other => panic!("{other:?}"),
    };
    let at = |tier| derive_seed(tq.seed, 7, 3, StreamKind::Value, tier, SeedRole::Rotation);
    assert_eq!(seed_of(tiers.outlier), at(Tier::Outlier));
    assert_eq!(seed_of(tiers.rest), at(Tier::Rest));
}

#[test]
fn the_file_seed_moves_every_derived_seed() {
    let text = Allocation::preset_text("mse-k4v4").unwrap();
    let a = Allocation::from_toml_str(text).unwrap();
    let b = Allocation::from_toml_str(&format!("seed = 5\n{text}")).unwrap();
    for layer in 0..4 {
        let pa = a.resolve(layer, 4, 0, 64, StreamKind::Key).unwrap();
        let pb = b.resolve(layer, 4, 0, 64, StreamKind::Key).unwrap();
        assert_ne!(pa, pb);
    }
}
