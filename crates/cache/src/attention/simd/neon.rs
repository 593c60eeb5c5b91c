//! aarch64 NEON primitives (NEON is part of every aarch64 target, so no runtime detection is
//! needed). The block kernels compose them per token (see `composed.rs`).
//!
//! Codes of b ≤ 4 bits unpack four at a time: broadcast the `u32` holding eight codes, shift
//! each lane right by `b·lane` (`vshlq_u32` with negative counts), mask, turn each index `k`
//! into the byte indices `4k..4k+4` and look them up in the 64-byte table of (up to) 16 f32
//! centroids with `vqtbl4q_u8`. Wider codes use the scalar unpacking. f16 converts with integer
//! operations (see [`f16_bits_to_f32`](super::f16_bits_to_f32)): the f16 vector types are not
//! stable Rust.

use core::arch::aarch64::*;

use half::f16;

use super::super::primitives::{
    self, EXP_HIGH, EXP_LN2_HI, EXP_LN2_LO, EXP_LOG2E, EXP_LOW, EXP_POLY, exp_poly,
};
use super::composed::Prims;

/// The NEON primitives, for the composed block kernels.
pub(crate) struct Neon;

impl Prims for Neon {
    fn dot(a: &[f32], b: &[f32]) -> f32 {
        dot(a, b)
    }
    fn lane8_dot(a: &[f32], b: &[f32]) -> f32 {
        lane8_dot(a, b)
    }
    fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
        axpy(alpha, x, y)
    }
    fn dequantize(words: &[u32], bits: u8, centroids: &[f32], out: &mut [f32]) {
        dequantize(words, bits, centroids, out)
    }
    fn decode_f16_pairs(words: &[u32], out: &mut [f32]) {
        decode_f16_pairs(words, out)
    }
    fn signed_dot(w: &[f32], signs: &[u32]) -> f32 {
        signed_dot(w, signs)
    }
    fn accumulate_signs(alpha: f32, signs: &[u32], acc: &mut [f32]) {
        accumulate_signs(alpha, signs, acc)
    }
}

/// Reduces two 4-lane accumulators (lanes 0–3 and 4–7) in the scalar reference's order.
fn reduce8(lo: float32x4_t, hi: float32x4_t) -> f32 {
    let mut lanes = [0.0f32; 8];
    // SAFETY: `lanes` holds 8 floats; each store writes 4.
    unsafe {
        vst1q_f32(lanes.as_mut_ptr(), lo);
        vst1q_f32(lanes.as_mut_ptr().add(4), hi);
    }
    ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5]))
        + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]))
}

/// Lanes 0–3 and 4–7 of `Σ a_j·b_j` over the first `8·⌊n/8⌋` terms, one fused multiply-add per
/// term in increasing `j`: the loop [`dot`] and [`lane8_dot`] share (they differ only in how
/// the lanes are reduced).
fn fma_lanes8(a: &[f32], b: &[f32]) -> (float32x4_t, float32x4_t) {
    let full = a.len().min(b.len()) / 8 * 8;
    // SAFETY: every load reads 4 floats starting below `full ≤ n`.
    unsafe {
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut lo = vdupq_n_f32(0.0);
        let mut hi = vdupq_n_f32(0.0);
        let mut k = 0;
        while k < full {
            lo = vfmaq_f32(lo, vld1q_f32(pa.add(k)), vld1q_f32(pb.add(k)));
            hi = vfmaq_f32(hi, vld1q_f32(pa.add(k + 4)), vld1q_f32(pb.add(k + 4)));
            k += 8;
        }
        (lo, hi)
    }
}

pub(super) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (lo, hi) = fma_lanes8(a, b);
    let mut s = reduce8(lo, hi);
    for i in n / 8 * 8..n {
        s += a[i] * b[i];
    }
    s
}

