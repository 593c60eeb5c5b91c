//! AVX2 (+ F16C) kernels: a weight row against a Q8 activation row, with integer arithmetic.
//!
//! Per block of 32: the weight bytes become 32 signed or unsigned bytes (Q8_0 as stored;
//! Q4_0/Q4_1 nibbles split into the low 16 and high 16 values, Q4_0 minus 8), multiplied by the
//! activation bytes with `vpmaddubsw` (unsigned × signed pairs to i16; for signed weights the
//! sign is moved onto the activation first, `|w|·sign(w)·x`) and `vpmaddwd` by ones (i16 pairs to
//! i32). No step saturates: a pair is at most `2·128·127 = 32512 < 2¹⁵` because activations lie
//! in −127..=127, so the integer sum of each block is exact.
//!
//! Eight blocks are then reduced together (an `hadd` tree, exact in i32) so lane `k` holds the
//! sum of block `8g + k`, converted to f32 (exact: below 2²⁴) and combined exactly as the
//! scalar reference does ([`combine`](super::scalar::combine)): `acc += (d_w·d_x)·isum`,
//! `acc_m += m_w·s_x`, without FMA, then the same horizontal order. Missing blocks of the last
//! group have zero scales and sums and add `+0.0`, which changes no lane (a lane is never
//! `−0.0`: it starts at `+0.0` and a round-to-nearest sum is `−0.0` only if both terms are).
//! The result is therefore bit-identical to the scalar kernel.
//!
//! Every function is `unsafe` only because it needs AVX2/F16C: the dispatcher selects them
//! after runtime detection. Memory is read through raw pointers only inside bounds clamped at
//! the top of [`dot`].

use core::arch::x86_64::*;

use super::super::activation::{Q8_BLOCK, Q8Row, SCALE_LANES};

/// Q8_0 weights.
pub(crate) const Q8_0: u8 = 0;
/// Q4_0 weights.
pub(crate) const Q4_0: u8 = 1;
/// Q4_1 weights.
pub(crate) const Q4_1: u8 = 2;

/// Bytes per block of format `K`.
const fn block_bytes(k: u8) -> usize {
    match k {
        Q8_0 => 34,
        Q4_0 => 18,
        _ => 20,
    }
}

/// Sums the eight lanes: `((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))`, as `hsum8`.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let t = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps::<1>(t, t)))
}

/// Lane `k` of the result is the sum of the eight i32 lanes of `v[k]` (exact).
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn reduce8(v: &[__m256i; 8]) -> __m256i {
    let h01 = _mm256_hadd_epi32(v[0], v[1]);
    let h23 = _mm256_hadd_epi32(v[2], v[3]);
    let h45 = _mm256_hadd_epi32(v[4], v[5]);
    let h67 = _mm256_hadd_epi32(v[6], v[7]);
    // 128-bit halves: low = [Σv0.lo, Σv1.lo, Σv2.lo, Σv3.lo], high = the same for .hi.
    let h0123 = _mm256_hadd_epi32(h01, h23);
    let h4567 = _mm256_hadd_epi32(h45, h67);
    let lo = _mm256_permute2x128_si256::<0x20>(h0123, h4567);
    let hi = _mm256_permute2x128_si256::<0x31>(h0123, h4567);
    _mm256_add_epi32(lo, hi)
}

