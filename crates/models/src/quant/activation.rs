//! Activations quantized to Q8 blocks once per matvec (ggml's `q8_0` / `q8_1`).
//!
//! Each block of 32 activations `x` becomes 32 signed bytes `q` and two f16 numbers, computed
//! exactly as llama.cpp's x86 `quantize_row_q8_0` / `quantize_row_q8_1` do:
//!
//! ```text
//! amax = max |x_j|          d = amax / 127          id = 127 / amax   (0 if amax = 0)
//! q_j  = round_half_even(x_j · id)                  (always within −127..=127)
//! d16  = f16(d)             s16 = f16(d · Σ q_j)    (q8_1's sum, used by Q4_1's minimum)
//! ```
//!
//! The f16 roundings are kept: the dot products use `d16` and `s16` as llama.cpp does, so a
//! forward pass sees the same activation quantization as the engine that produced the
//! reference outputs. (ggml's portable reference quantizer rounds half away from zero and
//! uses `1/d`; its x86 and ARM kernels round half to even, and x86 multiplies by `127/amax`.
//! Following the x86 kernel matches the common case; the difference only shows on exact
//! ties and one-ulp differences of `id`.)
//!
//! The same quantized activation serves Q8_0 and Q4_0 (which use `d16`, `q`) and Q4_1 (which
//! also uses `s16`). Quantization costs `O(n·cols)` against the `O(n·rows·cols)` of the matvec,
//! so it is one portable routine (written so LLVM vectorizes it) shared by every instruction
//! set: the quantized activation, and so every integer sum, is identical across them.

use half::f16;
use rayon::prelude::*;

use super::error::QuantError;

/// Values per Q8 activation block.
pub const Q8_BLOCK: usize = 32;

/// Per-row scale arrays are padded with zeros to a multiple of this many blocks, so vector
/// kernels can load eight scales at once.
pub(crate) const SCALE_LANES: usize = 8;

/// `1.5 · 2²³`: adding it rounds any `|v| < 2²²` to the nearest integer, ties to even (the
/// default IEEE rounding of the addition), exactly like `_mm256_round_ps` in round-to-nearest
/// mode.
const ROUND_MAGIC: f32 = 12_582_912.0;

/// Rounds `v` (with `|v| < 2²²`) to the nearest integer, ties to even, read from the bits of
/// `v + 1.5·2²³` (whose binade has a unit step, so its bit pattern is `ROUND_MAGIC`'s plus the
/// rounded value): no float-to-int conversion, whose saturation and NaN rules keep compilers
/// from vectorizing the loop.
#[inline]
pub(crate) fn round_half_even_i32(v: f32) -> i32 {
    (v + ROUND_MAGIC).to_bits() as i32 - ROUND_MAGIC.to_bits() as i32
}

/// The largest `|v|` of `x` (0 for an empty or all-zero `x`), compared through the bit
/// patterns, which order non-negative floats as their values: an integer maximum vectorizes,
/// a float one with its NaN rules does not. `x` must be finite.
#[inline]
pub(crate) fn max_abs(x: &[f32]) -> f32 {
    f32::from_bits(
        x.iter()
            .map(|v| v.to_bits() & 0x7FFF_FFFF)
            .max()
            .unwrap_or(0),
    )
}

/// Rows of activations quantized to Q8 blocks; reused across calls (it only grows).
#[derive(Clone, Debug, Default)]
pub struct Q8Activation {
    rows: usize,
    cols: usize,
    /// Scale slots per row: blocks per row rounded up to [`SCALE_LANES`].
    stride: usize,
    /// `rows · stride` block scales `d16` as f32 (zero in the padding).
    d: Vec<f32>,
    /// `rows · stride` block sums `s16 = f16(d · Σq)` as f32 (zero in the padding).
    s: Vec<f32>,
    /// `rows · cols` quantized values.
    qs: Vec<i8>,
}

