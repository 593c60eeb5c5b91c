//! The Lloyd-Max conditions, checked against an independent quadrature of the density:
//! thresholds at midpoints (exactly), centroids at conditional means (to 1e-9 σ), and the
//! symmetry `c_k = −c_{2^b−1−k}` (to 1e-12 σ).

mod common;

use common::{DIMS, Quadrature, cell_bounds, fixed_config};
use proptest::prelude::*;
use tq_lloyd_max::{CoordinateDistribution, LloydMaxCodebook};

/// Checks all three conditions for one codebook. The solver stops at a fixed-point residual
/// of 1e-12 σ (amplified at most ~30× into the centroids at b = 8, see the reference test),
/// and the quadrature is good to ~1e-13 relative, so 1e-9 σ leaves a wide margin while a
/// single Lloyd step away from the optimum (moves of 1e-3 σ and more) fails by far.
fn check_conditions(distribution: CoordinateDistribution, bits: u8) {
    let codebook = LloydMaxCodebook::new(distribution, bits).expect("solvable");
    let sigma = distribution.std_dev();
    let (c, t) = (codebook.centroids(), codebook.thresholds());
    assert_eq!(c.len(), 1 << bits);
    assert_eq!(t.len(), c.len() - 1);
    // Midpoints: exact, with the same rounding as the definition.
    for (k, w) in c.windows(2).enumerate() {
        assert_eq!(
            t[k],
            (w[0] + w[1]) / 2.0,
            "{distribution:?} b={bits} threshold {k}"
        );
        assert!(
            w[0] < w[1],
            "{distribution:?} b={bits}: centroids not increasing at {k}"
        );
    }
    // Symmetry.
    let n = c.len();
    for k in 0..n {
        assert!(
            (c[k] + c[n - 1 - k]).abs() <= 1e-12 * sigma,
            "{distribution:?} b={bits}: c[{k}] = {} vs c[{}] = {}",
            c[k],
            n - 1 - k,
            c[n - 1 - k]
        );
    }
    // Centroid condition, against adaptive Simpson on the unnormalized density.
    let quadrature = Quadrature::new(distribution);
    for (k, cell) in cell_bounds(t).windows(2).enumerate() {
        let mean = quadrature.conditional_mean(cell[0], cell[1]);
        assert!(
            (c[k] - mean).abs() <= 1e-9 * sigma,
            "{distribution:?} b={bits}: c[{k}] = {} but E[X | cell] = {mean} (diff {:e} σ)",
            c[k],
            (c[k] - mean) / sigma
        );
    }
}

#[test]
fn conditions_hold_for_every_listed_dimension_and_bit_width() {
    for dim in DIMS {
        for bits in 1..=8 {
            check_conditions(CoordinateDistribution::Beta { dim }, bits);
        }
    }
    for dim in [1, 3, 128, 4096] {
        for bits in 1..=8 {
            check_conditions(CoordinateDistribution::Gaussian { dim }, bits);
        }
    }
}

/// `dim = 3` is the uniform law on [−1, 1]: the optimum is the uniform quantizer,
/// `c_k = −1 + (2k+1)/2^b`, in closed form.
#[test]
fn three_dimensions_give_the_uniform_quantizer() {
    for bits in 1..=8 {
        let codebook =
            LloydMaxCodebook::new(CoordinateDistribution::Beta { dim: 3 }, bits).expect("solvable");
        let n = codebook.levels() as f64;
        for (k, c) in codebook.centroids().iter().enumerate() {
            let exact = -1.0 + (2 * k + 1) as f64 / n;
            assert!(
                (c - exact).abs() <= 1e-13,
                "b={bits} c[{k}] = {c} vs {exact}"
            );
        }
    }
}

fn any_distribution() -> impl Strategy<Value = CoordinateDistribution> {
    // Log-uniform dimensions from 3 to ~10^6 cover both the strongly non-Gaussian small-d
    // laws and the near-Gaussian regime.
    let dim = (0.0f64..12.0).prop_map(|log2| (3.0 * log2.exp2()) as usize);
    prop_oneof![
        dim.clone()
            .prop_map(|dim| CoordinateDistribution::Beta { dim }),
        dim.prop_map(|dim| CoordinateDistribution::Gaussian { dim }),
    ]
}

proptest! {
    #![proptest_config(fixed_config(40, 0x5eed_f1ed))]

    #[test]
    fn conditions_hold_for_random_laws(distribution in any_distribution(), bits in 1u8..=8) {
        check_conditions(distribution, bits);
    }
}

/// The centroid check above resolves errors far below what a wrong solver would make:
/// moving one centroid by 1e-8 σ (thresholds follow as midpoints) breaks it.
#[test]
fn the_centroid_check_detects_a_tiny_perturbation() {
    let distribution = CoordinateDistribution::Beta { dim: 128 };
    let codebook = LloydMaxCodebook::new(distribution, 4).expect("solvable");
    let sigma = distribution.std_dev();
    let mut c = codebook.centroids().to_vec();
    c[11] += 1e-8 * sigma;
    let t: Vec<f64> = c.windows(2).map(|w| (w[0] + w[1]) / 2.0).collect();
    let quadrature = Quadrature::new(distribution);
    let bounds = cell_bounds(&t);
    let worst = (0..c.len())
        .map(|k| (c[k] - quadrature.conditional_mean(bounds[k], bounds[k + 1])).abs() / sigma)
        .fold(0.0, f64::max);
    assert!(
        worst > 1e-9,
        "perturbation of 1e-8 σ went unnoticed: worst {worst:e} σ"
    );
}
