//! Every shipped preset parses, resolves for two real model shapes, builds its codecs, and
//! reports exactly the bytes those codecs allocate. Catches: a preset that no longer parses
//! after a schema change, accounting formulas drifting from `TokenCodec`, and bit costs that
//! silently change (they are pinned below and quoted in `presets/README.md`).

use tq_cache::TokenCodec;
use tq_cache::allocation::{Allocation, LayerKind, ModelShape, StreamKind, StreamPlan};
use tq_cache::rope_center::RopeBase;
use tq_cache::two_tier::TwoTierCodec;

const SMALL: ModelShape = ModelShape {
    num_layers: 30,
    num_kv_heads: 3,
    head_dim: 64,
};
const LARGE: ModelShape = ModelShape {
    num_layers: 32,
    num_kv_heads: 8,
    head_dim: 128,
};

/// Builds the codec(s) of a plan and returns the bytes per token they allocate.
fn built_bytes(plan: &StreamPlan) -> usize {
    match plan {
        StreamPlan::Single(spec) => TokenCodec::new(spec).unwrap().bytes_per_token(),
        StreamPlan::TwoTier(tiers) => {
            // Any valid channel list: the accounting must not depend on which channels.
            let channels: Vec<u16> = (0..tiers.channels as u16).map(|c| 2 * c).collect();
            let codec: TwoTierCodec = tiers.build(channels).unwrap();
            assert_eq!(codec.head_dim(), plan.head_dim());
            assert_eq!(codec.metadata_bytes(), plan.metadata_bytes_per_head());
            codec.bytes_per_token()
        }
    }
}

#[test]
fn the_preset_list_is_the_documented_one() {
    let names: Vec<_> = Allocation::preset_names().collect();
    assert_eq!(
        names,
        [
            "f16",
            "mse-k4v4",
            "k5v4",
            "mse-k5v4",
            "tq3.5",
            "tq2.5",
            "paper-prod",
            "mse-k4v4-c",
            "k5v3-c",
            "rec4.25",
            "rec3.25",
            "rec2.5",
            "rec4.25-global",
            "rec3.25-global",
            "k6v5-global"
        ]
    );
    let readme = include_str!("../presets/README.md");
    for name in names {
        assert!(
            readme.contains(&format!("`{name}`")),
            "README misses {name}"
        );
    }
}

#[test]
fn every_preset_parses_and_is_named_after_itself() {
    for name in Allocation::preset_names() {
        let allocation = Allocation::preset(name).unwrap();
        assert_eq!(allocation.name, name);
        assert!(
            allocation.description.is_some(),
            "{name} has no description"
        );
    }
}

#[test]
fn every_preset_resolves_and_builds_with_honest_bytes() {
    for name in Allocation::preset_names() {
        let allocation = Allocation::preset(name).unwrap();
        for shape in [SMALL, LARGE] {
            allocation.validate_for(&shape).unwrap();
            // Presets have no per-layer rules, so three layers per head cover them; building
            // every codec of the large model would only repeat the same specs.
            for layer in [0, shape.num_layers / 2, shape.num_layers - 1] {
                for head in 0..shape.num_kv_heads {
                    for stream in StreamKind::BOTH {
                        let plan = allocation
                            .resolve(layer, shape.num_layers, head, shape.head_dim, stream)
                            .unwrap();
                        assert_eq!(plan.head_dim(), shape.head_dim);
                        assert_eq!(
                            plan.bytes_per_token(),
                            built_bytes(&plan),
                            "{name} layer {layer} head {head} {stream}"
                        );
                    }
                }
            }
        }
    }
}

