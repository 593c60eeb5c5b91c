//! [`QjlSketch`]: a drawn sketch matrix with its scale, and the encode / estimate / reconstruct
//! operations on packed sign bits.

use std::f64::consts::{FRAC_2_PI, PI};

use crate::matrix::SketchMatrix;
use crate::{QjlError, QjlSpec, SketchKind, SketchScale, expected_abs_coordinate, signs};

/// A drawn 1-bit QJL sketch: `z = sign(S·r)` packed into u32 words, plus `γ = ‖r‖`.
///
/// `S` is square (m = d rows), so a sketch costs `d` bits plus the norm. The query side is
/// projected once with [`project`](Self::project) and never quantized; each stored vector then
/// costs one pass over its bits in [`estimate_inner_product`](Self::estimate_inner_product).
///
/// ```
/// use tq_qjl::{QjlSpec, SketchKind};
///
/// let sketch = QjlSpec::new(SketchKind::Gaussian, 8, 42).build()?;
/// let r = [0.5f32, -1.0, 0.25, 0.0, 2.0, -0.5, 1.0, 0.75];
/// let (mut scratch, mut bits) = (vec![0.0f32; 8], vec![0u32; sketch.words()]);
/// let gamma = sketch.encode(&r, &mut scratch, &mut bits)?;
///
/// let y = [1.0f32, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0];
/// let mut projected = vec![0.0f32; 8];
/// sketch.project(&y, &mut projected)?;
/// let estimate = sketch.estimate_inner_product(&projected, &bits, gamma);
///
/// // The same number through the explicit reconstruction r̂ = γ·s·Sᵀz.
/// let mut r_hat = vec![0.0f32; 8];
/// sketch.reconstruct(&bits, gamma, &mut scratch, &mut r_hat)?;
/// assert!((estimate - r_hat[0]).abs() < 1e-4);
/// # Ok::<(), tq_qjl::QjlError>(())
/// ```
#[derive(Clone, Debug)]
pub struct QjlSketch {
    spec: QjlSpec,
    matrix: SketchMatrix,
    /// `m`, the number of sketch rows (= `d`).
    rows: usize,
    /// `s`, before shrinkage.
    scale: f64,
    /// `α·s`, the factor every output is multiplied by (times γ).
    gain: f64,
}

impl QjlSketch {
    /// Draws the matrix described by `spec`. Errors: `dim = 0`, a shrinkage that is not finite
    /// and positive, a matrix too large to allocate, or a dimension the rotation crate rejects.
    pub fn new(spec: QjlSpec) -> Result<Self, QjlError> {
        if spec.dim == 0 {
            return Err(QjlError::ZeroDimension);
        }
        check_shrinkage(spec.shrinkage)?;
        let matrix = SketchMatrix::draw(spec.kind, spec.dim, spec.seed)?;
        let rows = spec.dim;
        let scale = spec.scale.value(rows, spec.dim);
        Ok(Self {
            spec,
            matrix,
            rows,
            scale,
            gain: f64::from(spec.shrinkage) * scale,
        })
    }

    /// The same drawn matrix with another scale (the spec is updated; nothing is redrawn), for
    /// comparing scales on one draw as an ablation does.
    pub fn with_scale(self, scale: SketchScale) -> Self {
        let spec = self.spec.with_scale(scale);
        let value = scale.value(self.rows, spec.dim);
        Self {
            spec,
            scale: value,
            gain: f64::from(spec.shrinkage) * value,
            ..self
        }
    }

    /// The same drawn matrix with another shrinkage α (finite and > 0, else an error).
    pub fn with_shrinkage(self, shrinkage: f32) -> Result<Self, QjlError> {
        check_shrinkage(shrinkage)?;
        let spec = self.spec.with_shrinkage(shrinkage);
        Ok(Self {
            spec,
            gain: f64::from(shrinkage) * self.scale,
            ..self
        })
    }

    /// The spec this sketch was built from.
    pub fn spec(&self) -> QjlSpec {
        self.spec
    }

    /// The vector dimension `d`.
    pub fn dim(&self) -> usize {
        self.spec.dim
    }

