//! Serde round trips and the process-wide cache.

use std::sync::Arc;

use serde_json::Value;
use tq_lloyd_max::{CoordinateDistribution, LloydMaxCodebook, LloydMaxError};

#[test]
fn json_round_trip_gives_an_identical_working_codebook() {
    for (law, bits) in [
        (CoordinateDistribution::Beta { dim: 128 }, 3u8),
        (CoordinateDistribution::Beta { dim: 3 }, 8),
        (CoordinateDistribution::Gaussian { dim: 64 }, 1),
        (CoordinateDistribution::Gaussian { dim: 1 }, 6),
    ] {
        let original = LloydMaxCodebook::new(law, bits).expect("solvable");
        let json = serde_json::to_string(&original).expect("serializable");
        let restored: LloydMaxCodebook = serde_json::from_str(&json).expect("deserializable");
        // PartialEq covers every field, including the rebuilt f32 tables.
        assert_eq!(restored, original);
        assert_eq!(restored.centroids_f32(), original.centroids_f32());
        assert_eq!(restored.thresholds_f32(), original.thresholds_f32());
        let xs: Vec<f32> = (-400..=400)
            .map(|i| i as f32 * 0.01 * law.std_dev() as f32)
            .collect();
        let (mut a, mut b) = (vec![0u8; xs.len()], vec![0u8; xs.len()]);
        original.quantize_slice(&xs, &mut a).expect("same length");
        restored.quantize_slice(&xs, &mut b).expect("same length");
        assert_eq!(a, b);
        for code in 0..=255u8 {
            assert_eq!(original.dequantize(code), restored.dequantize(code));
        }
    }
}

#[test]
fn serialized_form_holds_only_the_f64_data() {
    let codebook =
        LloydMaxCodebook::new(CoordinateDistribution::Beta { dim: 64 }, 2).expect("solvable");
    let value = serde_json::to_value(&codebook).expect("serializable");
    let mut keys: Vec<&str> = value
        .as_object()
        .expect("an object")
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    // Thresholds and f32 tables are derived on deserialization.
    assert_eq!(
        keys,
        ["bits", "centroids", "distribution", "mse_per_coordinate"]
    );
    assert_eq!(
        value["distribution"],
        serde_json::json!({ "kind": "beta", "dim": 64 })
    );
}

/// An edit of a serialized codebook.
type Edit = Box<dyn FnOnce(&mut Value)>;

fn tampered(edit: impl FnOnce(&mut Value)) -> Result<LloydMaxCodebook, String> {
    let codebook =
        LloydMaxCodebook::new(CoordinateDistribution::Beta { dim: 64 }, 2).expect("solvable");
    let mut value = serde_json::to_value(&codebook).expect("serializable");
    edit(&mut value);
    serde_json::from_value(value).map_err(|e| e.to_string())
}

#[test]
fn deserialization_rechecks_the_invariants() {
    assert!(tampered(|_| {}).is_ok());
    let cases: [(&str, Edit); 7] = [
        (
            "strictly increasing",
            Box::new(|v| v["centroids"][1] = v["centroids"][0].clone()),
        ),
        (
            "strictly increasing",
            Box::new(|v| v["centroids"].as_array_mut().expect("array").swap(0, 1)),
        ),
        (
            "2^bits centroids",
            Box::new(|v| v["bits"] = serde_json::json!(3)),
        ),
        (
            "unsupported bit width",
            Box::new(|v| v["bits"] = serde_json::json!(9)),
        ),
        (
            "too small",
            Box::new(|v| v["distribution"]["dim"] = serde_json::json!(2)),
        ),
        (
            "non-negative",
            Box::new(|v| v["mse_per_coordinate"] = serde_json::json!(-1.0)),
        ),
        (
            "2^bits centroids",
            Box::new(|v| {
                v["centroids"].as_array_mut().expect("array").pop();
            }),
        ),
    ];
    for (expected, edit) in cases {
        let error = tampered(edit).expect_err(expected);
        assert!(
            error.contains(expected),
            "{error:?} should mention {expected:?}"
        );
    }
}

#[test]
fn cached_returns_the_same_arc() {
    let law = CoordinateDistribution::Beta { dim: 96 };
    let first = LloydMaxCodebook::cached(law, 5).expect("solvable");
    let second = LloydMaxCodebook::cached(law, 5).expect("solvable");
    assert!(Arc::ptr_eq(&first, &second));
    assert_eq!(*first, LloydMaxCodebook::new(law, 5).expect("solvable"));
    let other = LloydMaxCodebook::cached(law, 4).expect("solvable");
    assert!(!Arc::ptr_eq(&first, &other));
    let gaussian = LloydMaxCodebook::cached(CoordinateDistribution::Gaussian { dim: 96 }, 5)
        .expect("solvable");
    assert!(!Arc::ptr_eq(&first, &gaussian));
}

#[test]
fn cached_is_shared_across_threads() {
    let law = CoordinateDistribution::Beta { dim: 200 };
    let handles: Vec<_> = (0..4)
        .map(|_| std::thread::spawn(move || LloydMaxCodebook::cached(law, 6)))
        .collect();
    let codebooks: Vec<Arc<LloydMaxCodebook>> = handles
        .into_iter()
        .map(|h| h.join().expect("no panic").expect("solvable"))
        .collect();
    for codebook in &codebooks[1..] {
        assert!(Arc::ptr_eq(&codebooks[0], codebook));
    }
}

#[test]
fn cached_reports_errors_without_caching_them() {
    let law = CoordinateDistribution::Beta { dim: 2 };
    for _ in 0..2 {
        assert_eq!(
            LloydMaxCodebook::cached(law, 3).map(|_| ()),
            Err(LloydMaxError::DimensionTooSmall {
                law: "beta",
                dim: 2,
                min: 3
            })
        );
    }
}
