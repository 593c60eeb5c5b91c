//! AVX2 (+ FMA, F16C) row kernels of the K formats against Q8_K activations: llama.cpp's AVX2
//! `ggml_vec_dot_q4_K_q8_K` and `ggml_vec_dot_q6_K_q8_K`, step for step, ending each
//! super-block in the [`KQuantOrder::VecDot`](super::KQuantOrder::VecDot) order (`BL = false`)
//! or the [`KQuantOrder::BlockLanes`](super::KQuantOrder::BlockLanes) order (`BL = true`: the
//! lanes' integers summed exactly, then one f32 term per super-block, as `kquant` defines it).
//!
//! Per 32 weight bytes, `vpmaddubsw` multiplies the unsigned codes (Q4_K nibbles 0..=15, Q6_K
//! six-bit values 0..=63) by the signed activation bytes into i16 pairs and `vpmaddwd` by the
//! sub-block scale into i32, leaving in lane `l` the scaled products of values `4l..4l+4` of
//! the 32 — the lanes the scalar kernels in `kquant` spell out. Nothing saturates: a pair is
//! at most `2·63·127 = 16002 < 2¹⁵` because Q8_K bytes lie in −127..=127. The f32 steps are
//! the scalar kernels' (VecDot: one FMA per super-block into eight lanes, the Q4_K minimum
//! term in four lanes, the same final sums; BlockLanes: the same integers, then the scalar
//! steps themselves), so every result is bit-identical to the scalar kernel's;
//! `tests/quant_kquant.rs` checks that on random blocks.
//!
//! The entry points are `unsafe` because they need AVX2/FMA/F16C; the dispatcher hands them
//! out only after runtime detection. Loads go through raw pointers into slices whose length
//! was checked by indexing just before.

use core::arch::x86_64::*;

use super::super::activation_k::{Q8KRow, QK_K};
use super::super::dequant::f16_at;
use super::x86::prefetch_ahead;

/// Bytes of a Q4_K super-block.
const Q4K_BYTES: usize = 144;
/// Bytes of a Q6_K super-block.
const Q6K_BYTES: usize = 210;

/// 32 bytes from the start of `bytes` (which must hold at least 32).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn load32(bytes: &[u8]) -> __m256i {
    let bytes = &bytes[..32];
    // SAFETY: `bytes` holds exactly 32 readable bytes; the load is unaligned.
    unsafe { _mm256_loadu_si256(bytes.as_ptr().cast()) }
}

/// 32 activation bytes from the start of `y` (which must hold at least 32).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn load32_i8(y: &[i8]) -> __m256i {
    let y = &y[..32];
    // SAFETY: as `load32`.
    unsafe { _mm256_loadu_si256(y.as_ptr().cast()) }
}

/// The sixteen i16 sums of a super-block (which must hold at least 16).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn load_sums(sums: &[i16]) -> __m256i {
    let sums = &sums[..16];
    // SAFETY: `sums` holds exactly 32 readable bytes; the load is unaligned.
    unsafe { _mm256_loadu_si256(sums.as_ptr().cast()) }
}

/// `((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))`, as the scalar `hsum8` (llama.cpp's
/// `hsum_float_8`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hsum8(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let t = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)))
}

/// The exact sum of eight i32 lanes (no lane sum overflows: see the scalar kernels' bounds).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hsum_epi32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    hsum4_epi32(s)
}

/// The exact sum of four i32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hsum4_epi32(s: __m128i) -> i32 {
    let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32::<1>(s)))
}

/// The eight 6-bit scales and eight 6-bit minimums of a Q4_K super-block as one u32 quartet
/// (bytes 0..8 scales, 8..16 minimums), unpacked as llama.cpp does with `kmask1..3`.
#[inline]
fn q4k_scales_and_mins(packed: &[u8]) -> [u32; 4] {
    const KMASK1: u32 = 0x3f3f_3f3f;
    const KMASK2: u32 = 0x0f0f_0f0f;
    const KMASK3: u32 = 0x0303_0303;
    let word =
        |i: usize| u32::from_le_bytes([packed[i], packed[i + 1], packed[i + 2], packed[i + 3]]);
    let (u0, u1, u2) = (word(0), word(4), word(8));
    [
        u0 & KMASK1,
        (u2 & KMASK2) | (((u0 >> 6) & KMASK3) << 4),
        u1 & KMASK1,
        ((u2 >> 4) & KMASK2) | (((u1 >> 6) & KMASK3) << 4),
    ]
}