/// [`primitives::lane8_dot`] bit for bit: lanes 0–3 and 4–7 in two registers, ended by the
/// same [`primitives::lane8_finish`].
pub(super) fn lane8_dot(a: &[f32], b: &[f32]) -> f32 {
    let (lo, hi) = fma_lanes8(a, b);
    let mut lanes = [0.0f32; 8];
    // SAFETY: each store writes 4 of the 8 floats of `lanes`.
    unsafe {
        vst1q_f32(lanes.as_mut_ptr(), lo);
        vst1q_f32(lanes.as_mut_ptr().add(4), hi);
    }
    primitives::lane8_finish(&lanes, a, b)
}

pub(super) fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
    let n = x.len().min(y.len());
    let full = n / 4 * 4;
    // SAFETY: every access covers 4 floats starting below `full ≤ n`.
    unsafe {
        let a = vdupq_n_f32(alpha);
        let (px, py) = (x.as_ptr(), y.as_mut_ptr());
        let mut k = 0;
        while k < full {
            vst1q_f32(
                py.add(k),
                vfmaq_f32(vld1q_f32(py.add(k)), a, vld1q_f32(px.add(k))),
            );
            k += 4;
        }
    }
    for i in full..n {
        y[i] = alpha.mul_add(x[i], y[i]);
    }
}

pub(super) fn dequantize(words: &[u32], bits: u8, centroids: &[f32], out: &mut [f32]) {
    if bits > 4 {
        primitives::dequantize_codes(words, bits, centroids, out);
        return;
    }
    let b = bits as usize;
    let n = out.len();
    let full = n / 8;
    let bytes = 4 * words.len();
    let mut table = [0u8; 64];
    for (k, c) in centroids.iter().enumerate() {
        table[4 * k..4 * k + 4].copy_from_slice(&c.to_le_bytes());
    }
    let record = words.as_ptr() as *const u8;
    // SAFETY: a chunk read takes 4 bytes at `b·j` when they lie inside the words, otherwise
    // the bytes below `bytes` one by one; `b·j ≤ bytes` since the words hold all `n` codes;
    // stores write 4 floats below `8·full ≤ n`; the table loads read 64 bytes of `table`.
    unsafe {
        let tp = table.as_ptr();
        let t = uint8x16x4_t(
            vld1q_u8(tp),
            vld1q_u8(tp.add(16)),
            vld1q_u8(tp.add(32)),
            vld1q_u8(tp.add(48)),
        );
        let bi = b as i32;
        let shifts_lo = [0, -bi, -2 * bi, -3 * bi];
        let shifts_hi = [-4 * bi, -5 * bi, -6 * bi, -7 * bi];
        let shift_lo = vld1q_s32(shifts_lo.as_ptr());
        let shift_hi = vld1q_s32(shifts_hi.as_ptr());
        let mask = vdupq_n_u32((1u32 << b) - 1);
        let bytes_of = vdupq_n_u32(0x0302_0100);
        let po = out.as_mut_ptr();
        for j in 0..full {
            let offset = b * j;
            let x = if offset + 4 <= bytes {
                (record.add(offset) as *const u32).read_unaligned()
            } else {
                let mut x = 0u32;
                for k in 0..(bytes - offset).min(4) {
                    x |= u32::from(*record.add(offset + k)) << (8 * k);
                }
                x
            };
            let v = vdupq_n_u32(x);
            for (half, shift) in [(0usize, shift_lo), (4, shift_hi)] {
                let idx = vandq_u32(vshlq_u32(v, shift), mask);
                let byte_idx = vaddq_u32(vmulq_n_u32(idx, 0x0404_0404), bytes_of);
                let looked = vqtbl4q_u8(t, vreinterpretq_u8_u32(byte_idx));
                vst1q_f32(po.add(8 * j + half), vreinterpretq_f32_u8(looked));
            }
        }
    }
    if 8 * full < n {
        let mut codes = vec![0.0f32; n];
        primitives::dequantize_codes(words, bits, centroids, &mut codes);
        out[8 * full..].copy_from_slice(&codes[8 * full..]);
    }
}

