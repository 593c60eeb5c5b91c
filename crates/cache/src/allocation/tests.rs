//! Unit tests of the allocation module: the `heavy_hitters` stream field, from the file to the
//! [`StreamLayout`](crate::stream::StreamLayout) a cache is built with. Catches: a table that
//! rejects the field, an override that does not replace it, a factor or a stream without a
//! window accepted silently, and a sliding-window layer keeping heavy hitters.

use super::{Allocation, AllocationError, FieldProblem, LayerKind, StreamKind};
use crate::kv_cache::{KvKind, KvLayout};
use crate::token_store::Growth;

const NUM_LAYERS: usize = 4;
const HEAD_DIM: usize = 64;

fn layout(kind: KvKind) -> KvLayout {
    KvLayout {
        kv_heads: 2,
        head_dim: HEAD_DIM,
        kind,
        max_rewind: 0,
        rope_pairs: crate::basis::RopePairs::Adjacent,
        rope_base: Default::default(),
    }
}

fn growing() -> KvLayout {
    layout(KvKind::Growing {
        growth: Growth::Static { capacity: 1024 },
    })
}

fn sliding() -> KvLayout {
    layout(KvKind::Sliding { window: 512 })
}

/// The heavy-hitter factor of every KV head of `layer`'s `stream` (all heads must agree).
fn factor(a: &Allocation, layer: usize, layout: &KvLayout, stream: StreamKind) -> Option<f32> {
    let layouts = a.stream_layouts(layer, NUM_LAYERS, layout, stream).unwrap();
    assert_eq!(layouts.len(), layout.kv_heads);
    let first = layouts[0].heavy_hitters;
    assert!(layouts.iter().all(|l| l.heavy_hitters == first));
    first
}

/// The field error of `result`, which must be one.
fn field_error<T: std::fmt::Debug>(result: Result<T, AllocationError>) -> (String, FieldProblem) {
    match result {
        Err(AllocationError::Field { path, problem }) => (path, problem),
        other => panic!("expected a field error, got {other:?}"),
    }
}

fn resolve(
    a: &Allocation,
    kind: LayerKind,
    stream: StreamKind,
) -> Result<Option<f32>, AllocationError> {
    a.resolve_stream_in(1, kind, NUM_LAYERS, 0, HEAD_DIM, stream)
        .map(|r| r.heavy_hitters)
}

#[test]
fn allocation_heavy_hitters_parse_into_stream_layouts() {
    // The example of the docs: the factor in the base table, with the stream's own window.
    let base = Allocation::from_toml_str(
        r#"
        name = "hh"
        key = { codec = "mse", bits = 4, recent_fp_tokens = 256, heavy_hitters = 8.0 }
        value = { codec = "mse", bits = 3 }
        "#,
    )
    .unwrap();
    for layer in 0..NUM_LAYERS {
        assert_eq!(factor(&base, layer, &growing(), StreamKind::Key), Some(8.0));
        assert_eq!(factor(&base, layer, &growing(), StreamKind::Value), None);
    }

    // Per layer through overrides, keys and values; a later override replaces the factor
    // (an integer is a factor too), and writing the file out and back keeps every one.
    let a = Allocation::from_toml_str(
        r#"
        name = "hh-layer"
        recent_fp_tokens = 64
        key = { codec = "mse", bits = 4 }
        value = { codec = "mse", bits = 3 }
        [[override]]
        layers = [1, 2]
        key = { heavy_hitters = 8.0 }
        value = { heavy_hitters = 4 }
        [[override]]
        layers = [2]
        key = { heavy_hitters = 2.5 }
        "#,
    )
    .unwrap();
    let again = Allocation::from_toml_str(&a.to_toml_string().unwrap()).unwrap();
    assert_eq!(again, a);
    for a in [&a, &again] {
        let at = |layer, stream| factor(a, layer, &growing(), stream);
        assert_eq!(at(0, StreamKind::Key), None);
        assert_eq!(at(0, StreamKind::Value), None);
        assert_eq!(at(1, StreamKind::Key), Some(8.0));
        assert_eq!(at(1, StreamKind::Value), Some(4.0));
        assert_eq!(at(2, StreamKind::Key), Some(2.5));
        assert_eq!(at(2, StreamKind::Value), Some(4.0));
        assert_eq!(at(3, StreamKind::Key), None);
    }

    // Per KV head, by layer kind, by model depth and in [boundary]: accepted wherever the
    // other stream fields are.
    let a = Allocation::from_toml_str(
        r#"
        name = "hh-tables"
        key = { codec = "mse", bits = 4, recent_fraction = 0.125 }
        value = { codec = "mse", bits = 3, recent_fp_tokens = 32 }
        [boundary]
        layers = 1
        value = { heavy_hitters = 3.0 }
        [[override]]
        layer_kind = "global"
        model_layers = 4
        heads = [1]
        key = { heavy_hitters = 6.0 }
        "#,
    )
    .unwrap();
    let key = |head| {
        a.resolve_stream_in(
            1,
            LayerKind::Global,
            NUM_LAYERS,
            head,
            HEAD_DIM,
            StreamKind::Key,
        )
        .unwrap()
        .heavy_hitters
    };
    assert_eq!((key(0), key(1)), (None, Some(6.0)));
    assert_eq!(factor(&a, 0, &growing(), StreamKind::Value), Some(3.0));
    assert_eq!(factor(&a, 1, &growing(), StreamKind::Value), None);
    assert_eq!(factor(&a, 3, &growing(), StreamKind::Value), Some(3.0));
}

