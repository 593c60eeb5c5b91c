//! Seeded Monte Carlo: the squared error of real random unit vectors matches the codebook's
//! stated distortion.
//!
//! Each sample is one vector `u = g/‖g‖`, `g ~ N(0, I_d)` (exactly uniform on the sphere),
//! and its total error `e = Σ_j (u_j − c[Q(u_j)])²`, whose mean is `D_mse = d·C`. Vectors are
//! i.i.d., so with N of them `z = (ē − D)/(s/√N)` is asymptotically N(0, 1) (`s` the sample
//! standard deviation). The test fails if `|z| > 5.3`: the normal tail there is 1.2e-7, and
//! the moderate-deviation correction `exp(γ z³/(6√N))` for the skewness `γ < 2` of `e` at
//! N ≥ 40 000 is below 1.3, so the false-failure probability stays under 2e-7 < 1e-6.
//!
//! Power: the common mistake of solving for `(t+1)/2 ~ Beta(d/2, d/2)` is the codebook of
//! `Beta { dim: d + 1 }`, whose stated `d·C` is off by ~1/(d+1). N is sized so that its
//! expected `z` exceeds 5.3 + 4.89 (detection with probability > 1 − 1e-6): a pilot run gave
//! z ≈ 18 at d = 64, b = 2 with 40 000 vectors, and z ≈ 5.7 at d = 128, b = 4 with 40 000,
//! hence 160 000 there (z ≈ 11.4). The same samples are used to show that it fails.

use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use rand_distr::{Distribution, StandardNormal};
use tq_lloyd_max::{CoordinateDistribution, LloydMaxCodebook};

const Z_BOUND: f64 = 5.3;

/// Random unit vectors in `R^dim`, a pure function of `seed`.
fn unit_vectors(dim: usize, count: usize, seed: u64) -> Vec<Vec<f64>> {
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    (0..count)
        .map(|_| {
            let g: Vec<f64> = (0..dim).map(|_| StandardNormal.sample(&mut rng)).collect();
            let norm = g.iter().map(|x| x * x).sum::<f64>().sqrt();
            g.into_iter().map(|x| x / norm).collect()
        })
        .collect()
}

/// `z` of the stated `D = d·C` against the errors of `codebook` on `vectors`.
fn z_score(codebook: &LloydMaxCodebook, dim: usize, vectors: &[Vec<f64>]) -> f64 {
    let errors: Vec<f64> = vectors
        .iter()
        .map(|u| dim as f64 * codebook.empirical_distortion(u))
        .collect();
    let n = errors.len() as f64;
    let mean = errors.iter().sum::<f64>() / n;
    let variance = errors.iter().map(|e| (e - mean) * (e - mean)).sum::<f64>() / (n - 1.0);
    let stated = dim as f64 * codebook.mse_per_coordinate();
    (mean - stated) / (variance / n).sqrt()
}

#[test]
fn sphere_samples_match_the_stated_distortion() {
    for (dim, bits, count, seed) in [
        (64usize, 2u8, 40_000, 0x51ab_0001u64),
        (128, 4, 160_000, 0x51ab_0002),
    ] {
        let vectors = unit_vectors(dim, count, seed);
        let exact =
            LloydMaxCodebook::new(CoordinateDistribution::Beta { dim }, bits).expect("solvable");
        let z = z_score(&exact, dim, &vectors);
        assert!(z.abs() <= Z_BOUND, "d={dim} b={bits}: z = {z}");
        let mistaken = LloydMaxCodebook::new(CoordinateDistribution::Beta { dim: dim + 1 }, bits)
            .expect("solvable");
        let z_mistaken = z_score(&mistaken, dim, &vectors);
        assert!(
            z_mistaken.abs() > Z_BOUND,
            "d={dim} b={bits}: the Beta(d/2, d/2) codebook went unnoticed (z = {z_mistaken})"
        );
    }
}

#[test]
fn empirical_distortion_of_nothing_is_nan() {
    let codebook =
        LloydMaxCodebook::new(CoordinateDistribution::Gaussian { dim: 1 }, 1).expect("solvable");
    assert!(codebook.empirical_distortion(&[]).is_nan());
    // One sample on a centroid has zero error; one at 0 has error c².
    let c = codebook.centroids()[1];
    assert_eq!(codebook.empirical_distortion(&[c]), 0.0);
    assert_eq!(codebook.empirical_distortion(&[0.0]), c * c);
}