/// Bits per value (keys, values) at d = 64 and d = 128, as `presets/README.md` states them.
#[test]
fn preset_costs_are_pinned() {
    let expected: [(&str, [f64; 2], [f64; 2]); 15] = [
        ("f16", [16.0, 16.0], [16.0, 16.0]),
        ("mse-k4v4", [4.25, 4.25], [4.125, 4.125]),
        ("k5v4", [5.5, 4.25], [5.25, 4.125]),
        ("mse-k5v4", [5.25, 4.25], [5.125, 4.125]),
        ("tq3.5", [4.0, 4.0], [3.5, 3.5]),
        ("tq2.5", [3.0, 3.0], [2.5, 2.5]),
        ("paper-prod", [4.5, 4.5], [4.25, 4.25]),
        ("mse-k4v4-c", [4.25, 4.25], [4.125, 4.125]),
        ("k5v3-c", [5.25, 3.25], [5.125, 3.125]),
        // SmolLM2's one-bit layer trades: keys 2 layers up and 4 down, values 7 up and 5 down.
        (
            "rec4.25",
            [(127.5 - 2.0) / 30.0, (97.5 + 2.0) / 30.0],
            [4.125, 3.125],
        ),
        // SmolLM2's one-bit layer trades (30 layers, `model_layers = 30`): keys 7 layers up
        // and 11 down, values 10 up and 6 down, the same total (5.5 bits a key and value).
        // The 32-layer shape keeps the uniform bits.
        (
            "rec3.25",
            [(97.5 - 4.0) / 30.0, (67.5 + 4.0) / 30.0],
            [3.125, 2.125],
        ),
        // Its trades: keys 5 layers up and 7 down, values 6 up and 4 down.
        (
            "rec2.5",
            [(67.5 - 2.0) / 30.0, (67.5 + 2.0) / 30.0],
            [2.125, 2.125],
        ),
        // Every layer of these shapes is global.
        ("rec4.25-global", [5.25, 3.25], [5.125, 3.125]),
        ("rec3.25-global", [4.25, 2.25], [4.125, 2.125]),
        ("k6v5-global", [6.25, 5.25], [6.125, 5.125]),
    ];
    for (name, small, large) in expected {
        let allocation = Allocation::preset(name).unwrap();
        for (shape, [key, value]) in [(SMALL, small), (LARGE, large)] {
            let k = allocation.bits_per_value(&shape, StreamKind::Key).unwrap();
            let v = allocation
                .bits_per_value(&shape, StreamKind::Value)
                .unwrap();
            assert_eq!((k, v), (key, value), "{name} at d = {}", shape.head_dim);
        }
    }
}

#[test]
fn two_tier_presets_split_a_quarter_of_the_channels() {
    for (name, outlier_bits, rest_bits) in [("tq3.5", 4, 3), ("tq2.5", 3, 2)] {
        let allocation = Allocation::preset(name).unwrap();
        for (head_dim, k) in [(64, 16), (128, 32)] {
            let plan = allocation
                .resolve(0, 32, 0, head_dim, StreamKind::Value)
                .unwrap();
            let tiers = plan.two_tier().expect("two tiers");
            assert_eq!(tiers.channels, k);
            assert_eq!(plan.metadata_bytes_per_head(), 2 * k);
            match (tiers.outlier, tiers.rest) {
                (tq_cache::CodecSpec::Mse(o), tq_cache::CodecSpec::Mse(r)) => {
                    assert_eq!((o.dim, o.bits), (k, outlier_bits));
                    assert_eq!((r.dim, r.bits), (head_dim - k, rest_bits));
                    assert_ne!(o.seed, r.seed, "each tier has its own rotation");
                }
                other => panic!("{name}: unexpected tiers {other:?}"),
            }
        }
    }
}

