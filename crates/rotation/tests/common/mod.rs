//! Shared fixtures for the integration tests: rounding constants, the proptest
//! configuration, the z bound of the statistical tests, and test vectors.

#![allow(dead_code)] // Each test binary uses a different subset.

use rayon::prelude::*;
use tq_rotation::{Rotation, RotationKind};

/// Unit roundoff of f32, `2^−24`.
pub const UNIT_ROUNDOFF: f64 = f32::EPSILON as f64 / 2.0;

/// Two-sided z bound of every statistical check. `P(|N(0,1)| > 5.5) = 3.8e-8`, so a test
/// making up to 26 such checks false-fails with probability below 1e-6 (union bound).
pub const Z: f64 = 5.5;

/// The ProptestConfig every property test uses: fixed seed, explicit case count, no files.
pub fn proptest_config(cases: u32, seed: u64) -> proptest::test_runner::Config {
    proptest::test_runner::Config {
        cases,
        rng_seed: proptest::test_runner::RngSeed::Fixed(seed),
        failure_persistence: None,
        ..proptest::test_runner::Config::default()
    }
}

/// The number of sign-and-transform passes and the block size of a Hadamard rotation, as
/// documented in the crate: one pass of `d` if `d` is a power of two, else three of `B`.
pub fn hadamard_passes(dim: usize) -> (usize, usize) {
    if dim.is_power_of_two() {
        (1, dim)
    } else {
        (3, 1 << dim.ilog2())
    }
}

/// Relative (norm-wise) rounding error bound of one f32 Hadamard apply. Each butterfly level
/// rounds every output once, `|δ| ≤ u·|output|`, so it adds at most `u` relative to the
/// current norm, and later levels (orthogonal up to a scale) keep that ratio; per pass there
/// are `log₂ B` levels, one rounding of the folded `±1/√B` constant and one multiply by it.
/// Sign multiplies are exact. First order, with 1% slack for the second-order terms.
pub fn hadamard_relative_error(dim: usize) -> f64 {
    let (passes, block) = hadamard_passes(dim);
    1.01 * (passes * (block.ilog2() as usize + 2)) as f64 * UNIT_ROUNDOFF
}

/// `e_0` in dimension `dim`.
pub fn basis_vector(dim: usize) -> Vec<f64> {
    let mut e = vec![0.0; dim];
    e[0] = 1.0;
    e
}

/// A fixed dense unit vector with unequal entries (`x_i ∝ 1 + (i mod 5)`, alternating signs),
/// so that results that hold only for flat vectors are not mistaken for general ones.
pub fn dense_unit_vector(dim: usize) -> Vec<f64> {
    let raw: Vec<f64> = (0..dim)
        .map(|i| {
            let magnitude = 1.0 + (i % 5) as f64;
            if i % 2 == 0 { magnitude } else { -magnitude }
        })
        .collect();
    let norm = raw.iter().map(|v| v * v).sum::<f64>().sqrt();
    raw.iter().map(|v| v / norm).collect()
}

/// A unit vector with all entries of magnitude `1/√dim` and a fixed irregular sign pattern.
pub fn flat_unit_vector(dim: usize) -> Vec<f64> {
    let scale = 1.0 / (dim as f64).sqrt();
    (0..dim)
        .map(|i| {
            if (i * 7 + i / 3) % 3 == 0 {
                -scale
            } else {
                scale
            }
        })
        .collect()
}

pub fn to_f32(x: &[f64]) -> Vec<f32> {
    x.iter().map(|&v| v as f32).collect()
}

pub fn norm(x: &[f64]) -> f64 {
    x.iter().map(|v| v * v).sum::<f64>().sqrt()
}

pub fn mean(samples: &[f64]) -> f64 {
    samples.iter().sum::<f64>() / samples.len() as f64
}

/// For each seed in `seeds`, rotates every vector in `inputs` and records `f(rotation,
/// outputs)`; the rows come back in seed order, so sums over them never depend on threads.
pub fn per_seed<T: Send>(
    kind: RotationKind,
    dim: usize,
    seeds: std::ops::Range<u64>,
    inputs: &[Vec<f64>],
    f: impl Fn(&Rotation, &[Vec<f64>]) -> T + Sync,
) -> Vec<T> {
    let inputs: Vec<Vec<f32>> = inputs.iter().map(|x| to_f32(x)).collect();
    seeds
        .into_par_iter()
        .map(|seed| {
            let rotation = Rotation::new(kind, dim, seed).expect("valid dimension");
            let outputs: Vec<Vec<f64>> = inputs
                .iter()
                .map(|x| {
                    let mut y = vec![0.0f32; dim];
                    rotation.apply(x, &mut y).expect("lengths match");
                    y.iter().map(|&v| f64::from(v)).collect()
                })
                .collect();
            f(&rotation, &outputs)
        })
        .collect()
}
