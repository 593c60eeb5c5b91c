//! The encode hot path: the code of `x` is the number of decision thresholds below `x`.
//!
//! Thresholds are stored as the largest `f32` at or below each `f64` threshold. Then for
//! every `f32` input `x > t_f32 ⇔ f64::from(x) > t_f64` (no `f32` lies strictly between the
//! two), so the `f32` fast path makes exactly the decisions of the `f64` codebook. NaN
//! compares false against every threshold and so always gets code 0.

use std::fmt;

/// Size of the padded threshold table: `2^8`, so that masking an index with
/// `TABLE_LEN - 1` proves it in bounds and removes the bounds check.
const TABLE_LEN: usize = 256;

/// The largest `f32` that is `<= v` (for finite `v`).
pub(crate) fn f32_at_or_below(v: f64) -> f32 {
    let nearest = v as f32;
    if f64::from(nearest) <= v {
        nearest
    } else if nearest == 0.0 {
        -f32::from_bits(1)
    } else if nearest > 0.0 {
        f32::from_bits(nearest.to_bits() - 1)
    } else {
        f32::from_bits(nearest.to_bits() + 1)
    }
}

/// Decision thresholds padded with `+∞` (which no input exceeds, not even `+∞`).
#[derive(Clone, PartialEq)]
pub(crate) struct DecisionTable {
    bits: u8,
    padded: Box<[f32; TABLE_LEN]>,
}

impl fmt::Debug for DecisionTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DecisionTable")
            .field("bits", &self.bits)
            .finish_non_exhaustive()
    }
}

impl DecisionTable {
    /// A table for `2^bits − 1` sorted thresholds (`1 <= bits <= 8`).
    pub(crate) fn new(bits: u8, thresholds: &[f32]) -> Self {
        let mut padded = Box::new([f32::INFINITY; TABLE_LEN]);
        for (slot, &t) in padded.iter_mut().zip(thresholds) {
            *slot = t;
        }
        Self { bits, padded }
    }

    /// The code of one value.
    #[inline]
    pub(crate) fn code(&self, x: f32) -> u8 {
        match self.bits {
            0..=4 => self.count(x),
            5 => self.search::<5>(x),
            6 => self.search::<6>(x),
            7 => self.search::<7>(x),
            _ => self.search::<8>(x),
        }
    }

    /// Codes of a slice (`codes.len() == xs.len()`, checked by the caller); the bit-width
    /// dispatch happens once, outside the loop.
    pub(crate) fn encode(&self, xs: &[f32], codes: &mut [u8]) {
        match self.bits {
            0..=4 => self.encode_by_count(xs, codes),
            5 => encode_with(xs, codes, |x| self.search::<5>(x)),
            6 => encode_with(xs, codes, |x| self.search::<6>(x)),
            7 => encode_with(xs, codes, |x| self.search::<7>(x)),
            _ => encode_with(xs, codes, |x| self.search::<8>(x)),
        }
    }

    /// Few thresholds, many values: sweep each threshold over a block of values, so the
    /// compiler vectorizes across values (one SIMD compare covers several values).
    fn encode_by_count(&self, xs: &[f32], codes: &mut [u8]) {
        const BLOCK: usize = 64;
        let thresholds = &self.padded[..(1usize << self.bits) - 1];
        for (xs, codes) in xs.chunks(BLOCK).zip(codes.chunks_mut(BLOCK)) {
            let mut below = [0u32; BLOCK];
            for &t in thresholds {
                for (n, &x) in below.iter_mut().zip(xs) {
                    *n += u32::from(x > t);
                }
            }
            for (code, &n) in codes.iter_mut().zip(&below) {
                // n <= 2^4 − 1.
                *code = n as u8;
            }
        }
    }

    /// Few thresholds, one value: compare against all 16 table entries at once (a few SIMD
    /// compares); the `+∞` padding contributes nothing.
    #[inline(always)]
    fn count(&self, x: f32) -> u8 {
        let below = self.padded[..16]
            .iter()
            .fold(0u32, |n, &t| n + u32::from(x > t));
        // At most 2^4 − 1 real thresholds are below x.
        below as u8
    }

    /// Many thresholds: branch-free binary search with `B` dependent steps. Invariant:
    /// `pos` thresholds are known to be below `x`; each step tests whether `step` more are.
    #[inline(always)]
    fn search<const B: u32>(&self, x: f32) -> u8 {
        let mut pos = 0usize;
        let mut step = 1usize << (B - 1);
        while step > 0 {
            let t = self.padded[(pos + step - 1) & (TABLE_LEN - 1)];
            pos += step * usize::from(x > t);
            step >>= 1;
        }
        // pos <= 2^B − 1 <= 255.
        pos as u8
    }
}

#[inline(always)]
fn encode_with(xs: &[f32], codes: &mut [u8], code: impl Fn(f32) -> u8) {
    for (slot, &x) in codes.iter_mut().zip(xs) {
        *slot = code(x);
    }
}
