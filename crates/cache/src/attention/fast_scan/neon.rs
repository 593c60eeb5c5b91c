//! The NEON byte-shuffle kernels. Scores: `tbl` (`vqtbl1q_u8`) looks up a coordinate's 16
//! table entries for the 32 tokens of a block (the low nibbles, then the high), and the bytes
//! are summed in 16-bit lanes widened to 32 bits every [`FLUSH`] coordinates — the same
//! integers as `scalar::sums`. Integer value sums: the same look-up of centroid bytes, times
//! the weight bytes. NEON is part of every aarch64 target, so nothing is detected at run time.

use core::arch::aarch64::*;

use super::BLOCK;
use super::layout::LANE_BYTES;
use super::values_int::ValueTables;

/// Coordinates a 16-bit lane may add before it is widened: 256 · 255 < 65 536.
const FLUSH: usize = 256;

/// The NEON form of `scalar::sums`: `out[t] = Σ_j entries[16 j + code(t, j)]`.
///
/// # Panics
/// If `entries` and `codes` differ in length or are not whole coordinates of 16 bytes.
pub(super) fn sums(entries: &[u8], codes: &[u8], out: &mut [u32; BLOCK]) {
    assert!(entries.len() == codes.len() && codes.len().is_multiple_of(LANE_BYTES));
    out.fill(0);
    let coordinates = codes.len() / LANE_BYTES;
    let mut first = 0;
    while first < coordinates {
        let end = coordinates.min(first + FLUSH);
        // SAFETY: NEON is always present on aarch64; every load reads the 16 bytes of a
        // coordinate `j < coordinates` from slices of `16 · coordinates` bytes (asserted), and
        // the stores write 8 u16 into arrays of 8.
        unsafe {
            let nibble = vdupq_n_u8(0x0F);
            // Tokens 0–7, 8–15 (low nibbles), 16–23, 24–31 (high nibbles).
            let mut acc = [vdupq_n_u16(0); 4];
            for j in first..end {
                let lut = vld1q_u8(entries.as_ptr().add(j * LANE_BYTES));
                let c = vld1q_u8(codes.as_ptr().add(j * LANE_BYTES));
                let lo = vqtbl1q_u8(lut, vandq_u8(c, nibble));
                let hi = vqtbl1q_u8(lut, vshrq_n_u8::<4>(c));
                acc[0] = vaddw_u8(acc[0], vget_low_u8(lo));
                acc[1] = vaddw_high_u8(acc[1], lo);
                acc[2] = vaddw_u8(acc[2], vget_low_u8(hi));
                acc[3] = vaddw_high_u8(acc[3], hi);
            }
            for (k, a) in acc.iter().enumerate() {
                let mut words = [0u16; 8];
                vst1q_u16(words.as_mut_ptr(), *a);
                for (o, &w) in out[8 * k..8 * k + 8].iter_mut().zip(&words) {
                    *o += u32::from(w);
                }
            }
        }
        first = end;
    }
}

/// The NEON form of `values_int::accumulate_block`: the same integer sums (exact), then the
/// same multiplication and addition per coordinate, so the same bits. Per coordinate, `tbl`
/// looks up the 32 tokens' centroid bytes, `smull` multiplies them by the weight bytes
/// (7-bit, so a signed byte), and pairwise additions reduce them to the block's sum (an `i16`
/// holds two products: `2·127·127 < 2^15`).
///
/// Coordinate `j` reads nibble lane `j / m` through table `j mod m`.
///
/// # Panics
/// If `codes` holds fewer than the `rows / m` lanes, or `scales` and `lanes` do not fit
/// `weights.len()` heads.
pub(super) fn accumulate_block_int(
    codes: &[u8],
    rows: usize,
    tables: &ValueTables,
    weights: &[[u8; BLOCK]],
    scales: &[f32],
    lanes: &mut [f32],
) {
    let heads = weights.len();
    let per = tables.per;
    assert!(codes.len() >= rows.div_ceil(per) * LANE_BYTES && scales.len() == heads);
    assert!(lanes.len() >= heads * rows);
    // SAFETY: NEON is always present on aarch64; each table and each half of a weight row are
    // 16 bytes and each code load reads lane `j / m < rows / m` (asserted above).
    unsafe {
        let nibble = vdupq_n_u8(0x0F);
        for j in 0..rows {
            let lut = vld1q_s8(tables.tables[j % per].as_ptr());
            let c = vld1q_u8(codes.as_ptr().add((j / per) * LANE_BYTES));
            let low = vqtbl1q_s8(lut, vandq_u8(c, nibble));
            let high = vqtbl1q_s8(lut, vshrq_n_u8::<4>(c));
            for (h, (u, &scale)) in weights.iter().zip(scales).enumerate() {
                let u_low = vreinterpretq_s8_u8(vld1q_u8(u.as_ptr()));
                let u_high = vreinterpretq_s8_u8(vld1q_u8(u.as_ptr().add(LANE_BYTES)));
                let first = vaddq_s16(
                    vmull_s8(vget_low_s8(u_low), vget_low_s8(low)),
                    vmull_s8(vget_low_s8(u_high), vget_low_s8(high)),
                );
                let second = vaddq_s16(vmull_high_s8(u_low, low), vmull_high_s8(u_high, high));
                let sum = vaddvq_s32(vaddq_s32(vpaddlq_s16(first), vpaddlq_s16(second)));
                lanes[h * rows + j] += scale * sum as f32;
            }
        }
    }
}