/// The centered presets center every key and value stream, and only those; their means are
/// per-head metadata (`4·head_dim` bytes, not per token), so the bits per value above are the
/// uncentered presets' own.
#[test]
fn centered_presets_center_every_stream_and_pin_the_mean_bytes() {
    use tq_cache::center::CenterPolicy;
    for name in Allocation::preset_names() {
        let allocation = Allocation::preset(name).unwrap();
        let centered = name.ends_with("-c")
            || name.ends_with("-global")
            || Allocation::recommended_names().any(|r| r == name);
        for shape in [SMALL, LARGE] {
            for layer in [0, shape.num_layers - 1] {
                for stream in StreamKind::BOTH {
                    let r = allocation
                        .resolve_stream(layer, shape.num_layers, 0, shape.head_dim, stream)
                        .unwrap();
                    // The recommended presets turn the keys' mean with RoPE where the model
                    // allows (`rope-or-first-chunk`, the same bytes).
                    let recommended = Allocation::recommended_names().any(|r| r == name);
                    let expected = match (centered, recommended, stream) {
                        (false, ..) => CenterPolicy::None,
                        (true, true, StreamKind::Key) => CenterPolicy::RopeOrFirstChunk,
                        (true, ..) => CenterPolicy::FirstChunk,
                    };
                    assert_eq!(r.center, expected, "{name} {stream}");
                    let mean_bytes = if centered { 4 * shape.head_dim } else { 0 };
                    assert_eq!(
                        r.metadata_bytes_per_head(),
                        r.plan.metadata_bytes_per_head() + mean_bytes,
                        "{name}"
                    );
                }
            }
        }
    }
    let uncentered = Allocation::preset("mse-k4v4").unwrap();
    let centered = Allocation::preset("mse-k4v4-c").unwrap();
    for stream in StreamKind::BOTH {
        assert_eq!(
            centered.resolve(3, 30, 1, 64, stream).unwrap(),
            uncentered.resolve(3, 30, 1, 64, stream).unwrap(),
            "the same codecs and seeds: centering is the only difference"
        );
    }
}

/// Bits per value on SmolLM2's shape (d = 64) at `tokens` tokens by the budget formula: per
/// stream, the codes and norms of the tokens outside its window, its window's 8-bit copies
/// (8 + 16/64 bits a value) and the f16 sinks (16), plus the f32 mean and the largest plane fit
/// (192 bytes); with the windows' share of the tokens and the codes' bits per value.
fn budget_bits(allocation: &Allocation, tokens: usize) -> (f64, f64, f64) {
    let (mut all_in, mut codes, mut window_share) = (0.0, 0.0, 0.0);
    for stream in StreamKind::BOTH {
        let recent = allocation
            .resolve_stream(0, 30, 0, 64, stream)
            .unwrap()
            .recent;
        let window = recent.tokens_at(tokens) as f64;
        window_share += window / tokens as f64 / 2.0;
        let per_token = allocation.bits_per_value(&SMALL, stream).unwrap();
        codes += per_token / 2.0;
        let body = (tokens as f64 - window) * per_token;
        let copies = window * (8.0 + 16.0 / 64.0) + 2.0 * 16.0;
        all_in += (body + copies) / tokens as f64 / 2.0;
    }
    let mean = 32.0 / tokens as f64;
    let fit = 192.0 * 8.0 / (2.0 * tokens as f64 * 64.0);
    (all_in + mean + fit, codes, window_share)
}

/// The recommended presets keep 2 f16 sink tokens and 8-bit step windows on both streams
/// (codes written as tokens leave them) that grow with the context beyond 2048 tokens, are
/// listed best quality (most bits) first, and fit the budget their names state at 2048 tokens
/// on SmolLM2's shape, using it. (The exact count, from a built cache's bytes, is
/// `tq_models::limits`'s test of the same budgets.)
#[test]
fn recommended_presets_fit_their_budgets() {
    let names: Vec<_> = Allocation::recommended_names().collect();
    assert_eq!(names, ["rec4.25", "rec3.25", "rec2.5"]);
    let mut last = f64::INFINITY;
    for (name, budget) in names.into_iter().zip([4.25, 3.25, 2.5]) {
        let allocation = Allocation::preset(name).unwrap();
        assert_eq!(allocation.sink_tokens, 2, "{name}");
        assert!(allocation.window_defers_codes(), "{name}");
        for stream in StreamKind::BOTH {
            let recent = allocation
                .resolve_stream(0, 30, 0, 64, stream)
                .unwrap()
                .recent;
            assert!(
                recent.fraction.is_some() && recent.tokens > Some(0),
                "{name}"
            );
        }
        let (all_in, codes, _) = budget_bits(&allocation, 2048);
        assert!(all_in <= budget, "{name}: {all_in} bits per value");
        assert!(all_in > budget - 0.05, "{name} uses its budget: {all_in}");
        assert!(codes < last, "{name}");
        last = codes;
    }
}