/// Four f16 bit patterns to f32 with integer operations.
fn f16x4(h: uint16x4_t) -> float32x4_t {
    // SAFETY: register-only NEON operations; NEON is part of every aarch64 target.
    unsafe {
        let h = vmovl_u16(h);
        let magnitude = vshlq_n_u32::<13>(vandq_u32(h, vdupq_n_u32(0x7FFF)));
        let scaled = vreinterpretq_u32_f32(vmulq_f32(
            vreinterpretq_f32_u32(magnitude),
            vdupq_n_f32(f32::from_bits(0x7780_0000)),
        ));
        let special = vceqq_u32(vandq_u32(h, vdupq_n_u32(0x7C00)), vdupq_n_u32(0x7C00));
        let value = vbslq_u32(
            special,
            vorrq_u32(magnitude, vdupq_n_u32(0x7F80_0000)),
            scaled,
        );
        let sign = vshlq_n_u32::<16>(vandq_u32(h, vdupq_n_u32(0x8000)));
        vreinterpretq_f32_u32(vorrq_u32(value, sign))
    }
}

pub(super) fn f16_to_f32(halves: &[f16], out: &mut [f32]) {
    let n = halves.len().min(out.len());
    let full = n / 4 * 4;
    // SAFETY: `f16` is a transparent `u16`; every access covers 4 values below `full ≤ n`.
    unsafe {
        let (ph, po) = (halves.as_ptr() as *const u16, out.as_mut_ptr());
        let mut k = 0;
        while k < full {
            vst1q_f32(po.add(k), f16x4(vld1_u16(ph.add(k))));
            k += 4;
        }
    }
    for i in full..n {
        out[i] = halves[i].to_f32();
    }
}

pub(super) fn decode_f16_pairs(words: &[u32], out: &mut [f32]) {
    let n = out.len();
    let full = n / 4 * 4;
    // SAFETY: the words hold `ceil(n/2)` pairs (checked by the dispatcher); every load reads
    // 4 halves below `full ≤ n`.
    unsafe {
        let (ph, po) = (words.as_ptr() as *const u16, out.as_mut_ptr());
        let mut k = 0;
        while k < full {
            vst1q_f32(po.add(k), f16x4(vld1_u16(ph.add(k))));
            k += 4;
        }
    }
    for i in full..n {
        let w = words[i / 2];
        let half = if i % 2 == 0 { w & 0xFFFF } else { w >> 16 };
        out[i] = f16::from_bits(half as u16).to_f32();
    }
}

/// Sign-bit masks of bits `first..first + 4` of `word`: lane `l` has bit 31 set when bit
/// `first + l` is clear (that coordinate of `z` is `−1`). `first ≤ 28`.
fn negative_mask(word: u32, first: i32) -> uint32x4_t {
    let steps = [0i32, 1, 2, 3];
    // SAFETY: `steps` holds 4 integers; NEON is part of every aarch64 target.
    unsafe {
        let shifts = vsubq_s32(vdupq_n_s32(31 - first), vld1q_s32(steps.as_ptr()));
        let moved = vshlq_u32(vdupq_n_u32(word), shifts);
        vandq_u32(vmvnq_u32(moved), vdupq_n_u32(0x8000_0000))
    }
}

pub(super) fn signed_dot(w: &[f32], signs: &[u32]) -> f32 {
    let n = w.len();
    let full = n / 8 * 8;
    // SAFETY: loads read 4 weights below `full ≤ n`; sign words `k/32 < ceil(n/32)` are in
    // bounds (checked by the dispatcher, indexed safely).
    let mut s = unsafe {
        let pw = w.as_ptr();
        let mut lo = vdupq_n_f32(0.0);
        let mut hi = vdupq_n_f32(0.0);
        let mut k = 0;
        while k < full {
            let word = signs[k / 32];
            let first = (k % 32) as i32;
            let a = vreinterpretq_u32_f32(vld1q_f32(pw.add(k)));
            let b = vreinterpretq_u32_f32(vld1q_f32(pw.add(k + 4)));
            lo = vaddq_f32(
                lo,
                vreinterpretq_f32_u32(veorq_u32(a, negative_mask(word, first))),
            );
            hi = vaddq_f32(
                hi,
                vreinterpretq_f32_u32(veorq_u32(b, negative_mask(word, first + 4))),
            );
            k += 8;
        }
        reduce8(lo, hi)
    };
    for (j, &x) in w.iter().enumerate().skip(full) {
        let bit = (signs[j / 32] >> (j % 32)) & 1;
        s += if bit == 1 { x } else { -x };
    }
    s
}

