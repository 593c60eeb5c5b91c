//! AVX-512 VNNI matrix–vector kernel: the rows kernel of [`x86`](super::x86) with the integer
//! products of two blocks in one `vpdpbusd`, for the decode step's matrix–vector products.
//!
//! Per pair of blocks and weight row, the AVX2 kernel spends two `vpmaddubsw` + `vpmaddwd`
//! pairs and two conversions; here one 512-bit `vpdpbusd` (unsigned weight bytes × signed
//! activation bytes, four products summed into each i32 lane, no intermediate saturation) and
//! one conversion give both blocks' eight lane sums, the two 64-byte activation blocks being
//! contiguous. The lane sums are the same exact integers (the AVX2 pairs never saturate: see
//! `x86`), and the f32 combination is the AVX2 kernel's, block by block in the same order —
//! `acc = fma(d_w·d_x, lanes, acc)`, then the Q4_1 minimum term — so the result is
//! bit-identical to [`x86::dot_rows`](super::x86::dot_rows), to the scalar kernel and to
//! llama.cpp's AVX2 numerics: greedy parity does not depend on which of them runs.
//!
//! `vpsignb` has no 512-bit form, so for the signed formats the activation is negated under a
//! mask where the weight is negative (where it is zero its magnitude is zero, as the product).

use core::arch::x86_64::*;

use super::super::activation::{Q8_BLOCK, Q8Row, SCALE_LANES};
use super::x86::{Q4_0, Q4_1, Q8_0, block_bytes, hsum, lane_sums, scales, weights};

/// Whether this CPU runs the kernel: AVX-512 (F, BW, VL) with VNNI, besides AVX2, FMA and
/// F16C.
pub(crate) fn available() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni")
}

/// Two consecutive blocks' weights as `(unsigned multiplicand, sign source)` (see
/// [`weights`]), the first block in the lower 256 bits. The nibble formats unpack both blocks
/// at once: the two 16-byte halves side by side, shifted once, and the 128-bit lanes put in
/// value order (block b's low then high nibbles, then block b + 1's); Q8_0 loads both blocks'
/// values into one register; Q5_0 unpacks each block as the AVX2 kernel does.
///
/// # Safety
/// AVX-512 (F, BW) and AVX2; `w` points to two whole consecutive blocks of format `K`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn pair_weights<const K: u8>(w: *const u8) -> (__m512i, __m512i) {
    let bb = block_bytes(K);
    if K == Q4_1 || K == Q4_0 {
        let offset = if K == Q4_1 { 4 } else { 2 };
        // SAFETY: the 16 nibble bytes of each block start `offset` bytes into it (caller).
        let raw = unsafe { _mm256_loadu2_m128i(w.add(bb + offset).cast(), w.add(offset).cast()) };
        let both =
            _mm512_inserti64x4::<1>(_mm512_castsi256_si512(raw), _mm256_srli_epi16::<4>(raw));
        let q = _mm512_and_si512(
            _mm512_shuffle_i64x2::<0b11_01_10_00>(both, both),
            _mm512_set1_epi8(0xF),
        );
        if K == Q4_1 {
            (q, _mm512_setzero_si512())
        } else {
            let q = _mm512_sub_epi8(q, _mm512_set1_epi8(8));
            (_mm512_abs_epi8(q), q)
        }
    } else if K == Q8_0 {
        // SAFETY: a Q8_0 block's 32 values are its bytes 2..34 (caller: both blocks whole).
        let q = unsafe {
            _mm512_inserti64x4::<1>(
                _mm512_castsi256_si512(_mm256_loadu_si256(w.add(2).cast())),
                _mm256_loadu_si256(w.add(bb + 2).cast()),
            )
        };
        // |q| as the unsigned multiplicand (−128 stays 0x80 = 128, as `vpsignb` leaves it).
        (_mm512_abs_epi8(q), q)
    } else {
        // SAFETY: both blocks are whole (caller).
        let ((mag0, sign0), (mag1, sign1)) = unsafe { (weights::<K>(w), weights::<K>(w.add(bb))) };
        (
            _mm512_inserti64x4::<1>(_mm512_castsi256_si512(mag0), mag1),
            _mm512_inserti64x4::<1>(_mm512_castsi256_si512(sign0), sign1),
        )
    }
}

/// The sixteen exact lane sums of two consecutive blocks' products (the first block's eight,
/// then the second's), as f32: each half equals [`lane_sums`] of its block.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn pair_lane_sums<const K: u8>((mag, sign): (__m512i, __m512i), qy: __m512i) -> __m512 {
    let qy = if K == Q4_1 {
        qy
    } else {
        _mm512_mask_sub_epi8(qy, _mm512_movepi8_mask(sign), _mm512_setzero_si512(), qy)
    };
    _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), mag, qy))
}

