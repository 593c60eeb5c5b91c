//! Agreement with the independent 50-digit mpmath references in `tests/data/lloyd_max.json`
//! (provenance in `tests/data/README.md`), to 1e-10 absolute as the file's
//! `target_abs_tol` asks. Observed: ≤ 5e-12 for N(0,1) at b = 8 (the problem's own
//! conditioning: the file's float64 cross-check differs by 2e-12 there), ≤ 1e-14 elsewhere.

mod common;

use common::{Quadrature, distortion_under};
use serde_json::Value;
use tq_lloyd_max::{CoordinateDistribution, LloydMaxCodebook};

const TOLERANCE: f64 = 1e-10;

fn reference() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/lloyd_max.json");
    let text = std::fs::read_to_string(path).expect("tests/data/lloyd_max.json is readable");
    serde_json::from_str(&text).expect("valid JSON")
}

fn floats(value: &Value) -> Vec<f64> {
    value
        .as_array()
        .expect("an array")
        .iter()
        .map(|v| match v {
            Value::String(s) => s.parse().expect("a decimal string"),
            other => other.as_f64().expect("a number"),
        })
        .collect()
}

fn assert_close(what: &str, ours: &[f64], theirs: &[f64]) {
    assert_eq!(ours.len(), theirs.len(), "{what}: length");
    for (k, (a, b)) in ours.iter().zip(theirs).enumerate() {
        assert!(
            (a - b).abs() <= TOLERANCE,
            "{what}[{k}]: {a} vs reference {b} (diff {:e})",
            a - b
        );
    }
}

/// Checks centroids (float and 25-digit string forms), thresholds and MSE of one entry.
fn check_entry(what: &str, codebook: &LloydMaxCodebook, entry: &Value) {
    assert_eq!(
        entry["levels"].as_u64(),
        Some(codebook.levels() as u64),
        "{what}: levels"
    );
    assert_close(
        &format!("{what} centroids"),
        codebook.centroids(),
        &floats(&entry["centroids"]),
    );
    assert_close(
        &format!("{what} centroids_str"),
        codebook.centroids(),
        &floats(&entry["centroids_str"]),
    );
    assert_close(
        &format!("{what} thresholds"),
        codebook.thresholds(),
        &floats(&entry["thresholds"]),
    );
    let mse = entry["mse_per_coord"].as_f64().expect("mse_per_coord");
    assert_close(
        &format!("{what} mse"),
        &[codebook.mse_per_coordinate()],
        &[mse],
    );
}

#[test]
fn standard_normal_b1_to_b8() {
    let reference = reference();
    let law = CoordinateDistribution::Gaussian { dim: 1 };
    for bits in 1..=8u8 {
        let entry = &reference["gaussian_N01"][format!("b{bits}")];
        let codebook = LloydMaxCodebook::new(law, bits).expect("solvable");
        check_entry(&format!("N(0,1) b={bits}"), &codebook, entry);
        // The cell probabilities check the CDF at every threshold.
        let bounds = common::cell_bounds(codebook.thresholds());
        let ours: Vec<f64> = bounds
            .windows(2)
            .map(|w| law.cdf(w[1]).expect("cdf") - law.cdf(w[0]).expect("cdf"))
            .collect();
        assert_close(
            &format!("N(0,1) b={bits} cell probabilities"),
            &ours,
            &floats(&entry["cell_probabilities"]),
        );
    }
}

#[test]
fn sphere_coordinates_d64_and_d128_b1_to_b4() {
    let reference = reference();
    for dim in [64usize, 128] {
        let block = &reference["sphere_coordinate"][format!("d{dim}")];
        assert_eq!(block["d"].as_u64(), Some(dim as u64));
        let sphere = Quadrature::new(CoordinateDistribution::Beta { dim });
        for bits in 1..=4u8 {
            let what = format!("d={dim} b={bits}");
            let entry = &block[format!("b{bits}")];
            let exact = LloydMaxCodebook::new(CoordinateDistribution::Beta { dim }, bits)
                .expect("solvable");
            check_entry(&what, &exact, entry);
            let normalized = entry["normalized_mse_d_times_mse_per_coord"]
                .as_f64()
                .expect("number");
            assert_close(
                &format!("{what} d·C"),
                &[exact.unit_vector_distortion()],
                &[normalized],
            );
            // The Gaussian limit N(0, 1/d) codebook, and its distortion on the exact law.
            let limit = LloydMaxCodebook::new(CoordinateDistribution::Gaussian { dim }, bits)
                .expect("solvable");
            assert_close(
                &format!("{what} N(0,1/d) centroids"),
                limit.centroids(),
                &floats(&entry["gaussian_N(0,1/d)_centroids"]),
            );
            let mismatched =
                dim as f64 * distortion_under(&sphere, limit.centroids(), limit.thresholds());
            let expected = entry["normalized_mse_using_gaussian_codebook_on_sphere"]
                .as_f64()
                .expect("number");
            assert_close(
                &format!("{what} Gaussian codebook on the sphere"),
                &[mismatched],
                &[expected],
            );
        }
    }
}
