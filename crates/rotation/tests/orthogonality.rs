//! Π is orthogonal, its f32 inverse undoes it, it keeps norms, and the fast f32 paths agree
//! with the dense f64 matrix — for any kind, any dimension 1..=300 (powers of two and not)
//! and any seed. Every tolerance below is derived from the arithmetic, not fitted.

mod common;

use common::{UNIT_ROUNDOFF, hadamard_relative_error, norm, proptest_config, to_f32};
use proptest::prelude::*;
use tq_rotation::{Rotation, RotationKind};

/// The contract's f32 round-trip and norm tolerance (relative).
///
/// Hadamard: twice [`hadamard_relative_error`], at most `2·3·(8 + 2)·u = 3.6e-6` for
/// d ≤ 300 — a worst-case bound. Haar: each output is an in-order f32 sum of `d` products,
/// whose worst-case bound (`d^{3/2}·u ≈ 3e-4` at d = 300) needs every rounding to push the
/// same way. Under the standard model of independent rounding errors (Higham & Mary 2019)
/// the partial sums `s_k` contribute `Σ_j Σ_k s_{jk}² ≈ (d/2)·‖x‖²`, so the RMS relative
/// error of one apply is `u·√(d/6) ≈ 4.2e-7` at d = 300 and `6e-7` for the round trip:
/// 1e-5 is 17 RMS, and `‖e‖²` sums d independent coordinates, so it concentrates.
const ROUND_TRIP_TOLERANCE: f64 = 1e-5;

/// Dimensions 1..=300, a third of them powers of two (the Hadamard fast case).
fn any_dim() -> impl Strategy<Value = usize> {
    prop_oneof![
        (0u32..=8).prop_map(|k| 1usize << k),
        1usize..=300,
        1usize..=300
    ]
}

fn any_kind() -> impl Strategy<Value = RotationKind> {
    prop_oneof![Just(RotationKind::Haar), Just(RotationKind::Hadamard)]
}

/// A vector with entries spread over several orders of magnitude and both signs.
fn any_vector(dim: usize) -> impl Strategy<Value = Vec<f64>> {
    proptest::collection::vec((-1.0f64..1.0, -3i32..=3), dim)
        .prop_map(|v| v.into_iter().map(|(m, e)| m * 10f64.powi(e)).collect())
        .prop_filter("nonzero", |v: &Vec<f64>| v.iter().any(|&x| x != 0.0))
}

fn case() -> impl Strategy<Value = (RotationKind, u64, Vec<f64>)> {
    (any_kind(), any::<u64>(), any_dim())
        .prop_flat_map(|(kind, seed, dim)| (Just(kind), Just(seed), any_vector(dim)))
}

fn relative_distance(a: &[f32], b: &[f64]) -> f64 {
    let diff: Vec<f64> = a.iter().zip(b).map(|(&x, &y)| f64::from(x) - y).collect();
    norm(&diff) / norm(b)
}