/// The upper eight lanes of `v`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn upper(v: __m512) -> __m256 {
    _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)))
}

/// `R` weight rows of format `K` against one activation row; row `r` of the result has the
/// bits of [`x86::dot_rows`](super::x86::dot_rows) (and of the scalar kernel).
///
/// # Safety
/// The CPU supports the features [`available`] checks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn dot_rows<const K: u8, const R: usize>(
    rows: &[&[u8]; R],
    act: &Q8Row<'_>,
) -> [f32; R] {
    let bb = block_bytes(K);
    // Clamp to what every buffer holds, so no read below can leave them.
    let mut nb = act
        .blocks()
        .min(act.qs.len() / Q8_BLOCK)
        .min(act.d.len() / SCALE_LANES * SCALE_LANES)
        .min(act.s.len());
    for row in rows {
        nb = nb.min(row.len() / bb);
    }
    let w0: [*const u8; R] = core::array::from_fn(|r| rows[r].as_ptr());
    let y0 = act.qs.as_ptr();
    let s0 = act.s.as_ptr();
    let mut acc = [_mm256_setzero_ps(); R];
    let mut summs = [0.0f32; R];
    let mut dd = [[0.0f32; 8]; R];
    let mut mw = [[0.0f32; 8]; R];
    let mut g = 0;
    while g < nb {
        let count = (nb - g).min(8);
        // SAFETY: g + 8 ≤ d.len(): g < nb ≤ d.len() rounded down to a multiple of 8, and g is
        // a multiple of 8.
        let dx = unsafe { _mm256_loadu_ps(act.d.as_ptr().add(g)) };
        for r in 0..R {
            // SAFETY: blocks g .. g + count are below nb, within row r; `dd[r]`/`mw[r]` hold 8
            // floats.
            unsafe {
                let (dw, m) = scales::<K>(w0[r], g, count);
                _mm256_storeu_ps(dd[r].as_mut_ptr(), _mm256_mul_ps(dw, dx));
                _mm256_storeu_ps(mw[r].as_mut_ptr(), m);
            }
        }
        let mut k = 0;
        while k + 1 < count {
            let b = g + k;
            // SAFETY: b + 1 < nb: the activation bytes of blocks b and b + 1 (64 contiguous
            // bytes) and their sums are in bounds.
            let (qy, sx0, sx1) = unsafe {
                (
                    _mm512_loadu_si512(y0.add(b * Q8_BLOCK).cast()),
                    *s0.add(b),
                    *s0.add(b + 1),
                )
            };
            for r in 0..R {
                // SAFETY: b + 1 < nb: blocks b and b + 1 of row r are in bounds.
                let lanes =
                    unsafe { pair_lane_sums::<K>(pair_weights::<K>(w0[r].add(b * bb)), qy) };
                acc[r] = _mm256_fmadd_ps(
                    _mm256_set1_ps(dd[r][k]),
                    _mm512_castps512_ps256(lanes),
                    acc[r],
                );
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dd[r][k + 1]), upper(lanes), acc[r]);
                if K == Q4_1 {
                    summs[r] = mw[r][k].mul_add(sx0, summs[r]);
                    summs[r] = mw[r][k + 1].mul_add(sx1, summs[r]);
                }
            }
            k += 2;
        }
        if k < count {
            // An odd last block: the AVX2 kernel's step.
            let b = g + k;
            // SAFETY: b < nb: the activation bytes and sum of block b are in bounds.
            let (qy, sx) = unsafe { (_mm256_loadu_si256(y0.add(b * Q8_BLOCK).cast()), *s0.add(b)) };
            for r in 0..R {
                // SAFETY: b < nb: block b of row r is in bounds.
                let (mag, sign) = unsafe { weights::<K>(w0[r].add(b * bb)) };
                acc[r] = _mm256_fmadd_ps(
                    _mm256_set1_ps(dd[r][k]),
                    lane_sums::<K>(mag, sign, qy),
                    acc[r],
                );
                if K == Q4_1 {
                    summs[r] = mw[r][k].mul_add(sx, summs[r]);
                }
            }
        }
        g += 8;
    }
    core::array::from_fn(|r| {
        if K == Q4_1 {
            hsum(acc[r]) + summs[r]
        } else {
            hsum(acc[r])
        }
    })
}