    /// The number of sketch rows `m` (equal to `d`: the sketch is square).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// u32 words per packed sketch: `ceil(m / 32)`.
    pub fn words(&self) -> usize {
        signs::words_for(self.rows)
    }

    /// The scale `s` (before shrinkage).
    pub fn scale_factor(&self) -> f64 {
        self.scale
    }

    /// `out = S·y` (length `m`): the query side, computed once per query and never quantized.
    pub fn project(&self, y: &[f32], out: &mut [f32]) -> Result<(), QjlError> {
        check_len("query", self.dim(), y.len())?;
        check_len("projected query", self.rows, out.len())?;
        check_finite("query", y)?;
        self.matrix.project(y, out)
    }

    /// Packs `sign(S·r)` into `bits` and returns `γ = ‖r‖`.
    ///
    /// Bit `i` of the sketch is bit `i % 32` of word `i / 32`, 1 meaning `(S·r)_i ≥ 0`; unused
    /// high bits of the last word are 0. `scratch` (length `m`) receives `S·r`, which keeps the
    /// call allocation-free. `r = 0` gives `γ = 0` (and all bits 1). NaN or infinite inputs, a
    /// norm above `f32::MAX`, a projection that overflows to NaN (entries near `f32::MAX`), or
    /// wrong lengths are errors.
    pub fn encode(
        &self,
        r: &[f32],
        scratch: &mut [f32],
        bits: &mut [u32],
    ) -> Result<f32, QjlError> {
        check_len("residual", self.dim(), r.len())?;
        check_len("scratch", self.rows, scratch.len())?;
        check_len("bits", self.words(), bits.len())?;
        // Squares of finite f32 values cannot overflow f64, so a non-finite sum means a NaN or
        // an infinity in `r`; the index is looked up only on that error path.
        let norm_sq: f64 = r.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
        if !norm_sq.is_finite() {
            check_finite("residual", r)?;
        }
        let gamma = norm_sq.sqrt() as f32;
        if !gamma.is_finite() {
            return Err(QjlError::NormOverflow);
        }
        self.matrix.project(r, scratch)?;
        // Entries near f32::MAX can overflow the projection to ±inf (whose sign is still right)
        // and then to NaN (whose sign is meaningless).
        if let Some(index) = scratch.iter().position(|v| v.is_nan()) {
            return Err(QjlError::NonFinite {
                buffer: "projected residual",
                index,
            });
        }
        signs::pack(scratch, bits);
        Ok(gamma)
    }

    /// `α·γ·s·⟨S·y, z⟩` from the projected query and the packed bits, without reconstructing
    /// `r̂` (equal to `⟨y, r̂⟩` up to rounding).
    ///
    /// This is the attention hot path, so it returns no `Result`: if `projected_query` does not
    /// have length `m` or `bits` length [`words`](Self::words), it returns NaN, which poisons
    /// the softmax loudly instead of silently scoring a wrong key.
    pub fn estimate_inner_product(&self, projected_query: &[f32], bits: &[u32], gamma: f32) -> f32 {
        if projected_query.len() != self.rows || bits.len() != self.words() {
            return f32::NAN;
        }
        let signed = signs::signed_sum(projected_query, bits);
        (self.gain * f64::from(gamma) * f64::from(signed)) as f32
    }

    /// `r̂ = α·γ·s·Sᵀz` into `out` (length `d`), using `scratch` (length `m`) for `z`.
    pub fn reconstruct(
        &self,
        bits: &[u32],
        gamma: f32,
        scratch: &mut [f32],
        out: &mut [f32],
    ) -> Result<(), QjlError> {
        check_len("bits", self.words(), bits.len())?;
        check_len("scratch", self.rows, scratch.len())?;
        check_len("output", self.dim(), out.len())?;
        if !(gamma.is_finite() && gamma >= 0.0) {
            return Err(QjlError::InvalidGamma { value: gamma });
        }
        signs::unpack(bits, scratch);
        self.matrix.transpose_apply(scratch, out)?;
        let factor = (self.gain * f64::from(gamma)) as f32;
        out.iter_mut().for_each(|v| *v *= factor);
        Ok(())
    }