/// The eight i32 partial sums of one block's `Σ q_w·q_x`.
///
/// # Safety
/// AVX2; `w` points to a whole block of format `K`, `y` to 32 readable bytes.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn block_sums<const K: u8>(w: *const u8, y: *const i8) -> __m256i {
    let ones = _mm256_set1_epi16(1);
    // SAFETY: `y` has 32 readable bytes (caller).
    let qy = unsafe { _mm256_loadu_si256(y.cast()) };
    let products = if K == Q4_1 {
        // SAFETY: a Q4_1 block is 20 bytes; its nibbles are bytes 4..20.
        let raw = unsafe { _mm_loadu_si128(w.add(4).cast()) };
        let qx = nibbles(raw);
        _mm256_maddubs_epi16(qx, qy)
    } else {
        let qx = if K == Q8_0 {
            // SAFETY: a Q8_0 block is 34 bytes; its values are bytes 2..34.
            unsafe { _mm256_loadu_si256(w.add(2).cast()) }
        } else {
            // SAFETY: a Q4_0 block is 18 bytes; its nibbles are bytes 2..18.
            let raw = unsafe { _mm_loadu_si128(w.add(2).cast()) };
            _mm256_sub_epi8(nibbles(raw), _mm256_set1_epi8(8))
        };
        let ax = _mm256_sign_epi8(qx, qx);
        let sy = _mm256_sign_epi8(qy, qx);
        _mm256_maddubs_epi16(ax, sy)
    };
    _mm256_madd_epi16(products, ones)
}

/// Sixteen bytes of nibbles to 32 bytes: the low nibbles (values 0..16), then the high ones.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn nibbles(raw: __m128i) -> __m256i {
    let both = _mm256_set_m128i(_mm_srli_epi16::<4>(raw), raw);
    _mm256_and_si256(both, _mm256_set1_epi8(0xF))
}

/// `Σ_j w_j·x̂_j` of a weight row of format `K` and a quantized activation row.
///
/// # Safety
/// The CPU supports AVX2 and F16C.
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn dot<const K: u8>(row: &[u8], act: &Q8Row<'_>) -> f32 {
    let bb = block_bytes(K);
    // Clamp to what every buffer holds, so no read below can leave them.
    let nb = act
        .blocks()
        .min(row.len() / bb)
        .min(act.qs.len() / Q8_BLOCK)
        .min(act.d.len() / SCALE_LANES * SCALE_LANES)
        .min(act.s.len() / SCALE_LANES * SCALE_LANES);
    let (w0, y0) = (row.as_ptr(), act.qs.as_ptr());
    let mut acc = _mm256_setzero_ps();
    let mut acc_m = _mm256_setzero_ps();
    let mut g = 0;
    while g < nb {
        let count = (nb - g).min(8);
        let mut sums = [_mm256_setzero_si256(); 8];
        let mut dbits = [0u16; 8];
        let mut mbits = [0u16; 8];
        for k in 0..count {
            let b = g + k;
            // SAFETY: b < nb ≤ row.len()/bb and ≤ qs.len()/32: the block and its 32
            // activation bytes are in bounds.
            unsafe {
                let w = w0.add(b * bb);
                dbits[k] = u16::from_le_bytes([*w, *w.add(1)]);
                if K == Q4_1 {
                    mbits[k] = u16::from_le_bytes([*w.add(2), *w.add(3)]);
                }
                sums[k] = block_sums::<K>(w, y0.add(b * Q8_BLOCK));
            }
        }
        let isum = _mm256_cvtepi32_ps(reduce8(&sums));
        // SAFETY: `dbits` is 8 u16; g + 8 ≤ d.len() because nb ≤ d.len() rounded down to a
        // multiple of 8 and g < nb is a multiple of 8.
        let (dw, dx) = unsafe {
            (
                _mm256_cvtph_ps(_mm_loadu_si128(dbits.as_ptr().cast())),
                _mm256_loadu_ps(act.d.as_ptr().add(g)),
            )
        };
        acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_mul_ps(dw, dx), isum));
        if K == Q4_1 {
            // SAFETY: as for `dbits` and `act.d`.
            let (mw, sx) = unsafe {
                (
                    _mm256_cvtph_ps(_mm_loadu_si128(mbits.as_ptr().cast())),
                    _mm256_loadu_ps(act.s.as_ptr().add(g)),
                )
            };
            acc_m = _mm256_add_ps(acc_m, _mm256_mul_ps(mw, sx));
        }
        g += 8;
    }
    if K == Q4_1 {
        hsum(acc) + hsum(acc_m)
    } else {
        hsum(acc)
    }
}
