//! Activations quantized to Q8_K super-blocks once per product (ggml's `q8_K`): what the K
//! formats (Q4_K, Q6_K) are multiplied by in the reference engine.
//!
//! Each block of 256 activations becomes 256 signed bytes, an f32 scale and sixteen sums of 16
//! bytes, computed exactly as ggml's `quantize_row_q8_K_ref` (the routine its x86 build runs):
//!
//! ```text
//! max   = the value of largest |x_j| (the first one on ties)
//! s     = −127 / max                       (f32; a zero block stays zero)
//! q_j   = min(127, round_half_even(s · x_j))
//! d     = 1 / s                            (f32, so d·q_j ≈ x_j)
//! bsums = Σ of each 16 consecutive q_j
//! ```
//!
//! The sign convention (the largest magnitude maps to −127) and the clamp at +127 are ggml's;
//! keeping them keeps every integer sum of a row product equal to the engine's.

use rayon::prelude::*;

use super::activation::{check_finite, max_abs, round_half_even_i32};
use super::error::QuantError;

/// Values per Q8_K super-block.
pub const QK_K: usize = 256;

/// Sums per super-block (one per 16 values).
const SUMS: usize = QK_K / 16;

/// Rows of activations quantized to Q8_K super-blocks; reused across calls (it only grows).
#[derive(Clone, Debug, Default)]
pub struct Q8KActivation {
    rows: usize,
    cols: usize,
    /// One scale per super-block.
    d: Vec<f32>,
    /// `rows · cols` quantized values.
    qs: Vec<i8>,
    /// Sixteen sums per super-block.
    bsums: Vec<i16>,
}

/// One Q8_K activation row, borrowed from a [`Q8KActivation`].
#[derive(Clone, Copy, Debug)]
pub struct Q8KRow<'a> {
    /// One scale per super-block.
    pub(crate) d: &'a [f32],
    /// The quantized values.
    pub(crate) qs: &'a [i8],
    /// Sixteen sums of 16 values per super-block.
    pub(crate) bsums: &'a [i16],
}

impl Q8KActivation {
    /// An empty buffer (no allocation until the first [`quantize`](Self::quantize)).
    pub fn new() -> Self {
        Self::default()
    }

    /// Quantizes `rows` activation rows of `cols` values each (`x` row-major), replacing the
    /// previous contents. `cols` must be a multiple of 256 and every value finite.
    pub fn quantize(&mut self, x: &[f32], rows: usize, cols: usize) -> Result<(), QuantError> {
        self.quantize_grouped(x, rows, cols, 0)
    }

    /// [`quantize`](Self::quantize), with the first `grouped` rows quantized as llama.cpp's x86
    /// `ggml_quantize_mat_q8_K_4x8` does for the rows its repacked Q4_K matrix–matrix kernel
    /// reads (whole groups of four): the same values, except that when both `+amax` and
    /// `−amax` occur the positive one sets the sign of `s` (the reference quantizer takes the
    /// first one).
    pub fn quantize_grouped(
        &mut self,
        x: &[f32],
        rows: usize,
        cols: usize,
        grouped: usize,
    ) -> Result<(), QuantError> {
        let kind = super::QuantKind::Q4K;
        if !cols.is_multiple_of(QK_K) {
            return Err(QuantError::NotBlockMultiple {
                kind,
                cols,
                block: QK_K,
            });
        }
        let expected =
            rows.checked_mul(cols)
                .ok_or(QuantError::SizeOverflow { kind, rows, cols })?;
        if x.len() != expected {
            return Err(QuantError::ShapeMismatch {
                what: "activation",
                expected,
                actual: x.len(),
            });
        }
        check_finite(x)?;
        let blocks = cols / QK_K;
        self.rows = rows;
        self.cols = cols;
        self.d.clear();
        self.d.resize(rows * blocks, 0.0);
        self.qs.clear();
        self.qs.resize(rows * cols, 0);
        self.bsums.clear();
        self.bsums.resize(rows * blocks * SUMS, 0);
        if rows == 0 || cols == 0 {
            return Ok(());
        }
        let quantize_row =
            |x: &[f32], qs: &mut [i8], d: &mut [f32], bsums: &mut [i16], grouped: bool| {
                for (((x, qs), d), bsums) in x
                    .chunks_exact(QK_K)
                    .zip(qs.chunks_exact_mut(QK_K))
                    .zip(d.iter_mut())
                    .zip(bsums.chunks_exact_mut(SUMS))
                {
                    *d = quantize_block(x, qs, bsums, grouped);
                }
            };
        if rows == 1 {
            quantize_row(x, &mut self.qs, &mut self.d, &mut self.bsums, grouped > 0);
        } else {
            x.par_chunks(cols)
                .zip(self.qs.par_chunks_mut(cols))
                .zip(self.d.par_chunks_mut(blocks))
                .zip(self.bsums.par_chunks_mut(blocks * SUMS))
                .enumerate()
                .for_each(|(r, (((x, qs), d), b))| quantize_row(x, qs, d, b, r < grouped));
        }
        Ok(())
    }

