//! 1-bit Quantized Johnson–Lindenstrauss (QJL) sketches with unbiased inner-product estimates.
//!
//! TurboQuant's `TQ_prod` codec stores a vector as an MSE-quantized part plus this crate's
//! 1-bit sketch of the residual `r`: `d` sign bits and one norm. Attention then needs
//! `⟨q, r⟩`, which the sketch estimates without bias and without decompressing anything.
//!
//! # The math
//!
//! ```text
//! z = sign(S·r) ∈ {±1}^m        (packed, 1 = non-negative)     γ = ‖r‖
//! r̂ = α·γ·s·Sᵀz                 ⟨y, r̂⟩ = α·γ·s·⟨S·y, z⟩        (the query y is never quantized)
//! ```
//!
//! The sketch is square (m = d rows). For one row `g` with i.i.d. N(0,1) entries,
//! `E[(g·y)·sign(g·r)] = √(2/π)·⟨y, r⟩/‖r‖`, so with α = 1:
//!
//! - [`SketchKind::Gaussian`], [`SketchScale::Paper`] `s = √(π/2)/m`: `E⟨y, r̂⟩ = ⟨y, r⟩`
//!   (the paper's construction); the variance is `(π/2 − ρ²)·‖y‖²γ²/m` with `ρ` the cosine of
//!   `y` and `r`, and `E‖r̂‖² = (π/2 + (d−1)/d)·γ²`.
//! - [`SketchKind::Haar`] (orthogonal `S`): `S·r/γ` is uniform on the sphere, so
//!   `E⟨y, r̂⟩ = s·d·E|u₁|·⟨y, r⟩` with `E|u₁| = Γ(d/2)/(√π·Γ((d+1)/2))`
//!   ([`expected_abs_coordinate`]). [`SketchScale::Exact`] `s = 1/(d·E|u₁|)` is exactly
//!   unbiased; the popular [`SketchScale::Asymptotic`] `s = √(π/2)/√d` is biased by
//!   `κ = √(d/2)·Γ(d/2)/Γ((d+1)/2) ≈ 1 + 1/(4d)` ([`asymptotic_bias_factor`]). Since `‖z‖² = d`,
//!   `‖r̂‖² = s²·d·γ²` for every draw: `(π/2)·γ²` with the asymptotic scale. The MSE
//!   `E‖α·r̂ − r‖²` is minimised at `α* ≈ 2/π` (exactly `2κ/π` or `2κ²/π` for the two scales,
//!   [`QjlSketch::mmse_shrinkage`]), with MSE `(1 − 2/π)·γ²` instead of `(π/2 − 1)·γ²` at α = 1.
//!   Shrinkage α ≠ 1 scales every inner product by α, so it is a parameter, default 1.
//! - [`SketchKind::Hadamard`] (`D₂·H·D₁/√d` for a power-of-two `d`, O(d log d)): orthogonal,
//!   so the norm identity holds, but its rows are not uniform on the sphere and its mean gain
//!   depends on `r`: each `|(S·r)_i|` is distributed as `|⟨ε, r⟩|/√d` over Rademacher `ε`, so
//!   with the exact scale `E⟨r, r̂⟩/γ² = (√(π/2)/κ)·E|⟨ε, r/γ⟩|`. At d = 128 that is +25.1%
//!   for a basis vector (on every draw), +0.7% for a few spikes on a flat background, −0.39%
//!   for a flat ±1 vector and +0.01% for a Gaussian one (tests/hadamard_bias.rs). Use it
//!   where residuals are dense, or use Haar.
//!
//! # Where it sits
//!
//! The orthogonal sketches are [`tq_rotation::Rotation`]s (`S = Π`): this crate depends on
//! `tq-rotation` on purpose, an arrow down the pipeline, rather than re-implementing QR and
//! the Walsh–Hadamard transform. A sketch is a pure function of its [`QjlSpec`]
//! `(kind, dim, seed, scale, shrinkage)`. Its randomness comes from
//! `ChaCha20Rng::seed_from_u64(seed)` on a stream reserved for QJL, so a sketch and a
//! rotation built from the same seed number are still independent draws (a sketch equal to
//! the codec's rotation would correlate `S` with the residual and bias the estimate).
//!
//! # Example
//!
//! ```
//! use tq_qjl::{QjlSpec, SketchKind};
//!
//! let d = 64;
//! let sketch = QjlSpec::new(SketchKind::Haar, d, 1).build()?;
//! let r: Vec<f32> = (0..d).map(|i| ((i * 37) % 11) as f32 - 5.0).collect();
//! let mut scratch = vec![0.0f32; sketch.rows()];
//! let mut bits = vec![0u32; sketch.words()]; // d bits, 2 words
//! let gamma = sketch.encode(&r, &mut scratch, &mut bits)?;
//!
//! // Per query: project once, then one pass over the bits per stored vector.
//! let mut projected = vec![0.0f32; sketch.rows()];
//! sketch.project(&r, &mut projected)?;
//! let estimate = sketch.estimate_inner_product(&projected, &bits, gamma);
//! let exact = gamma * gamma;
//! // Unbiased over the draw of S; one draw is within a few (π/2 − 3/2)/d relative std devs.
//! assert!((estimate / exact - 1.0).abs() < 0.2);
//! # Ok::<(), tq_qjl::QjlError>(())
//! ```

#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod error;
mod gaussian;
mod matrix;
mod signs;
mod sketch;
mod spec;
mod sphere;

pub use error::QjlError;
pub use sketch::QjlSketch;
pub use spec::{QjlSpec, SketchKind, SketchScale};
pub use sphere::{asymptotic_bias_factor, expected_abs_coordinate};