/// One quantized activation row, borrowed from a [`Q8Activation`].
#[derive(Clone, Copy, Debug)]
pub struct Q8Row<'a> {
    blocks: usize,
    /// Padded to a multiple of [`SCALE_LANES`].
    pub(crate) d: &'a [f32],
    /// Padded to a multiple of [`SCALE_LANES`].
    pub(crate) s: &'a [f32],
    pub(crate) qs: &'a [i8],
}

impl Q8Activation {
    /// An empty buffer (no allocation until the first [`quantize`](Self::quantize)).
    pub fn new() -> Self {
        Self::default()
    }

    /// Quantizes `rows` activation rows of `cols` values each (`x` row-major), replacing the
    /// previous contents. `cols` must be a multiple of 32 and every value finite.
    pub fn quantize(&mut self, x: &[f32], rows: usize, cols: usize) -> Result<(), QuantError> {
        if !cols.is_multiple_of(Q8_BLOCK) {
            return Err(QuantError::NotBlockMultiple {
                kind: super::QuantKind::Q8_0,
                cols,
                block: Q8_BLOCK,
            });
        }
        let expected = rows.checked_mul(cols).ok_or(QuantError::SizeOverflow {
            kind: super::QuantKind::Q8_0,
            rows,
            cols,
        })?;
        if x.len() != expected {
            return Err(QuantError::ShapeMismatch {
                what: "activation",
                expected,
                actual: x.len(),
            });
        }
        check_finite(x)?;
        let blocks = cols / Q8_BLOCK;
        let stride = blocks.div_ceil(SCALE_LANES) * SCALE_LANES;
        self.rows = rows;
        self.cols = cols;
        self.stride = stride;
        resize(&mut self.d, rows * stride, 0.0);
        resize(&mut self.s, rows * stride, 0.0);
        resize(&mut self.qs, rows * cols, 0);
        if rows == 0 || cols == 0 {
            return Ok(());
        }
        let quantize_row = |x: &[f32], qs: &mut [i8], d: &mut [f32], s: &mut [f32]| {
            for (b, (xb, qb)) in x
                .chunks_exact(Q8_BLOCK)
                .zip(qs.chunks_exact_mut(Q8_BLOCK))
                .enumerate()
            {
                (d[b], s[b]) = quantize_block(xb, qb);
            }
        };
        if rows == 1 {
            // One row: no thread hand-off (a rayon call from outside the pool costs more than
            // quantizing a few thousand values).
            quantize_row(x, &mut self.qs, &mut self.d, &mut self.s);
        } else {
            x.par_chunks(cols)
                .zip(self.qs.par_chunks_mut(cols))
                .zip(self.d.par_chunks_mut(stride))
                .zip(self.s.par_chunks_mut(stride))
                .for_each(|(((x, qs), d), s)| quantize_row(x, qs, d, s));
        }
        Ok(())
    }

    /// Bytes the buffers hold (their capacities).
    pub fn allocated_bytes(&self) -> usize {
        4 * (self.d.capacity() + self.s.capacity()) + self.qs.capacity()
    }

    /// Activation rows held.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Values per row.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Row `i`, or an error past the end.
    pub fn row(&self, i: usize) -> Result<Q8Row<'_>, QuantError> {
        if i >= self.rows {
            return Err(QuantError::RowOutOfRange {
                index: i,
                rows: self.rows,
            });
        }
        Ok(self.row_unchecked(i))
    }

    /// Row `i < rows`.
    pub(crate) fn row_unchecked(&self, i: usize) -> Q8Row<'_> {
        let (st, c) = (self.stride, self.cols);
        Q8Row {
            blocks: c / Q8_BLOCK,
            d: &self.d[i * st..(i + 1) * st],
            s: &self.s[i * st..(i + 1) * st],
            qs: &self.qs[i * c..(i + 1) * c],
        }
    }
}

impl<'a> Q8Row<'a> {
    /// Blocks of 32 values.
    pub fn blocks(&self) -> usize {
        self.blocks
    }

