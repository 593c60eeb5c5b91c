//! Structure of the randomized Hadamard rotation: the power-of-two case is a signed,
//! normalized Hadamard matrix, and the overlapping-block case lets every input reach every
//! output.

use tq_rotation::{Rotation, RotationKind};

/// For a power-of-two d, `Π = D₂·H·D₁/√d`, so every entry is exactly `±1/√d`: one pass,
/// normalized once. Deterministic.
#[test]
fn power_of_two_entries_are_plus_or_minus_one_over_root_d() {
    for log in 0..=8 {
        let dim = 1usize << log;
        for seed in [0, 1, u64::MAX] {
            let pi = Rotation::new(RotationKind::Hadamard, dim, seed)
                .unwrap()
                .to_dense_f64();
            let magnitude = 1.0 / (dim as f64).sqrt();
            for (k, v) in pi.iter().enumerate() {
                assert!(
                    (v.abs() - magnitude).abs() <= 1e-15,
                    "d={dim} seed={seed} entry {k}: {v}"
                );
            }
        }
    }
}

/// Every output depends on every input: each entry of Π is nonzero for some seed.
///
/// Why over seeds and not for one seed: with `D₁_i` and `D₄_j` factored out, an entry is a
/// sum over paths `i → k → l → j` of `±B^{-3/2}`-sized terms times `D₂_k·D₃_l` — a multilinear
/// polynomial of degree ≤ 2 in the middle signs — and equal-magnitude terms can cancel: at
/// d = 6 every seed has 8 zero entries (the two paths through the overlap coordinates 2 and 3
/// cancel in exactly one of `Π_j4`, `Π_j5`), and at d = 100, 199 seeds in 200 have some.
/// What holds is that an entry with at least one path is a nonzero polynomial, so it is
/// nonzero with probability ≥ 2⁻² per seed (Schwartz–Zippel on the Boolean cube); seeds are
/// independent, so over N = 100 seeds it stays zero with probability ≤ (3/4)¹⁰⁰ = 3.2e-13.
/// A union over the 32 023 entries checked bounds the false failure by 1.1e-8.
/// The two-pass scheme `D₃·Ĥ_tail·D₂·Ĥ_head·D₁` fails with certainty: outputs `j < d − B`
/// never see inputs `i ≥ B`.
#[test]
fn every_input_reaches_every_output() {
    for dim in [3usize, 5, 6, 7, 12, 96, 100, 112] {
        let mut reached = vec![false; dim * dim];
        for seed in 0..100 {
            let pi = Rotation::new(RotationKind::Hadamard, dim, seed)
                .unwrap()
                .to_dense_f64();
            // Nonzero entries are sums of terms of size ≥ B^{-3/2}, far above 1e-9.
            for (flag, v) in reached.iter_mut().zip(&pi) {
                *flag |= v.abs() > 1e-9;
            }
        }
        let missing: Vec<(usize, usize)> = (0..dim * dim)
            .filter(|&k| !reached[k])
            .map(|k| (k / dim, k % dim))
            .collect();
        assert!(
            missing.is_empty(),
            "d={dim}: (output, input) pairs never mixed: {missing:?}"
        );
    }
}

/// The smallest overlapping case mixes everything for every seed: at d = 3 all entries are
/// `±(1 ± 1/√2)/2` or `±1/2`, none of which can cancel. Deterministic.
#[test]
fn dimension_three_is_dense_for_every_seed() {
    for seed in 0..64 {
        let pi = Rotation::new(RotationKind::Hadamard, 3, seed)
            .unwrap()
            .to_dense_f64();
        assert!(pi.iter().all(|v| v.abs() > 0.1), "seed={seed}: {pi:?}");
    }
}