#[test]
fn allocation_heavy_hitters_factor_must_be_finite_and_positive() {
    for bad in ["0.0", "0", "-1.0", "nan", "inf", "-inf", "1e300", "1e-50"] {
        let text = format!(
            r#"
            name = "hh-bad"
            recent_fp_tokens = 64
            key = {{ codec = "mse", bits = 4 }}
            value = {{ codec = "mse", bits = 3 }}
            [[override]]
            layers = [1]
            value = {{ heavy_hitters = {bad} }}
            "#
        );
        let (path, problem) = field_error(Allocation::from_toml_str(&text));
        assert_eq!(path, "override[0].value.heavy_hitters", "{bad}");
        assert!(
            matches!(problem, FieldProblem::BadHeavyHitters { .. }),
            "{bad}: {problem:?}"
        );
        let message = AllocationError::field(path, problem).to_string();
        assert!(message.contains("must be finite and > 0"), "{message}");
    }
    // In the base table the path is the base's.
    let (path, problem) = field_error(Allocation::from_toml_str(
        r#"
        name = "hh-bad"
        recent_fp_tokens = 64
        key = { codec = "mse", bits = 4, heavy_hitters = -2.0 }
        value = { codec = "mse", bits = 3 }
        "#,
    ));
    assert_eq!(path, "key.heavy_hitters");
    assert_eq!(problem, FieldProblem::BadHeavyHitters { value: -2.0 });
}

#[test]
fn allocation_heavy_hitters_need_a_recent_window() {
    // No window anywhere: the load-time check cannot know the layer kinds, resolving can.
    let a = Allocation::from_toml_str(
        r#"
        name = "hh-no-window"
        key = { codec = "mse", bits = 4, heavy_hitters = 8.0 }
        value = { codec = "mse", bits = 3 }
        "#,
    )
    .unwrap();
    let (path, problem) = field_error(resolve(&a, LayerKind::Global, StreamKind::Key));
    assert_eq!(path, "key.heavy_hitters");
    assert_eq!(problem, FieldProblem::HeavyHittersWithoutWindow);
    let message = AllocationError::field(path, problem).to_string();
    assert!(
        message.contains("heavy_hitters needs a recent window"),
        "{message}"
    );
    assert!(
        field_error(a.stream_layouts(1, NUM_LAYERS, &growing(), StreamKind::Key)).1
            == FieldProblem::HeavyHittersWithoutWindow
    );
    assert_eq!(
        resolve(&a, LayerKind::Global, StreamKind::Value).unwrap(),
        None
    );

    // An override that closes the window of a layer: the error names where the factor is.
    let a = Allocation::from_toml_str(
        r#"
        name = "hh-closed"
        recent_fp_tokens = 64
        key = { codec = "mse", bits = 4 }
        value = { codec = "mse", bits = 3 }
        [[override]]
        layers = [1]
        value = { heavy_hitters = 8.0 }
        [[override]]
        layers = [1]
        value = { recent_fp_tokens = 0, recent_fraction = 0.0 }
        "#,
    )
    .unwrap();
    let (path, problem) = field_error(resolve(&a, LayerKind::Global, StreamKind::Value));
    assert_eq!(path, "override[0].value.heavy_hitters");
    assert_eq!(problem, FieldProblem::HeavyHittersWithoutWindow);

    // A fraction alone is a window; so is the top-level count.
    for window in ["recent_fraction = 0.0625", "recent_fp_tokens = 16"] {
        let a = Allocation::from_toml_str(&format!(
            r#"
            name = "hh-window"
            {window}
            key = {{ codec = "mse", bits = 4, heavy_hitters = 8.0 }}
            value = {{ codec = "mse", bits = 3 }}
            "#
        ))
        .unwrap();
        assert_eq!(
            resolve(&a, LayerKind::Global, StreamKind::Key).unwrap(),
            Some(8.0)
        );
    }
}