    /// Values (`32 · blocks`).
    pub fn len(&self) -> usize {
        self.qs.len()
    }

    /// Whether the row holds no value.
    pub fn is_empty(&self) -> bool {
        self.qs.is_empty()
    }

    /// The block scales `d16` (as f32), one per block.
    pub fn scales(&self) -> &'a [f32] {
        &self.d[..self.blocks]
    }

    /// The block sums `s16 = f16(d · Σ q)` (as f32), one per block.
    pub fn sums(&self) -> &'a [f32] {
        &self.s[..self.blocks]
    }

    /// The quantized values.
    pub fn quants(&self) -> &'a [i8] {
        self.qs
    }

    /// The values the row represents, `q_j · d16`, into `out` (of [`len`](Self::len) values).
    pub fn dequantize(&self, out: &mut [f32]) -> Result<(), QuantError> {
        if out.len() != self.len() {
            return Err(QuantError::ShapeMismatch {
                what: "dequantized activation",
                expected: self.len(),
                actual: out.len(),
            });
        }
        for ((o, q), &d) in out
            .chunks_exact_mut(Q8_BLOCK)
            .zip(self.qs.chunks_exact(Q8_BLOCK))
            .zip(self.scales())
        {
            for (o, &q) in o.iter_mut().zip(q) {
                *o = q as f32 * d;
            }
        }
        Ok(())
    }
}

/// The first non-finite value, as an error.
pub(crate) fn check_finite(x: &[f32]) -> Result<(), QuantError> {
    // Branch-free scan (vectorizes), then locate the offender only on failure.
    let all_finite = x.iter().fold(true, |ok, v| ok & v.is_finite());
    if all_finite {
        return Ok(());
    }
    let index = x.iter().position(|v| !v.is_finite()).unwrap_or(0);
    Err(QuantError::NonFiniteActivation {
        index,
        value: x[index],
    })
}

/// Quantizes 32 finite values into `qs`; returns `(d16, s16)` as f32.
fn quantize_block(x: &[f32], qs: &mut [i8]) -> (f32, f32) {
    let amax = max_abs(x);
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    // For amax < 127/f32::MAX, 127/amax overflows; ggml then produces meaningless bytes, but
    // f16(d) is 0 so the block contributes nothing either way. Zero bytes say the same thing.
    let id = if id.is_finite() { id } else { 0.0 };
    let mut sum = 0i32;
    for (q, &v) in qs.iter_mut().zip(x) {
        // |v·id| ≤ 127·(1 + 2⁻²³) < 127.5, so the rounded value is in −127..=127.
        let r = round_half_even_i32(v * id);
        *q = r as i8;
        sum += r;
    }
    (
        f16::from_f32(d).to_f32(),
        f16::from_f32(d * sum as f32).to_f32(),
    )
}

/// Sets `v.len() = n`, reusing its allocation.
fn resize<T: Copy>(v: &mut Vec<T>, n: usize, fill: T) {
    v.clear();
    v.resize(n, fill);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn magic_rounding_is_round_half_even() {
        let mut v = -200.0f32;
        while v <= 200.0 {
            assert_eq!(round_half_even_i32(v), v.round_ties_even() as i32, "{v}");
            v += 0.125;
        }
        for v in [
            0.5f32, 1.5, 2.5, -0.5, -1.5, 126.5, -126.5, 0.49999997, 127.00001,
        ] {
            assert_eq!(round_half_even_i32(v), v.round_ties_even() as i32, "{v}");
        }
    }

    #[test]
    fn max_abs_is_the_largest_magnitude() {
        assert_eq!(max_abs(&[]), 0.0);
        assert_eq!(max_abs(&[-0.0, 0.0]), 0.0);
        assert_eq!(max_abs(&[1.0, -3.5, 2.0, 3.25]), 3.5);
        assert_eq!(
            max_abs(&[f32::MIN_POSITIVE / 4.0, -1e-40]),
            f32::MIN_POSITIVE / 4.0
        );
    }
}