/// Q4_K · Q8_K (see the module docs).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C. `row` holds whole super-blocks and `act` at least
/// as many values (the dispatcher's callers check both).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q4k<const BL: bool>(row: &[u8], act: &Q8KRow<'_>) -> f32 {
    let m4 = _mm256_set1_epi8(0xF);
    let mut acc = _mm256_setzero_ps();
    let mut acc_m = _mm_setzero_ps();
    let mut terms = [0.0f32; 8];
    for (b, w) in row.chunks_exact(Q4K_BYTES).enumerate() {
        prefetch_ahead(w.as_ptr(), Q4K_BYTES);
        let y = &act.qs[b * QK_K..(b + 1) * QK_K];
        let d = act.d[b] * f16_at(w, 0);
        let dmin = -act.d[b] * f16_at(w, 2);
        let u = q4k_scales_and_mins(&w[4..16]);
        let mins_and_scales = _mm256_cvtepu8_epi16(_mm_set_epi32(
            u[3] as i32,
            u[2] as i32,
            u[1] as i32,
            u[0] as i32,
        ));
        let sums = load_sums(&act.bsums[b * 16..(b + 1) * 16]);
        let q8s = _mm_hadd_epi16(
            _mm256_castsi256_si128(sums),
            _mm256_extracti128_si256::<1>(sums),
        );
        let prod = _mm_madd_epi16(_mm256_extracti128_si256::<1>(mins_and_scales), q8s);
        if !BL {
            acc_m = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(prod), acc_m);
        }
        let scale = |s: u32| _mm256_set1_epi16((s & 0xFF) as i16);
        let mut sumi = _mm256_setzero_si256();
        for j in 0..QK_K / 64 {
            let word = u[j / 2] >> (16 * (j % 2));
            let (scale_l, scale_h) = (scale(word), scale(word >> 8));
            let bits = load32(&w[16 + 32 * j..]);
            let q4l = _mm256_and_si256(bits, m4);
            let q4h = _mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4);
            let pl = _mm256_madd_epi16(scale_l, _mm256_maddubs_epi16(q4l, load32_i8(&y[64 * j..])));
            let ph = _mm256_madd_epi16(
                scale_h,
                _mm256_maddubs_epi16(q4h, load32_i8(&y[64 * j + 32..])),
            );
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(pl, ph));
        }
        if BL {
            let (i, m) = (hsum_epi32(sumi), hsum4_epi32(prod));
            // −dmin·M rounds as −(mm·M): negation is exact.
            terms[b % 8] += d.mul_add(i as f32, dmin * m as f32);
        } else {
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        }
    }
    if BL {
        return super::scalar::hsum8(&terms);
    }
    let acc_m = _mm_add_ps(acc_m, _mm_movehl_ps(acc_m, acc_m));
    let acc_m = _mm_add_ss(acc_m, _mm_movehdup_ps(acc_m));
    hsum8(acc) + _mm_cvtss_f32(acc_m)
}

/// Q6_K · Q8_K (see the module docs); the offset of 32 is subtracted per lane from the stored
/// activation sums, as the scalar kernel documents.
///
/// # Safety
/// As [`dot_q4k`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q6k<const BL: bool>(row: &[u8], act: &Q8KRow<'_>) -> f32 {
    let m15 = _mm256_set1_epi8(15);
    let mut acc = _mm256_setzero_ps();
    let mut terms = [0.0f32; 8];
    for (b, w) in row.chunks_exact(Q6K_BYTES).enumerate() {
        prefetch_ahead(w.as_ptr(), Q6K_BYTES);
        let y = &act.qs[b * QK_K..(b + 1) * QK_K];
        let d = act.d[b] * f16_at(w, 208);
        let sc = &w[192..208];
        let scales16 = {
            // SAFETY: `sc` holds exactly 16 readable bytes; the load is unaligned.
            let raw = unsafe { _mm_loadu_si128(sc.as_ptr().cast()) };
            _mm256_cvtepi8_epi16(raw)
        };
        let sums = load_sums(&act.bsums[b * 16..(b + 1) * 16]);
        let offset = _mm256_slli_epi32::<5>(_mm256_madd_epi16(sums, scales16));
        // Sixteen i16 lanes: eight of scale `s`, eight of scale `s + 1`.
        let pair = |s: usize| {
            _mm256_set_m128i(
                _mm_set1_epi16(i16::from(sc[s + 1] as i8)),
                _mm_set1_epi16(i16::from(sc[s] as i8)),
            )
        };
        let mut sumi = _mm256_setzero_si256();
        for half in 0..2 {
            let bits1 = load32(&w[64 * half..]);
            let bits2 = load32(&w[64 * half + 32..]);
            let high = load32(&w[128 + 32 * half..]);
            let h0 = _mm256_slli_epi16::<4>(_mm256_and_si256(high, _mm256_set1_epi8(3)));
            let h1 = _mm256_slli_epi16::<2>(_mm256_and_si256(high, _mm256_set1_epi8(12)));
            let h2 = _mm256_and_si256(high, _mm256_set1_epi8(48));
            let h3 = _mm256_srli_epi16::<2>(_mm256_and_si256(high, _mm256_set1_epi8(-64)));
            let q = [
                _mm256_or_si256(_mm256_and_si256(bits1, m15), h0),
                _mm256_or_si256(_mm256_and_si256(bits2, m15), h1),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(bits1), m15), h2),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(bits2), m15), h3),
            ];
            let p: [__m256i; 4] = core::array::from_fn(|k| {
                let yk = load32_i8(&y[128 * half + 32 * k..]);
                _mm256_madd_epi16(pair(8 * half + 2 * k), _mm256_maddubs_epi16(q[k], yk))
            });
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p[0], p[1]));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p[2], p[3]));
        }
        let sumi = _mm256_sub_epi32(sumi, offset);
        if BL {
            terms[b % 8] += d * hsum_epi32(sumi) as f32;
        } else {
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        }
    }
    if BL {
        return super::scalar::hsum8(&terms);
    }
    hsum8(acc)
}
