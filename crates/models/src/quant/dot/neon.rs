//! NEON (aarch64) block sums: the integer `Σ q_w·q_x` of one block with baseline NEON
//! (`smull` to i16 pairs, `sadalp` to i32, `addv`), exact like the scalar sums. The f32
//! combination is the scalar [`combine`](super::scalar::combine) itself, so results are
//! bit-identical to the scalar kernel by construction.
//!
//! NEON is part of every aarch64 target, so these need no runtime detection; they are `unsafe`
//! only for their raw loads.

use core::arch::aarch64::*;

/// Widening products of eight byte pairs, accumulated pairwise into four i32 lanes.
#[inline]
fn mul_acc(acc: int32x4_t, a: int8x8_t, b: int8x8_t) -> int32x4_t {
    // |a·b| ≤ 128·128 fits i16; pairs are summed into i32 by `sadalp`.
    vpadalq_s16(acc, vmull_s8(a, b))
}

/// `Σ` over 32 byte pairs `(lo ++ hi) · (y[0..16] ++ y[16..32])`.
///
/// # Safety
/// `y` points to 32 readable bytes.
#[inline]
unsafe fn sum32(lo: int8x16_t, hi: int8x16_t, y: *const i8) -> i32 {
    // SAFETY: 32 readable bytes at `y` (caller).
    let (y0, y1) = unsafe { (vld1q_s8(y), vld1q_s8(y.add(16))) };
    let mut acc = vdupq_n_s32(0);
    acc = mul_acc(acc, vget_low_s8(lo), vget_low_s8(y0));
    acc = mul_acc(acc, vget_high_s8(lo), vget_high_s8(y0));
    acc = mul_acc(acc, vget_low_s8(hi), vget_low_s8(y1));
    acc = mul_acc(acc, vget_high_s8(hi), vget_high_s8(y1));
    vaddvq_s32(acc)
}

/// The low and high nibbles of 16 bytes, as bytes 0..16.
#[inline]
fn nibbles(raw: uint8x16_t) -> (int8x16_t, int8x16_t) {
    (
        vreinterpretq_s8_u8(vandq_u8(raw, vdupq_n_u8(0xF))),
        vreinterpretq_s8_u8(vshrq_n_u8::<4>(raw)),
    )
}

/// `Σ q_w·q_x` of a Q8_0 block (34 bytes) and 32 activation bytes.
pub(crate) fn isum_q8_0(w: &[u8], y: &[i8]) -> i32 {
    let (w, y) = (&w[2..34], &y[..32]);
    // SAFETY: both slices hold 32 bytes (checked by the slicing above).
    unsafe {
        let p = w.as_ptr().cast::<i8>();
        sum32(vld1q_s8(p), vld1q_s8(p.add(16)), y.as_ptr())
    }
}

/// `Σ (q_w − 8)·q_x` of a Q4_0 block (18 bytes) and 32 activation bytes.
pub(crate) fn isum_q4_0(w: &[u8], y: &[i8]) -> i32 {
    let (w, y) = (&w[2..18], &y[..32]);
    // SAFETY: 16 weight bytes and 32 activation bytes (checked by the slicing above).
    unsafe {
        let (lo, hi) = nibbles(vld1q_u8(w.as_ptr()));
        let eight = vdupq_n_s8(8);
        sum32(vsubq_s8(lo, eight), vsubq_s8(hi, eight), y.as_ptr())
    }
}

/// `Σ q_w·q_x` of a Q4_1 block (20 bytes, unsigned nibbles) and 32 activation bytes.
pub(crate) fn isum_q4_1(w: &[u8], y: &[i8]) -> i32 {
    let (w, y) = (&w[4..20], &y[..32]);
    // SAFETY: 16 weight bytes and 32 activation bytes (checked by the slicing above).
    unsafe {
        let (lo, hi) = nibbles(vld1q_u8(w.as_ptr()));
        sum32(lo, hi, y.as_ptr())
    }
}
