//! NEON (aarch64) lane sums: the eight exact integer sums of four products each of one block,
//! with baseline NEON (`smull` to i16, `saddlp` to i32 pairs, `addp` to quads). The f32
//! combination is the scalar [`combine`](super::scalar::combine) itself (whose `mul_add` is
//! the native `fmadd`), so results are bit-identical to the scalar kernel by construction.
//!
//! NEON is part of every aarch64 target (the baseline the standard library is built for), so
//! these need no runtime detection; they carry `#[target_feature(enable = "neon")]` so the
//! intrinsics are callable, and the dispatcher's call into them states that baseline.

use core::arch::aarch64::*;

use super::scalar::Lanes;

/// Products of eight byte pairs, summed in adjacent pairs: `[p0+p1, p2+p3, p4+p5, p6+p7]`.
#[inline]
#[target_feature(enable = "neon")]
fn pairs(a: int8x8_t, b: int8x8_t) -> int32x4_t {
    // |a·b| ≤ 128·128 fits i16; `saddlp` widens the pair sums to i32.
    vpaddlq_s16(vmull_s8(a, b))
}

/// The eight lane sums (lane `l` = products `4l..4l+4`) of `(lo ++ hi) · y[0..32]`.
///
/// # Safety
/// `y` points to 32 readable bytes.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn lanes32(lo: int8x16_t, hi: int8x16_t, y: *const i8) -> Lanes {
    // SAFETY: 32 readable bytes at `y` (caller).
    let (y0, y1) = unsafe { (vld1q_s8(y), vld1q_s8(y.add(16))) };
    // `addp` of two pair vectors: [(p0+p1)+(p2+p3), (p4+p5)+(p6+p7), …] = lanes of 4 products.
    let l03 = vpaddq_s32(
        pairs(vget_low_s8(lo), vget_low_s8(y0)),
        pairs(vget_high_s8(lo), vget_high_s8(y0)),
    );
    let l47 = vpaddq_s32(
        pairs(vget_low_s8(hi), vget_low_s8(y1)),
        pairs(vget_high_s8(hi), vget_high_s8(y1)),
    );
    let mut out = [0i32; 8];
    // SAFETY: `out` holds 8 i32.
    unsafe {
        vst1q_s32(out.as_mut_ptr(), l03);
        vst1q_s32(out.as_mut_ptr().add(4), l47);
    }
    out
}

/// The low and high nibbles of 16 bytes, as bytes 0..16.
#[inline]
#[target_feature(enable = "neon")]
fn nibbles(raw: uint8x16_t) -> (int8x16_t, int8x16_t) {
    (
        vreinterpretq_s8_u8(vandq_u8(raw, vdupq_n_u8(0xF))),
        vreinterpretq_s8_u8(vshrq_n_u8::<4>(raw)),
    )
}

/// Lane sums of a Q8_0 block (34 bytes) against 32 activation bytes.
#[target_feature(enable = "neon")]
pub(crate) fn lanes_q8_0(w: &[u8], y: &[i8]) -> Lanes {
    let (w, y) = (&w[2..34], &y[..32]);
    // SAFETY: both slices hold 32 bytes (checked by the slicing above).
    unsafe {
        let p = w.as_ptr().cast::<i8>();
        lanes32(vld1q_s8(p), vld1q_s8(p.add(16)), y.as_ptr())
    }
}

/// Lane sums of a Q4_0 block (18 bytes, values `q − 8`) against 32 activation bytes.
#[target_feature(enable = "neon")]
pub(crate) fn lanes_q4_0(w: &[u8], y: &[i8]) -> Lanes {
    let (w, y) = (&w[2..18], &y[..32]);
    // SAFETY: 16 weight bytes and 32 activation bytes (checked by the slicing above).
    unsafe {
        let (lo, hi) = nibbles(vld1q_u8(w.as_ptr()));
        let eight = vdupq_n_s8(8);
        lanes32(vsubq_s8(lo, eight), vsubq_s8(hi, eight), y.as_ptr())
    }
}

/// Lane sums of a Q4_1 block (20 bytes, unsigned nibbles) against 32 activation bytes.
#[target_feature(enable = "neon")]
pub(crate) fn lanes_q4_1(w: &[u8], y: &[i8]) -> Lanes {
    let (w, y) = (&w[4..20], &y[..32]);
    // SAFETY: 16 weight bytes and 32 activation bytes (checked by the slicing above).
    unsafe {
        let (lo, hi) = nibbles(vld1q_u8(w.as_ptr()));
        lanes32(lo, hi, y.as_ptr())
    }
}
