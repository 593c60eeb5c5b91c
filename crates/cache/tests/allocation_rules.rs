//! The resolution order documented in `tq_cache::allocation`: base, boundary, overrides in file
//! order (later wins, field by field), defaults last, then the outlier split. Catches rules
//! applied in the wrong order, negative indices counted wrongly, head filters ignored, and
//! inherited settings leaking across a codec switch.

mod common;

use tq_cache::CodecSpec;
use tq_cache::allocation::{Allocation, LayerKind, StreamKind, StreamPlan};
use tq_cache::basis::BasisPolicy;
use tq_cache::codec::{MseSpec, ProdSpec};
use tq_qjl::{SketchKind, SketchScale};
use tq_rotation::RotationKind;

const LAYERS: usize = 30;
const DIM: usize = 64;

fn parse(text: &str) -> Allocation {
    Allocation::from_toml_str(text).unwrap_or_else(|e| panic!("{e}"))
}

fn single(allocation: &Allocation, layer: usize, head: usize, stream: StreamKind) -> CodecSpec {
    match allocation
        .resolve(layer, LAYERS, head, DIM, stream)
        .unwrap()
    {
        StreamPlan::Single(spec) => spec,
        other => panic!("expected one codec, got {other:?}"),
    }
}

fn mse(spec: CodecSpec) -> MseSpec {
    match spec {
        CodecSpec::Mse(s) => s,
        other => panic!("expected mse, got {other:?}"),
    }
}

fn prod(spec: CodecSpec) -> ProdSpec {
    match spec {
        CodecSpec::Prod(s) => s,
        other => panic!("expected prod, got {other:?}"),
    }
}

const BASE: &str = r#"
name = "rules"
key = { codec = "mse", bits = 4 }
value = { codec = "mse", bits = 3 }
"#;

#[test]
fn defaults_fill_what_the_file_leaves_out() {
    let a = parse(BASE);
    assert_eq!(a.seed, tq_cache::allocation::DEFAULT_SEED);
    assert_eq!((a.recent_fp_tokens, a.sink_tokens), (0, 0));
    assert_eq!(a.fp_codec(DIM), CodecSpec::F16 { dim: DIM });
    let k = mse(single(&a, 0, 0, StreamKind::Key));
    assert_eq!((k.dim, k.bits), (DIM, 4));
    assert_eq!(k.rotation, RotationKind::Hadamard);
    assert!(!k.norm_correction);
    assert_eq!(mse(single(&a, 0, 0, StreamKind::Value)).bits, 3);

    let p = parse(
        r#"name = "p"
           key = { codec = "prod", bits = 5 }
           value = { codec = "prod", bits = 3, qjl = "gaussian" }"#,
    );
    let k = prod(single(&p, 0, 0, StreamKind::Key));
    assert_eq!(k.sketch.kind, SketchKind::Haar);
    assert_eq!(k.sketch.scale, SketchScale::Exact);
    assert_eq!(k.sketch.shrinkage, 1.0);
    assert_eq!(k.sketch.dim, DIM);
    let v = prod(single(&p, 0, 0, StreamKind::Value));
    assert_eq!(
        v.sketch.scale,
        SketchScale::Paper,
        "paper scale for a Gaussian sketch"
    );
}

#[test]
fn top_level_fields_are_read() {
    let a = parse(
        r#"name = "fp"
           description = "windows"
           seed = 99
           recent_fp_tokens = 128
           sink_tokens = 4
           fp_dtype = "f32"
           key = { codec = "f16" }
           value = { codec = "f32" }"#,
    );
    assert_eq!(a.seed, 99);
    assert_eq!((a.recent_fp_tokens, a.sink_tokens), (128, 4));
    assert_eq!(a.fp_codec(DIM), CodecSpec::F32 { dim: DIM });
    assert_eq!(
        single(&a, 0, 0, StreamKind::Value),
        CodecSpec::F32 { dim: DIM }
    );
}

