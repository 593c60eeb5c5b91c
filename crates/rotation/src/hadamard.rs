//! The randomized Hadamard rotation: random ±1 diagonals around normalized Walsh–Hadamard
//! transforms, with overlapping blocks when the dimension is not a power of two.

use std::fmt;
use std::ops::Range;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;

use crate::walsh_hadamard::{Scalar, fwht};

/// The blocks the Hadamard passes act on, in the order they are applied: `[0, d)` when `d`
/// is a power of two, else head `[0, B)`, tail `[d − B, d)`, head again, with `B` the largest
/// power of two not above `d`.
fn pass_blocks(dim: usize) -> Vec<Range<usize>> {
    if dim.is_power_of_two() {
        let whole = 0..dim;
        vec![whole]
    } else {
        // `dim` ≥ 3 here, so `ilog2` is defined and `B < dim < 2B`.
        let block = 1usize << dim.ilog2();
        vec![0..block, dim - block..dim, 0..block]
    }
}

/// One normalized transform on `block`, then the diagonal `exit` (a sign times, on the
/// block, the normalization 1/√B folded in so it costs no extra pass).
#[derive(Clone)]
struct Pass<T> {
    block: Range<usize>,
    exit: Vec<T>,
}

/// A composition `exit_k · H_k · … · exit_1 · H_1 · entry`, applied in place.
#[derive(Clone)]
struct Schedule<T> {
    entry: Vec<T>,
    passes: Vec<Pass<T>>,
}

impl<T: Scalar> Schedule<T> {
    /// Folds signs and normalizations into a schedule. `signs[0..=P]` and `blocks[0..P]`
    /// describe `Π = S_P·H_{P−1}·S_{P−1} ⋯ H_0·S_0`; `transpose` builds
    /// `Πᵀ = S_0·H_0·S_1 ⋯ H_{P−1}·S_P` instead (each `H` is symmetric).
    fn new(signs: &[Vec<f32>], blocks: &[Range<usize>], transpose: bool) -> Self {
        let last = blocks.len();
        let to_t = |s: &[f32]| -> Vec<T> { s.iter().map(|&v| T::from_f64(f64::from(v))).collect() };
        let exit = |sign: &[f32], block: &Range<usize>| -> Vec<T> {
            let scale = 1.0 / (block.len() as f64).sqrt();
            sign.iter()
                .enumerate()
                .map(|(i, &s)| {
                    let factor = if block.contains(&i) { scale } else { 1.0 };
                    T::from_f64(f64::from(s) * factor)
                })
                .collect()
        };
        let (entry, passes) = if transpose {
            let passes = (0..last)
                .rev()
                .map(|p| Pass {
                    block: blocks[p].clone(),
                    exit: exit(&signs[p], &blocks[p]),
                })
                .collect();
            (to_t(&signs[last]), passes)
        } else {
            let passes = (0..last)
                .map(|p| Pass {
                    block: blocks[p].clone(),
                    exit: exit(&signs[p + 1], &blocks[p]),
                })
                .collect();
            (to_t(&signs[0]), passes)
        };
        Schedule { entry, passes }
    }

    /// `output = schedule · input`; no allocation, `input` is only read once.
    #[inline]
    fn run(&self, input: &[T], output: &mut [T]) {
        for ((out, &x), &s) in output.iter_mut().zip(input).zip(&self.entry) {
            *out = x * s;
        }
        for pass in &self.passes {
            fwht(&mut output[pass.block.clone()]);
            for (out, &s) in output.iter_mut().zip(&pass.exit) {
                *out = *out * s;
            }
        }
    }
}

/// `Π = D₂·H·D₁/√d` for a power-of-two `d`; otherwise
/// `Π = D₄·Ĥ_head·D₃·Ĥ_tail·D₂·Ĥ_head·D₁` with normalized B-point transforms on overlapping
/// blocks (see the crate documentation for why three passes).
#[derive(Clone)]
pub(crate) struct RandomizedHadamard {
    /// The ±1 diagonals `D₁, D₂, …` in drawing order.
    signs: Vec<Vec<f32>>,
    blocks: Vec<Range<usize>>,
    forward: Schedule<f32>,
    inverse: Schedule<f32>,
}

impl fmt::Debug for RandomizedHadamard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RandomizedHadamard")
            .field("dim", &self.dim())
            .field("blocks", &self.blocks)
            .finish_non_exhaustive()
    }
}

impl RandomizedHadamard {
    /// Draws the diagonals `D₁, D₂, …` in order, each coordinate from one `bool` of
    /// `ChaCha20Rng::seed_from_u64(seed)`; `dim ≥ 1` is checked by the caller.
    pub(crate) fn new(dim: usize, seed: u64) -> Self {
        let blocks = pass_blocks(dim);
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        let signs: Vec<Vec<f32>> = (0..=blocks.len())
            .map(|_| {
                (0..dim)
                    .map(|_| if rng.random::<bool>() { 1.0 } else { -1.0 })
                    .collect()
            })
            .collect();
        let forward = Schedule::new(&signs, &blocks, false);
        let inverse = Schedule::new(&signs, &blocks, true);
        RandomizedHadamard {
            signs,
            blocks,
            forward,
            inverse,
        }
    }

    fn dim(&self) -> usize {
        self.forward.entry.len()
    }

    /// `output = Π·input`; lengths are checked by the caller.
    #[inline]
    pub(crate) fn apply(&self, input: &[f32], output: &mut [f32]) {
        self.forward.run(input, output);
    }

    /// `output = Πᵀ·input`; lengths are checked by the caller.
    #[inline]
    pub(crate) fn apply_inverse(&self, input: &[f32], output: &mut [f32]) {
        self.inverse.run(input, output);
    }

    /// Floating-point work per vector, for sizing parallel tasks.
    pub(crate) fn cost(&self) -> usize {
        let d = self.dim();
        self.blocks
            .iter()
            .map(|b| b.len() * (b.len().ilog2() as usize + 1) + d)
            .sum()
    }

    /// Π as a row-major f64 matrix: the same factors, applied in f64 to each basis vector.
    pub(crate) fn to_dense_f64(&self) -> Vec<f64> {
        let d = self.dim();
        let schedule = Schedule::<f64>::new(&self.signs, &self.blocks, false);
        let mut dense = vec![0.0f64; d * d];
        let mut basis = vec![0.0f64; d];
        let mut column = vec![0.0f64; d];
        for i in 0..d {
            basis[i] = 1.0;
            schedule.run(&basis, &mut column);
            basis[i] = 0.0;
            for (j, &value) in column.iter().enumerate() {
                dense[j * d + i] = value;
            }
        }
        dense
    }
}