pub(super) fn accumulate_signs(alpha: f32, signs: &[u32], acc: &mut [f32]) {
    let n = acc.len();
    let full = n / 4 * 4;
    // SAFETY: every access covers 4 floats below `full ≤ n`.
    unsafe {
        let a = vreinterpretq_u32_f32(vdupq_n_f32(alpha));
        let pa = acc.as_mut_ptr();
        let mut k = 0;
        while k < full {
            let z =
                vreinterpretq_f32_u32(veorq_u32(a, negative_mask(signs[k / 32], (k % 32) as i32)));
            vst1q_f32(pa.add(k), vaddq_f32(vld1q_f32(pa.add(k)), z));
            k += 4;
        }
    }
    for j in full..n {
        let bit = (signs[j / 32] >> (j % 32)) & 1;
        acc[j] += if bit == 1 { alpha } else { -alpha };
    }
}

/// `exp` of four lanes: the same operations as [`exp_poly`].
fn exp4(x: float32x4_t) -> float32x4_t {
    // SAFETY: register-only NEON operations; NEON is part of every aarch64 target.
    unsafe {
        let low = vdupq_n_f32(EXP_LOW);
        let valid = vcgeq_f32(x, low);
        let x = vminq_f32(vmaxq_f32(x, low), vdupq_n_f32(EXP_HIGH));
        let n = vrndnq_f32(vmulq_f32(x, vdupq_n_f32(EXP_LOG2E)));
        let r = vfmsq_f32(x, n, vdupq_n_f32(EXP_LN2_HI));
        let r = vfmsq_f32(r, n, vdupq_n_f32(EXP_LN2_LO));
        let mut p = vdupq_n_f32(EXP_POLY[0]);
        for &c in &EXP_POLY[1..] {
            p = vfmaq_f32(vdupq_n_f32(c), p, r);
        }
        let y = vfmaq_f32(vaddq_f32(r, vdupq_n_f32(1.0)), p, vmulq_f32(r, r));
        let e = vshlq_n_s32::<23>(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)));
        let v = vmulq_f32(y, vreinterpretq_f32_s32(e));
        vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(v), valid))
    }
}

pub(super) fn exp_shifted_sum(values: &mut [f32], shift: f32) -> f32 {
    let n = values.len();
    let full = n / 8 * 8;
    let mut lanes = [0.0f32; 8];
    // SAFETY: every access covers 4 floats below `full ≤ n`; `lanes` holds 8 floats.
    unsafe {
        let p = values.as_mut_ptr();
        let s = vdupq_n_f32(shift);
        let mut lo = vdupq_n_f32(0.0);
        let mut hi = vdupq_n_f32(0.0);
        let mut k = 0;
        while k < full {
            let a = exp4(vsubq_f32(vld1q_f32(p.add(k)), s));
            let b = exp4(vsubq_f32(vld1q_f32(p.add(k + 4)), s));
            vst1q_f32(p.add(k), a);
            vst1q_f32(p.add(k + 4), b);
            lo = vaddq_f32(lo, a);
            hi = vaddq_f32(hi, b);
            k += 8;
        }
        vst1q_f32(lanes.as_mut_ptr(), lo);
        vst1q_f32(lanes.as_mut_ptr().add(4), hi);
    }
    for (i, v) in values.iter_mut().enumerate().skip(full) {
        *v = exp_poly(*v - shift);
        lanes[i % 8] += *v;
    }
    ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5]))
        + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]))
}