    /// `out = Sᵀ·w` for any real vector `w` of length m (no scale, no shrinkage).
    ///
    /// Attention accumulates `Σ_t p_t·γ_t·z_t` over many tokens in the sketch domain and maps the
    /// sum back once with this, times [`gain`](Self::gain), instead of reconstructing each token.
    pub fn project_transpose(&self, w: &[f32], out: &mut [f32]) -> Result<(), QjlError> {
        check_len("sketch-domain vector", self.rows, w.len())?;
        check_len("output", self.dim(), out.len())?;
        check_finite("sketch-domain vector", w)?;
        self.matrix.transpose_apply(w, out)
    }

    /// The factor `α·s` (shrinkage times scale) that turns `γ·Sᵀz` into `r̂`.
    pub fn gain(&self) -> f64 {
        self.gain
    }

    /// `S` as a dense m×d matrix in f64, row-major (for inspection and exact tests).
    pub fn to_dense_f64(&self) -> Vec<f64> {
        self.matrix.to_dense_f64()
    }

    /// The exact mean gain `E⟨y, r̂⟩ / ⟨y, r⟩` over the draw of `S`, shrinkage included: 1 for
    /// the unbiased configurations, `α·κ` for Haar with the asymptotic scale.
    ///
    /// Gaussian: `α·s·m·√(2/π)`; Haar: `α·s·d·E|u₁|`. `None` for Hadamard, whose gain depends
    /// on `r`: `α·s·√d·E|⟨ε, r/γ⟩|` over Rademacher `ε` for a power-of-two `d`, from `α·s·√d`
    /// for a basis vector down to within ~1/(2d) of the Haar value for dense vectors.
    pub fn bias_factor(&self) -> Option<f64> {
        let d = self.dim() as f64;
        match self.spec.kind {
            SketchKind::Gaussian => Some(self.gain * self.rows as f64 * FRAC_2_PI.sqrt()),
            SketchKind::Haar => Some(self.gain * d * expected_abs_coordinate(self.dim())),
            SketchKind::Hadamard => None,
        }
    }

    /// The shrinkage α* that minimises `E‖α·r̂ − r‖²` for this sketch's family and scale
    /// (independent of the spec's own shrinkage).
    ///
    /// Haar: `‖r̂‖² = s²·d·γ²` for every draw and `E⟨r̂, r⟩ = s·d·E|u₁|·γ²`, so
    /// `α* = E|u₁|/s`: `2κ/π` with the asymptotic scale, `2κ²/π` with the exact one (both tend
    /// to `2/π`). Gaussian (m = d): `E‖r̂‖² = s²·m·(d + 2(m−1)/π)·γ²`, so
    /// `α* = √(2/π) / (s·(d + 2(m−1)/π))`, which is `1/(π/2 + (d−1)/d)` with the paper's scale.
    /// `None` for Hadamard (it depends on `r`).
    pub fn mmse_shrinkage(&self) -> Option<f64> {
        let d = self.dim() as f64;
        let m = self.rows as f64;
        match self.spec.kind {
            SketchKind::Gaussian => {
                Some(FRAC_2_PI.sqrt() / (self.scale * (d + 2.0 * (m - 1.0) / PI)))
            }
            SketchKind::Haar => Some(expected_abs_coordinate(self.dim()) / self.scale),
            SketchKind::Hadamard => None,
        }
    }
}

fn check_shrinkage(shrinkage: f32) -> Result<(), QjlError> {
    if shrinkage.is_finite() && shrinkage > 0.0 {
        Ok(())
    } else {
        Err(QjlError::InvalidShrinkage { value: shrinkage })
    }
}

fn check_len(buffer: &'static str, expected: usize, actual: usize) -> Result<(), QjlError> {
    if expected == actual {
        Ok(())
    } else {
        Err(QjlError::LengthMismatch {
            buffer,
            expected,
            actual,
        })
    }
}

fn check_finite(buffer: &'static str, values: &[f32]) -> Result<(), QjlError> {
    match values.iter().position(|v| !v.is_finite()) {
        Some(index) => Err(QjlError::NonFinite { buffer, index }),
        None => Ok(()),
    }
}