    /// Bytes the buffers hold (their capacities).
    pub fn allocated_bytes(&self) -> usize {
        4 * self.d.capacity() + self.qs.capacity() + 2 * self.bsums.capacity()
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
    pub fn row(&self, i: usize) -> Result<Q8KRow<'_>, QuantError> {
        if i >= self.rows {
            return Err(QuantError::RowOutOfRange {
                index: i,
                rows: self.rows,
            });
        }
        Ok(self.row_unchecked(i))
    }

    /// Row `i < rows`.
    pub(crate) fn row_unchecked(&self, i: usize) -> Q8KRow<'_> {
        let (c, b) = (self.cols, self.cols / QK_K);
        Q8KRow {
            d: &self.d[i * b..(i + 1) * b],
            qs: &self.qs[i * c..(i + 1) * c],
            bsums: &self.bsums[i * b * SUMS..(i + 1) * b * SUMS],
        }
    }
}

impl<'a> Q8KRow<'a> {
    /// Values in the row.
    pub fn len(&self) -> usize {
        self.qs.len()
    }

    /// Whether the row holds no value.
    pub fn is_empty(&self) -> bool {
        self.qs.is_empty()
    }

    /// The quantized values.
    pub fn quants(&self) -> &'a [i8] {
        self.qs
    }

    /// One scale per super-block of 256 values.
    pub fn scales(&self) -> &'a [f32] {
        self.d
    }

    /// Sixteen sums of 16 quantized values per super-block.
    pub fn sums(&self) -> &'a [i16] {
        self.bsums
    }

    /// The values the row represents, `d·q_j`, into `out` (as many values as the row).
    pub fn dequantize(&self, out: &mut [f32]) -> Result<(), QuantError> {
        if out.len() != self.qs.len() {
            return Err(QuantError::ShapeMismatch {
                what: "dequantized activation",
                expected: self.qs.len(),
                actual: out.len(),
            });
        }
        for ((o, q), &d) in out
            .chunks_exact_mut(QK_K)
            .zip(self.qs.chunks_exact(QK_K))
            .zip(self.d)
        {
            for (o, &q) in o.iter_mut().zip(q) {
                *o = q as f32 * d;
            }
        }
        Ok(())
    }
}

/// Quantizes 256 finite values into `qs` and `bsums`; returns the scale `d`. `grouped` selects
/// the variant of [`Q8KActivation::quantize_grouped`].
fn quantize_block(x: &[f32], qs: &mut [i8], bsums: &mut [i16], grouped: bool) -> f32 {
    // The largest magnitude, then the first value that has it.
    let amax = max_abs(x);
    let mut max = x.iter().copied().find(|v| v.abs() == amax).unwrap_or(0.0);
    if grouped && x.contains(&amax) {
        max = amax;
    }
    let iscale = -127.0 / max;
    // A zero block (or one so small that −127/max overflows) stores zeros, as ggml's zero case.
    if amax == 0.0 || !iscale.is_finite() {
        qs.fill(0);
        bsums.fill(0);
        return 0.0;
    }
    for (q, &v) in qs.iter_mut().zip(x) {
        // |s·v| ≤ 127·(1 + 2⁻²³): the rounding is exact and in range; ggml clamps only above.
        *q = round_half_even_i32(iscale * v).min(127) as i8;
    }
    for (sum, q) in bsums.iter_mut().zip(qs.chunks_exact(16)) {
        *sum = q.iter().map(|&q| q as i16).sum();
    }
    1.0 / iscale
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_largest_magnitude_maps_to_minus_127_and_sums_are_kept() {
        let mut x = vec![0.0f32; QK_K];
        x[3] = 2.0;
        x[7] = -1.0;
        x[200] = 0.5;
        let mut act = Q8KActivation::new();
        act.quantize(&x, 1, QK_K).unwrap();
        let row = act.row(0).unwrap();
        assert_eq!(row.qs[3], -127);
        assert_eq!(row.qs[7], 64); // round_half_even(63.5) = 64
        assert_eq!(row.qs[200], -32); // −31.75 rounds to −32
        assert_eq!(row.d[0], 1.0 / (-127.0f32 / 2.0));
        assert_eq!(row.bsums[0], -127 + 64);
        assert_eq!(row.bsums[12], -32);
        let mut back = vec![0.0; QK_K];
        row.dequantize(&mut back).unwrap();
        assert!((back[3] - 2.0).abs() < 1e-6);
    }
}