#[test]
fn allocation_heavy_hitters_resolve_to_none_on_sliding_layers() {
    // With a window and without one: sliding-window layers ignore windows, and heavy hitters.
    for window in ["", "recent_fp_tokens = 64"] {
        let a = Allocation::from_toml_str(&format!(
            r#"
            name = "hh-sliding"
            {window}
            key = {{ codec = "mse", bits = 4, heavy_hitters = 8.0 }}
            value = {{ codec = "mse", bits = 3, heavy_hitters = 4.0 }}
            "#
        ))
        .unwrap();
        for stream in StreamKind::BOTH {
            assert_eq!(resolve(&a, LayerKind::Sliding, stream).unwrap(), None);
            for layer in 0..NUM_LAYERS {
                assert_eq!(factor(&a, layer, &sliding(), stream), None);
            }
        }
    }
    // A factor given only to sliding layers by kind resolves to none too.
    let a = Allocation::from_toml_str(
        r#"
        name = "hh-sliding-kind"
        key = { codec = "mse", bits = 4 }
        value = { codec = "mse", bits = 3 }
        [[override]]
        layer_kind = "sliding"
        key = { heavy_hitters = 8.0 }
        "#,
    )
    .unwrap();
    assert_eq!(
        resolve(&a, LayerKind::Sliding, StreamKind::Key).unwrap(),
        None
    );
    assert_eq!(
        resolve(&a, LayerKind::Global, StreamKind::Key).unwrap(),
        None
    );
}

#[test]
fn allocation_heavy_hitters_need_a_quantized_whole_stream() {
    // A full-precision body has nothing to keep.
    let (path, problem) = field_error(Allocation::from_toml_str(
        r#"
        name = "hh-f16"
        recent_fp_tokens = 64
        key = { codec = "f16", heavy_hitters = 8.0 }
        value = { codec = "mse", bits = 3 }
        "#,
    ));
    assert_eq!(path, "key.heavy_hitters");
    assert!(
        matches!(problem, FieldProblem::NothingToKeep { .. }),
        "{problem:?}"
    );
    let message = AllocationError::field(path, problem).to_string();
    assert!(
        message.contains("nothing to keep: the body is full precision"),
        "{message}"
    );

    // A patch switching to f16 drops the inherited factor, as it drops the codes.
    let a = Allocation::from_toml_str(
        r#"
        name = "hh-switch"
        recent_fp_tokens = 64
        key = { codec = "mse", bits = 4, heavy_hitters = 8.0 }
        value = { codec = "mse", bits = 3 }
        [[override]]
        layers = [1]
        key = { codec = "f16" }
        "#,
    )
    .unwrap();
    assert_eq!(factor(&a, 0, &growing(), StreamKind::Key), Some(8.0));
    assert_eq!(factor(&a, 1, &growing(), StreamKind::Key), None);

    // A setting of the whole stream: not in [outliers].
    let (path, problem) = field_error(Allocation::from_toml_str(
        r#"
        name = "hh-outliers"
        recent_fp_tokens = 64
        key = { codec = "mse", bits = 4 }
        value = { codec = "mse", bits = 3 }
        [outliers]
        channels = 8
        key = { heavy_hitters = 8.0 }
        "#,
    ));
    assert_eq!(path, "outliers.key.heavy_hitters");
    assert_eq!(problem, FieldProblem::WholeStreamOnly);
}