proptest! {
    #![proptest_config(proptest_config(48, 0x0127_0001))]

    /// `ΠᵀΠ = I` in f64 to 1e-12. Householder QR gives `‖QᵀQ − I‖ = O(d·u₆₄) ≈ 7e-14` at
    /// d = 300; the Hadamard factors are exact up to a few roundings per entry. A wrong
    /// normalization or a missing sign layer on one side breaks it by O(1/d) or more.
    #[test]
    fn transpose_times_matrix_is_the_identity(
        kind in any_kind(), seed in any::<u64>(), dim in any_dim(),
    ) {
        let pi = Rotation::new(kind, dim, seed).unwrap().to_dense_f64();
        prop_assert_eq!(pi.len(), dim * dim);
        let mut worst = 0.0f64;
        for i in 0..dim {
            for j in i..dim {
                let dot: f64 = (0..dim).map(|k| pi[k * dim + i] * pi[k * dim + j]).sum();
                let target = if i == j { 1.0 } else { 0.0 };
                worst = worst.max((dot - target).abs());
            }
        }
        prop_assert!(worst <= 1e-12, "{kind:?} d={dim}: max |ΠᵀΠ − I| = {worst:e}");
    }

    /// `apply_inverse(apply(x)) = x` in f32 (tolerance derived at [`ROUND_TRIP_TOLERANCE`]).
    /// An inverse that applied the factors in the wrong order, or Π instead of Πᵀ, is off
    /// by O(1).
    #[test]
    fn inverse_undoes_apply((kind, seed, x) in case()) {
        let rotation = Rotation::new(kind, x.len(), seed).unwrap();
        let x32 = to_f32(&x);
        let (mut y, mut back) = (vec![0.0f32; x.len()], vec![0.0f32; x.len()]);
        rotation.apply(&x32, &mut y).unwrap();
        rotation.apply_inverse(&y, &mut back).unwrap();
        let exact: Vec<f64> = x32.iter().map(|&v| f64::from(v)).collect();
        let error = relative_distance(&back, &exact);
        prop_assert!(error <= ROUND_TRIP_TOLERANCE, "{kind:?} d={}: {error:e}", x.len());
        // And in the other order: Π is also a right inverse.
        rotation.apply_inverse(&x32, &mut y).unwrap();
        rotation.apply(&y, &mut back).unwrap();
        let error = relative_distance(&back, &exact);
        prop_assert!(error <= ROUND_TRIP_TOLERANCE, "{kind:?} d={} (ΠΠᵀ): {error:e}", x.len());
    }

    /// `‖Πx‖ = ‖x‖` in f32 to half the round-trip tolerance (one apply, not two). A missing
    /// `1/√B` on any pass scales norms by `√B ≥ √2`.
    #[test]
    fn apply_preserves_norms((kind, seed, x) in case()) {
        let rotation = Rotation::new(kind, x.len(), seed).unwrap();
        let x32 = to_f32(&x);
        let exact_norm = norm(&x32.iter().map(|&v| f64::from(v)).collect::<Vec<_>>());
        let mut y = vec![0.0f32; x.len()];
        for inverse in [false, true] {
            if inverse {
                rotation.apply_inverse(&x32, &mut y).unwrap();
            } else {
                rotation.apply(&x32, &mut y).unwrap();
            }
            let rotated_norm = norm(&y.iter().map(|&v| f64::from(v)).collect::<Vec<_>>());
            let error = (rotated_norm / exact_norm - 1.0).abs();
            prop_assert!(error <= ROUND_TRIP_TOLERANCE / 2.0,
                "{kind:?} d={} inverse={inverse}: {error:e}", x.len());
        }
    }

    /// The f32 fast paths compute the dense f64 matrix's product up to f32 rounding.
    ///
    /// Haar, per coordinate: `y_j` is an in-order sum of `d` rounded products of entries
    /// that were themselves rounded to f32, so (first order)
    /// `|ŷ_j − y_j| ≤ (d + 2)·u·Σ_i |Π_ji·x_i|`: `d` additions, one product, one storage
    /// rounding. Hadamard, norm-wise: [`hadamard_relative_error`]. The f64 reference errs by
    /// ~1e-16 relative, far below either. A wrong entry of size ≥ 1/d (the smallest any
    /// bug here produces) exceeds both by orders of magnitude.
    #[test]
    fn fast_paths_match_the_dense_matrix((kind, seed, x) in case()) {
        let dim = x.len();
        let rotation = Rotation::new(kind, dim, seed).unwrap();
        let pi = rotation.to_dense_f64();
        let x32 = to_f32(&x);
        let xs: Vec<f64> = x32.iter().map(|&v| f64::from(v)).collect();
        for inverse in [false, true] {
            // Entry (j, i) of the map under test: Π_ji, or Πᵀ_ji = Π_ij.
            let entry = |j: usize, i: usize| if inverse { pi[i * dim + j] } else { pi[j * dim + i] };
            let mut y = vec![0.0f32; dim];
            if inverse {
                rotation.apply_inverse(&x32, &mut y).unwrap();
            } else {
                rotation.apply(&x32, &mut y).unwrap();
            }
            let exact: Vec<f64> = (0..dim).map(|j| (0..dim).map(|i| entry(j, i) * xs[i]).sum()).collect();
            match kind {
                RotationKind::Haar => {
                    for j in 0..dim {
                        let magnitude: f64 = (0..dim).map(|i| (entry(j, i) * xs[i]).abs()).sum();
                        let tolerance = 1.01 * (dim + 2) as f64 * UNIT_ROUNDOFF * magnitude;
                        let error = (f64::from(y[j]) - exact[j]).abs();
                        prop_assert!(error <= tolerance,
                            "Haar d={dim} inverse={inverse} j={j}: {error:e} > {tolerance:e}");
                    }
                }
                RotationKind::Hadamard => {
                    let error = relative_distance(&y, &exact);
                    let tolerance = hadamard_relative_error(dim);
                    prop_assert!(error <= tolerance,
                        "Hadamard d={dim} inverse={inverse}: {error:e} > {tolerance:e}");
                }
            }
        }
    }
}