/// The presets' windows are their `-fixed` lever files' counts up to 2048 tokens (the floors;
/// the same rows there) and the same share of the tokens beyond (up to rounding), so within the
/// budget from 2048 to 32768 tokens, where the fixed windows' share — and bits — fall. Below
/// 2048 the floors and the fixed costs (sinks, means, fits: 0.06 bits a value at 2048, 0.24 at
/// 512) outgrow the budget, as for the fixed windows.
#[test]
fn preset_windows_keep_their_budget_at_every_context() {
    let levers = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("presets/levers");
    for (name, budget) in [("rec4.25", 4.25), ("rec3.25", 3.25), ("rec2.5", 2.5)] {
        let preset = Allocation::preset(name).unwrap();
        let fixed = Allocation::load(levers.join(format!("{name}-fixed.toml"))).unwrap();
        for stream in StreamKind::BOTH {
            let window = |a: &Allocation| a.resolve_stream(0, 30, 0, 64, stream).unwrap().recent;
            let (p, f) = (window(&preset), window(&fixed));
            assert!(f.fraction.is_none(), "{name}");
            for tokens in [1, 100, 1000, 2048] {
                assert_eq!(p.tokens_at(tokens), f.tokens_at(tokens), "{name}");
            }
            assert!(p.tokens_at(4096) > f.tokens_at(4096), "{name}");
        }
        let (_, _, share_2048) = budget_bits(&preset, 2048);
        for tokens in [2048usize, 3000, 4096, 8192, 32768] {
            let (all_in, _, share) = budget_bits(&preset, tokens);
            assert!(
                all_in <= budget,
                "{name} at {tokens}: {all_in} bits per value"
            );
            assert!(
                (share - share_2048).abs() <= 1.0 / tokens as f64,
                "{name} at {tokens}"
            );
            let (fixed_bits, _, fixed_share) = budget_bits(&fixed, tokens);
            if tokens > 2048 {
                assert!(
                    fixed_share < share && fixed_bits < all_in,
                    "{name} at {tokens}"
                );
            }
        }
    }
}

#[test]
fn k5v4_is_the_seed_hybrid() {
    let plan = Allocation::preset("k5v4")
        .unwrap()
        .resolve(0, 30, 0, 64, StreamKind::Key)
        .unwrap();
    let Some(tq_cache::CodecSpec::Prod(spec)) = plan.single() else {
        panic!("{plan:?}")
    };
    assert_eq!(spec.bits, 5);
    assert_eq!(spec.sketch.kind, tq_qjl::SketchKind::Haar);
    assert_eq!(spec.sketch.scale, tq_qjl::SketchScale::Asymptotic);
    assert_eq!(spec.sketch.shrinkage, 0.7);
    assert_eq!(spec.rotation, tq_rotation::RotationKind::Hadamard);
}

#[test]
fn presets_round_trip_through_toml() {
    for name in Allocation::preset_names() {
        let allocation = Allocation::preset(name).unwrap();
        let text = allocation.to_toml_string().unwrap();
        assert_eq!(
            Allocation::from_toml_str(&text).unwrap(),
            allocation,
            "{text}"
        );
    }
}

#[test]
fn load_takes_a_preset_name_or_a_path() {
    assert_eq!(Allocation::load("tq2.5").unwrap().name, "tq2.5");
    let path = std::env::temp_dir().join(format!("tq-allocation-{}.toml", std::process::id()));
    std::fs::write(&path, Allocation::preset_text("k5v4").unwrap()).unwrap();
    let loaded = Allocation::load(&path);
    std::fs::remove_file(&path).unwrap();
    assert_eq!(loaded.unwrap(), Allocation::preset("k5v4").unwrap());

    let err = Allocation::load("no-such-preset.toml")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("`no-such-preset.toml` is not a shipped preset"),
        "{err}"
    );
    assert!(
        err.contains("k5v4") && err.contains("nor an existing file"),
        "{err}"
    );
}

/// Every allocation file shipped beside the presets (the QJL and lever ablations that
/// docs/results.md measures, the exact/Gaussian/debiased variants) loads, is valid for the
/// reference shape and is named after its file: a results table can always be rerun.
#[test]
fn every_shipped_allocation_file_loads_and_is_named_after_itself() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("presets");
    let mut files = Vec::new();
    for dir in [root.clone(), root.join("qjl-ablation"), root.join("levers")] {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "toml") {
                files.push(path);
            }
        }
    }
    assert!(files.len() >= 20, "{files:?}");
    for path in files {
        let allocation = Allocation::load(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
        assert_eq!(
            Some(allocation.name.as_str()),
            path.file_stem().and_then(|s| s.to_str()),
            "{path:?}"
        );
        allocation.validate_for(&SMALL).unwrap();
    }
}

