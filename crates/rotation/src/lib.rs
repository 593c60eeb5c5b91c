//! Seeded random orthogonal rotations for TurboQuant: a dense Haar matrix or a randomized
//! Hadamard transform, applied to f32 vectors and exactly inverted.
//!
//! Rotating a vector `x` by a random orthogonal `Π` spreads its energy evenly: for a unit
//! `x`, each coordinate of `Πx` has mean 0 and variance about `1/d`, which is what lets a
//! scalar quantizer built for that law (the `lloyd-max` crate) work on every coordinate.
//!
//! # The two kinds
//!
//! - [`RotationKind::Haar`]: draw `A` (d×d, i.i.d. N(0, 1), f64), factor `A = QR`, and
//!   multiply column `j` of `Q` by `sign(R_jj)`. Only with that sign fix is `Q` uniformly
//!   (Haar) distributed; then `Πx` is a uniform point on the sphere of radius `‖x‖`, and one
//!   coordinate `t` of a unit `x` has density `∝ (1 − t²)^((d−3)/2)`, variance `1/d`.
//!   O(d²) per vector.
//! - [`RotationKind::Hadamard`]: for a power-of-two `d`, `Π = D₂·H·D₁/√d` with `H` the
//!   Walsh–Hadamard matrix and `D₁, D₂` random ±1 diagonals; `(Πx)_j = ±Σ_i ±x_i/√d` with
//!   independent signs, so over seeds its mean is 0 and its variance is exactly `‖x‖²/d` for
//!   *every* `x`. O(d log d) per vector, in place.
//!
//! # Hadamard when `d` is not a power of two: overlapping blocks
//!
//! With `B` the largest power of two below `d`, let `Ĥ_head` be the normalized B-point
//! transform on coordinates `[0, B)` and `Ĥ_tail` the one on `[d − B, d)` (identity
//! elsewhere); then
//!
//! ```text
//! Π = D₄ · Ĥ_head · D₃ · Ĥ_tail · D₂ · Ĥ_head · D₁
//! ```
//!
//! with four random ±1 diagonals. Every factor is orthogonal, so `Π` is; its cost is three
//! B-point transforms. Three passes, not two, because two can never mix everything: an
//! output outside the second block only sees the first block's inputs. After three, every
//! output depends on every input, in the sense that `P = E[Π∘Π] = P_head·P_tail·P_head` is
//! positive everywhere (`P_block` is `1/B` inside its block, the identity outside); a given
//! seed can still have exact zeros where equal-magnitude paths cancel (at d = 6, eight
//! entries for every seed).
//!
//! Over seeds, `(Πx)_j` has mean 0 and variance `Σ_i P_ji·x_i²`. `P` is doubly stochastic,
//! so this is exactly `1/d` for any `x` with equal-magnitude entries and averages `1/d`
//! over `j` for every `x`, but it is not `1/d` coordinate by coordinate for every `x`: for
//! `e₁` at d = 96 it is 3/256 for `j < 64` and 1/128 for `j ≥ 64`.
//!
//! # Precision and cost
//!
//! `apply` and `apply_inverse` never allocate. Haar stores Π and Πᵀ in f32 (column-major)
//! and sums each output left to right over blocks of 32 outputs; its round-trip error is a
//! few `1e-7` relative at d = 300. Hadamard applies the transforms in place with the ±1
//! signs and the `1/√B` normalizations folded into one multiply per pass; each pass rounds
//! at most `log₂ B + 2` times, so a round trip is within `2·3·(log₂ B + 2)·2⁻²⁴` relative.
//!
//! # Determinism
//!
//! Every random choice is drawn from `ChaCha20Rng::seed_from_u64(seed)`, so a rotation is a
//! pure function of its [`RotationSpec`] (kind, dim, seed); caches store the spec, not the
//! matrix. Dot products use a fixed summation order, so results never depend on threads.
//!
//! # Example
//!
//! ```
//! use tq_rotation::{Rotation, RotationKind, RotationSpec};
//!
//! let spec = RotationSpec { kind: RotationKind::Haar, dim: 4, seed: 1 };
//! let rotation = spec.build()?;
//! let x = [1.0f32, 2.0, 3.0, 4.0];
//! let mut y = [0.0f32; 4];
//! rotation.apply(&x, &mut y)?;
//! let mut back = [0.0f32; 4];
//! rotation.apply_inverse(&y, &mut back)?;
//! assert!(x.iter().zip(&back).all(|(a, b)| (a - b).abs() < 1e-5));
//!
//! // A row-major batch of two vectors gives the same bits as two single calls.
//! let batch = [1.0f32, 2.0, 3.0, 4.0, 0.0, 1.0, 0.0, 0.0];
//! let mut rotated = [0.0f32; 8];
//! rotation.apply_batch(&batch, &mut rotated)?;
//! assert_eq!(rotated[..4], y);
//!
//! // The same triple always gives the same matrix.
//! assert_eq!(Rotation::new(RotationKind::Haar, 4, 1)?.to_dense_f64(), rotation.to_dense_f64());
//! # Ok::<(), tq_rotation::RotationError>(())
//! ```

#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod error;
mod haar;
mod hadamard;
mod matvec;
mod rotation;
mod spec;
mod walsh_hadamard;

pub use error::RotationError;
pub use rotation::Rotation;
pub use spec::{RotationKind, RotationSpec};