#[test]
fn overrides_select_layers_with_negative_indices_from_the_end() {
    let a = parse(&format!(
        "{BASE}
        [[override]]
        layers = [0, 1, -2, -1]
        key = {{ codec = \"f16\" }}"
    ));
    for layer in [0, 1, 28, 29] {
        assert_eq!(
            single(&a, layer, 0, StreamKind::Key),
            CodecSpec::F16 { dim: DIM }
        );
        // The value stream is not named by the override.
        assert_eq!(mse(single(&a, layer, 0, StreamKind::Value)).bits, 3);
    }
    for layer in [2, 15, 27] {
        assert_eq!(mse(single(&a, layer, 0, StreamKind::Key)).bits, 4);
    }
    // The same file fits a shallower model: -1 is now layer 11.
    let plan = a.resolve(11, 12, 0, DIM, StreamKind::Key).unwrap();
    assert_eq!(plan.single(), Some(&CodecSpec::F16 { dim: DIM }));
}

#[test]
fn overrides_can_be_limited_to_heads() {
    let a = parse(&format!(
        "{BASE}
        [[override]]
        layers = [5]
        heads = [1]
        value = {{ bits = 8 }}"
    ));
    assert_eq!(mse(single(&a, 5, 1, StreamKind::Value)).bits, 8);
    assert_eq!(mse(single(&a, 5, 0, StreamKind::Value)).bits, 3);
    assert_eq!(mse(single(&a, 5, 2, StreamKind::Value)).bits, 3);
    assert_eq!(mse(single(&a, 6, 1, StreamKind::Value)).bits, 3);
}

#[test]
fn boundary_covers_the_first_and_last_layers() {
    let a = parse(&format!(
        "{BASE}
        [boundary]
        layers = 2
        key = {{ bits = 6 }}"
    ));
    let bits: Vec<u8> = (0..LAYERS)
        .map(|l| mse(single(&a, l, 0, StreamKind::Key)).bits)
        .collect();
    let mut expected = vec![4; LAYERS];
    for l in [0, 1, 28, 29] {
        expected[l] = 6;
    }
    assert_eq!(bits, expected);
    // Shallower than 2·N: every layer is a boundary layer.
    let plan = a.resolve(1, 3, 0, DIM, StreamKind::Key).unwrap();
    assert_eq!(mse(*plan.single().unwrap()).bits, 6);
}

#[test]
fn later_rules_win_field_by_field_and_overrides_beat_boundary() {
    let a = parse(&format!(
        "{BASE}
        [boundary]
        layers = 1
        key = {{ bits = 6, rotation = \"haar\" }}
        [[override]]
        layers = [0, 10]
        key = {{ bits = 7 }}
        [[override]]
        layers = [10]
        key = {{ bits = 2, norm_correction = true }}"
    ));
    // Layer 0: boundary (6, haar), then override 0 (bits 7): rotation from the boundary stays.
    let k0 = mse(single(&a, 0, 0, StreamKind::Key));
    assert_eq!(
        (k0.bits, k0.rotation, k0.norm_correction),
        (7, RotationKind::Haar, false)
    );
    // Layer 10: override 0 then override 1, which wins on bits and adds norm correction.
    let k10 = mse(single(&a, 10, 0, StreamKind::Key));
    assert_eq!(
        (k10.bits, k10.rotation, k10.norm_correction),
        (2, RotationKind::Hadamard, true)
    );
    // Layer 29: boundary only.
    assert_eq!(mse(single(&a, 29, 0, StreamKind::Key)).bits, 6);
}

#[test]
fn switching_codec_drops_settings_the_new_codec_cannot_use() {
    let a = parse(
        r#"name = "switch"
           key = { codec = "prod", bits = 5, qjl = "gaussian", shrinkage = 0.7, rotation = "haar" }
           value = { codec = "mse", bits = 4 }
           [[override]]
           layers = [0]
           key = { codec = "f16" }
           [[override]]
           layers = [1]
           key = { codec = "mse" }
           [[override]]
           layers = [2]
           key = { qjl = "haar" }"#,
    );
    assert_eq!(
        single(&a, 0, 0, StreamKind::Key),
        CodecSpec::F16 { dim: DIM }
    );
    // prod → mse keeps bits and rotation, drops the sketch settings.
    let k1 = mse(single(&a, 1, 0, StreamKind::Key));
    assert_eq!((k1.bits, k1.rotation), (5, RotationKind::Haar));
    // qjl switched to haar: the scale default follows the new sketch; shrinkage stays.
    let k2 = prod(single(&a, 2, 0, StreamKind::Key));
    assert_eq!(k2.sketch.kind, SketchKind::Haar);
    assert_eq!(k2.sketch.scale, SketchScale::Exact);
    assert_eq!(k2.sketch.shrinkage, 0.7);
}

#[test]
fn outliers_split_only_named_quantized_streams() {
    let a = parse(
        r#"name = "tiers"
           key = { codec = "mse", bits = 3 }
           value = { codec = "mse", bits = 2 }
           [[override]]
           layers = [-1]
           key = { codec = "f16" }
           [outliers]
           channels = 8
           key = { bits = 5, codec = "prod", qjl = "haar" }"#,
    );
    let plan = a.resolve(0, LAYERS, 0, DIM, StreamKind::Key).unwrap();
    let tiers = plan.two_tier().unwrap();
    assert_eq!(tiers.channels, 8);
    let outlier = prod(tiers.outlier);
    assert_eq!((outlier.dim, outlier.bits, outlier.sketch.dim), (8, 5, 8));
    let rest = mse(tiers.rest);
    assert_eq!((rest.dim, rest.bits), (56, 3));
    // Values are not named in [outliers]: one codec.
    assert!(
        a.resolve(0, LAYERS, 0, DIM, StreamKind::Value)
            .unwrap()
            .single()
            .is_some()
    );
    // The last layer's keys are f16: never split.
    assert_eq!(
        single(&a, 29, 0, StreamKind::Key),
        CodecSpec::F16 { dim: DIM }
    );
}

#[test]
fn outlier_fraction_scales_with_head_dim() {
    let a = parse(&format!(
        "{BASE}
        [outliers]
        fraction = 0.1
        value = {{}}"
    ));
    for (head_dim, k) in [(64, 6), (128, 13), (96, 10)] {
        let plan = a
            .resolve(0, LAYERS, 0, head_dim, StreamKind::Value)
            .unwrap();
        assert_eq!(plan.two_tier().unwrap().channels, k, "d = {head_dim}");
        assert_eq!(plan.head_dim(), head_dim);
    }
}

#[test]
fn partial_allocations_round_trip_through_toml() {
    let a = parse(
        r#"name = "everything"
           description = "all the tables"
           seed = 7
           recent_fp_tokens = 64
           sink_tokens = 4
           key = { codec = "prod", bits = 5, qjl = "haar", scale = "asymptotic", shrinkage = 0.7 }
           value = { codec = "debiased-mse", bits = 4, norm_correction = true }
           [boundary]
           layers = 2
           value = { bits = 6 }
           [[override]]
           layers = [0, -1]
           heads = [0, 2]
           key = { codec = "f16" }
           [[override]]
           layers = [3]
           value = { rotation = "haar" }
           [outliers]
           fraction = 0.25
           key = { bits = 6 }
           value = {}"#,
    );
    let text = a.to_toml_string().unwrap();
    let back = Allocation::from_toml_str(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(back, a, "{text}");
    // Not-given fields stay not given: no default is written out.
    assert!(!text.contains("rotation = \"hadamard\""), "{text}");
}

#[test]
fn validate_for_checks_heads_against_the_model() {
    let a = parse(&format!(
        "{BASE}
        [[override]]
        layers = [0]
        heads = [0, 3]
        key = {{ bits = 5 }}"
    ));
    let four = tq_cache::allocation::ModelShape {
        num_layers: LAYERS,
        num_kv_heads: 4,
        head_dim: DIM,
    };
    a.validate_for(&four).unwrap();
    let three = tq_cache::allocation::ModelShape {
        num_kv_heads: 3,
        ..four
    };
    let err = a.validate_for(&three).unwrap_err().to_string();
    assert_eq!(
        err,
        "`override[0].heads[1]`: KV head 3 is out of range for a model with 3 KV heads"
    );
}

/// The codec of `layer`'s keys on head 0 when the layer is of `kind`.
fn key_codec_as(allocation: &Allocation, layer: usize, kind: LayerKind) -> CodecSpec {
    match allocation
        .resolve_stream_in(layer, kind, LAYERS, 0, DIM, StreamKind::Key)
        .unwrap()
        .plan
    {
        StreamPlan::Single(spec) => spec,
        other => panic!("expected one codec, got {other:?}"),
    }
}

/// `layer_kind` alone selects every layer of that kind and no other; with `layers`, only the
/// listed layers of that kind; a later index rule still wins over an earlier kind rule.
#[test]
fn layer_kind_selects_by_kind_and_intersects_with_layers() {
    let a = parse(
        r#"name = "kinds"
           key = { codec = "mse", bits = 4 }
           value = { codec = "mse", bits = 4 }
           [[override]]
           layer_kind = "sliding"
           key = { codec = "f16" }
           [[override]]
           layers = [2, 3]
           layer_kind = "global"
           key = { bits = 6 }
           [[override]]
           layers = [7]
           key = { codec = "mse", bits = 2 }"#,
    );
    let f16 = CodecSpec::F16 { dim: DIM };
    for layer in [0, 2, 3, 29] {
        assert_eq!(
            key_codec_as(&a, layer, LayerKind::Sliding),
            f16,
            "layer {layer}"
        );
    }
    // The index rule comes after the kind rule: it switches layer 7 back to mse.
    assert_eq!(mse(key_codec_as(&a, 7, LayerKind::Sliding)).bits, 2);
    assert_eq!(mse(key_codec_as(&a, 0, LayerKind::Global)).bits, 4);
    assert_eq!(mse(key_codec_as(&a, 2, LayerKind::Global)).bits, 6);
    assert_eq!(mse(key_codec_as(&a, 3, LayerKind::Global)).bits, 6);
    assert_eq!(mse(key_codec_as(&a, 4, LayerKind::Global)).bits, 4);
    assert_eq!(mse(key_codec_as(&a, 7, LayerKind::Global)).bits, 2);
    // `resolve` is the global view.
    assert_eq!(
        single(&a, 2, 0, StreamKind::Key),
        key_codec_as(&a, 2, LayerKind::Global)
    );
    // Values are not touched by any rule.
    let v = a
        .resolve_stream_in(0, LayerKind::Sliding, LAYERS, 0, DIM, StreamKind::Value)
        .unwrap();
    assert_eq!(v.plan.bytes_per_token(), DIM * 4 / 8 + 2);
}

#[test]
fn a_rule_must_select_layers_and_kinds_are_spelled_out() {
    let none = Allocation::from_toml_str(&format!(
        "{BASE}
        [[override]]
        key = {{ bits = 5 }}"
    ))
    .unwrap_err()
    .to_string();
    assert!(
        none.starts_with("`override[0].layers`: selects no layer") && none.contains("layer_kind"),
        "{none}"
    );
    let typo = Allocation::from_toml_str(&format!(
        "{BASE}
        [[override]]
        layer_kind = \"local\"
        key = {{ bits = 5 }}"
    ))
    .unwrap_err()
    .to_string();
    assert!(
        typo.contains("layer_kind") && typo.contains("sliding"),
        "{typo}"
    );
    let a = parse(&format!(
        "{BASE}
        [[override]]
        layer_kind = \"sliding\"
        layers = [1, -1]
        key = {{ codec = \"f16\" }}"
    ));
    let text = a.to_toml_string().unwrap();
    assert!(text.contains("layer_kind = \"sliding\""), "{text}");
    assert_eq!(parse(&text), a);
}

/// The shipped `-global` presets leave sliding layers in f16 and, on global layers, are the
/// codecs and centering their base presets had before the step window (kept as the lever files
/// `k5v3-cs4-planes` and `k4v2-cs4`; without the former's plane basis), with which the Gemma 3
/// long-context grid was measured.
#[test]
fn global_presets_compress_only_global_layers() {
    let lever = |file: &str| {
        let path = format!("{}/presets/levers/{file}", env!("CARGO_MANIFEST_DIR"));
        Allocation::from_toml_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    };
    for (name, base) in [
        ("rec4.25-global", lever("k5v3-cs4-planes.toml")),
        ("rec3.25-global", lever("k4v2-cs4.toml")),
    ] {
        let a = Allocation::preset(name).unwrap();
        assert_eq!(a.sink_tokens, base.sink_tokens, "{name}");
        assert_eq!(a.recent_fp_tokens, base.recent_fp_tokens, "{name}");
        for layer in [0, 5, 17] {
            for stream in StreamKind::BOTH {
                let at = |x: &Allocation, kind| {
                    x.resolve_stream_in(layer, kind, 18, 0, 256, stream)
                        .unwrap()
                };
                let (global, base) = (at(&a, LayerKind::Global), at(&base, LayerKind::Global));
                assert_eq!(
                    (global.plan, global.center),
                    (base.plan, base.center),
                    "{name}"
                );
                assert_eq!(global.basis, BasisPolicy::None, "{name}");
                assert_eq!(
                    at(&a, LayerKind::Sliding).plan,
                    StreamPlan::Single(CodecSpec::F16 { dim: 256 }),
                    "{name}"
                );
            }
        }
    }
}

/// `k6v5-global` is, on global layers, keys TQ_mse 6 and values TQ_mse 5, centered, with 4 f16
/// sinks — what its file says without the override — and f16 on sliding layers.
#[test]
fn k6v5_global_is_six_and_five_bits_on_global_layers() {
    let a = Allocation::preset("k6v5-global").unwrap();
    let base = parse(
        r#"
        name = "k6v5-global"
        sink_tokens = 4
        key = { codec = "mse", bits = 6, center = "first-chunk" }
        value = { codec = "mse", bits = 5, center = "first-chunk" }
        "#,
    );
    assert_eq!(a.sink_tokens, 4);
    for layer in [0, 5, 17] {
        for stream in StreamKind::BOTH {
            let at = |x: &Allocation, kind| {
                x.resolve_stream_in(layer, kind, 18, 0, 256, stream)
                    .unwrap()
            };
            assert_eq!(at(&a, LayerKind::Global), at(&base, LayerKind::Global));
            assert_eq!(
                at(&a, LayerKind::Sliding).plan,
                StreamPlan::Single(CodecSpec::F16 { dim: 256 })
            );
        }
    }
}

/// A stream's own `recent_fp_tokens` replaces the top-level window for the streams its table
/// applies to (layer, head, stream), survives a codec switch, reaches the stream layouts and
/// the bytes a cache holds, and is refused in `[outliers]` (the window holds whole vectors).
#[test]
fn a_stream_can_have_a_window_of_its_own() {
    use tq_cache::allocation::{AllocationError, FieldProblem};
    use tq_cache::kv_cache::{KvCache, KvLayout};
    let a = parse(
        r#"
name = "windows"
recent_fp_tokens = 16
sink_tokens = 2
key = { codec = "mse", bits = 4 }
value = { codec = "mse", bits = 3, recent_fp_tokens = 4 }

[[override]]
layers = [10]
heads = [1]
key = { recent_fp_tokens = 120 }

[[override]]
layers = [10]
key = { codec = "f16" }
"#,
    );
    let window = |layer, head, stream| {
        a.resolve_stream(layer, LAYERS, head, DIM, stream)
            .unwrap()
            .recent
            .tokens_at(2048)
    };
    assert_eq!(window(10, 1, StreamKind::Key), 120);
    assert_eq!(window(10, 0, StreamKind::Key), 16);
    assert_eq!(window(3, 1, StreamKind::Key), 16);
    assert_eq!(window(10, 1, StreamKind::Value), 4);
    assert_eq!(window(3, 0, StreamKind::Value), 4);
    assert_eq!(a.longest_recent_window(2048), 120);

    let layout = KvLayout {
        max_rewind: 3,
        ..common::growing(2, DIM)
    };
    let cache = KvCache::with_allocation(layout, &a, 10, LAYERS).unwrap();
    let f16_token = 2 * DIM;
    // Sinks plus the window's ring (window + max_rewind slots), binary16 copies.
    assert_eq!(cache.keys(1).fixed_bytes(), (2 + 120 + 3) * f16_token);
    assert_eq!(cache.keys(0).fixed_bytes(), (2 + 16 + 3) * f16_token);
    let value = cache.values(0);
    assert_eq!(value.layout().recent_tokens, 4);
    assert_eq!(value.fixed_bytes(), (2 + 4 + 3) * f16_token);

    let outliers = format!("{BASE}[outliers]\nchannels = 8\nkey = {{ recent_fp_tokens = 3 }}");
    match Allocation::from_toml_str(&outliers) {
        Err(AllocationError::Field { path, problem }) => {
            assert_eq!(path, "outliers.key.recent_fp_tokens");
            assert_eq!(problem, FieldProblem::WholeStreamOnly);
        }
        other => panic!("expected a field error, got {other:?}"),
    }
}

#[test]
fn model_layers_gates_a_rule_to_one_model_depth() {
    let a = parse(&format!(
        "{BASE}
        [[override]]
        model_layers = {LAYERS}
        layers = [2, -1]
        key = {{ bits = 5 }}

        [[override]]
        model_layers = 18
        value = {{ bits = 2 }}"
    ));
    // In a model of LAYERS layers the first rule applies to its layers, the second to none.
    for layer in 0..LAYERS {
        let want = if layer == 2 || layer == LAYERS - 1 {
            5
        } else {
            4
        };
        assert_eq!(
            mse(single(&a, layer, 0, StreamKind::Key)).bits,
            want,
            "layer {layer}"
        );
        assert_eq!(
            mse(single(&a, layer, 0, StreamKind::Value)).bits,
            3,
            "layer {layer}"
        );
    }
    // In an 18-layer model the first rule selects nothing (its -1 is not layer 17), the
    // second (no `layers`) selects every layer.
    for layer in 0..18 {
        let key = a.resolve(layer, 18, 0, DIM, StreamKind::Key).unwrap();
        let value = a.resolve(layer, 18, 0, DIM, StreamKind::Value).unwrap();
        assert_eq!(mse(key.single().cloned().unwrap()).bits, 4, "layer {layer}");
        assert_eq!(
            mse(value.single().cloned().unwrap()).bits,
            2,
            "layer {layer}"
        );
    }
    // Another depth still validates: a gated rule's layer numbers are not checked there.
    let shape = |num_layers| tq_cache::allocation::ModelShape {
        num_layers,
        num_kv_heads: 2,
        head_dim: DIM,
    };
    a.validate_for(&shape(2)).unwrap();
    a.validate_for(&shape(LAYERS)).unwrap();
    // And a file round trip keeps the gate.
    let back = parse(&a.to_toml_string().unwrap());
    assert_eq!(back, a);
}