/// The layer-wise lever files trade bits between layers and streams without changing the
/// total: on SmolLM2's shape each stores exactly its base's bits per value (keys and values
/// together; windows and sinks the same), while some stream does differ. The bases: the
/// presets' uniform recipes (8-bit windows) and their f16-window versions until 2026-12-04;
/// the presets' own trades (`rec3.25`, `rec2.5` since session 32, `rec4.25` since session 33)
/// against their uniform recipes.
#[test]
fn layer_wise_levers_cost_their_base_presets_bits() {
    let levers = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("presets/levers");
    let load = |name: &str| match Allocation::preset(name) {
        Ok(preset) => preset,
        Err(_) => Allocation::load(levers.join(format!("{name}.toml"))).unwrap(),
    };
    for (lever, base) in [
        ("rec4.25-layers-q8", "rec4.25-uniform"),
        ("rec3.25-layers-q8", "rec3.25-uniform"),
        ("rec4.25", "rec4.25-uniform"),
        ("rec3.25", "rec3.25-uniform"),
        ("rec2.5", "rec2.5-uniform"),
        ("rec4.25-layers", "rec4.25-w56"),
        ("rec3.25-layers", "rec3.25-w56"),
    ] {
        let a = load(lever);
        let b = load(base);
        let total = |x: &Allocation| -> f64 {
            StreamKind::BOTH
                .iter()
                .map(|&s| x.bits_per_value(&SMALL, s).unwrap())
                .sum()
        };
        assert_eq!(total(&a), total(&b), "{lever}");
        assert_eq!(
            (a.sink_tokens, a.recent_fp_tokens, a.recent_dtype),
            (b.sink_tokens, b.recent_fp_tokens, b.recent_dtype),
            "{lever}"
        );
        for stream in StreamKind::BOTH {
            let window = |x: &Allocation| x.resolve_stream(0, 30, 0, 64, stream).unwrap().recent;
            assert_eq!(window(&a), window(&b), "{lever} {stream:?}");
        }
        assert!(
            a.plans(&SMALL)
                .zip(b.plans(&SMALL))
                .any(|(p, q)| p.unwrap() != q.unwrap()),
            "{lever}"
        );
    }
}

/// The recommended presets' layer trades are SmolLM2's (`model_layers = 30`): on a model of
/// another depth — Gemma 3's 18 layers of both kinds, a 32-layer model — every stream resolves
/// exactly as in the uniform recipe (but the keys' center, which the presets have turned with
/// RoPE since), and on 30 layers some stream does not.
#[test]
fn layer_trades_apply_to_their_model_depth_only() {
    let levers = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("presets/levers");
    for name in ["rec4.25", "rec3.25", "rec2.5"] {
        let preset = Allocation::preset(name).unwrap();
        let uniform = Allocation::load(levers.join(format!("{name}-uniform.toml"))).unwrap();
        for (layers, head_dim) in [(18, 256), (32, 128), (30, 64)] {
            let mut differ = false;
            for layer in 0..layers {
                for kind in [LayerKind::Global, LayerKind::Sliding] {
                    for stream in StreamKind::BOTH {
                        // The uniform files keep the keys' first-chunk center of their day
                        // (the presets' is `rope-or-first-chunk` since session 38) and keep no
                        // heavy hitters (`rec4.25`'s since session 45).
                        let resolve = |a: &Allocation| {
                            let mut r = a
                                .resolve_stream_in(layer, kind, layers, 0, head_dim, stream)
                                .unwrap();
                            r.center = r.center.resolved(RopeBase::UNKNOWN, head_dim);
                            r.heavy_hitters = None;
                            r
                        };
                        differ |= resolve(&preset) != resolve(&uniform);
                    }
                }
            }
            assert_eq!(differ, layers == 30, "{name} on {layers} layers");
        }
    }
}
