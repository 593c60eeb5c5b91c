//! AVX-512 VNNI matrix products of the K formats (Q4_K, Q6_K) in the block-lanes order:
//! weight rows against sixteen tokens at once, tokens in the vector lanes.
//!
//! Per weight super-block and token group ([`Q8KPanel`]): one `vpdpbusd` per word of four
//! weights (64 per super-block and row), each adding four products into every token's i32
//! lane; per sub-block (Q4_K: 32 values, Q6_K: 16) the raw sum times the integer sub-block
//! scale (`vpmulld`), minus the unpacked row's `128·Σ_j sc_j·Σw_j` — the exact integer `I` of
//! [`dot_q4k_block_lanes`](super::kquant::dot_q4k_block_lanes) /
//! [`dot_q6k_block_lanes`](super::kquant::dot_q6k_block_lanes) for sixteen tokens. Q6_K's
//! weights are unpacked as `q − 32`, so its offset needs no activation sums; Q4_K's minimum
//! term `M = Σ_j m_j·S_j` is four `vpmaddwd` of the panel's sub-block sums against words of
//! two minimums. The f32 steps are then the scalar kernels', lane by lane, so each token's
//! result has the bits the scalar kernel gives it.
//!
//! No step overflows: a Q4_K sub-block's raw sum is at most `32·15·255`, times a scale ≤ 63,
//! eight of them `< 2²⁶`; a Q6_K one at most `16·32·255`, times `|sc| ≤ 128`, sixteen `< 2²⁸`;
//! `|S_j| ≤ 32·127` and `m_j ≤ 63` keep each `vpmaddwd` pair far inside i32.

use core::arch::x86_64::*;

use super::panel::{GemmBufs, PANEL_TOKENS, UnpackedRow};
use super::panel_k::{PANEL_SUPER_BYTES, Q4K_BYTES, Q6K_BYTES, Q8KPanel, unpack_q4k, unpack_q6k};
use super::x86_vnni::store;

/// Q4_K, the const parameter of [`gemm`].
pub(crate) const Q4K: u8 = 0;
/// Q6_K, the const parameter of [`gemm`].
pub(crate) const Q6K: u8 = 1;

/// `out[r·n + i]` = row `r` of `rows` (format `K`) against token `i` of `panel`, for the `n`
/// tokens the panel holds, two rows at a time (one for an odd last row).
///
/// # Safety
/// The CPU supports AVX-512 F, BW and VNNI besides AVX2, FMA and F16C.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn gemm<const K: u8>(
    rows: &[&[u8]],
    panel: &Q8KPanel,
    n: usize,
    out: &mut [f32],
    bufs: &mut GemmBufs,
) {
    let bufs = &mut bufs.rows;
    let bb = if K == Q4K { Q4K_BYTES } else { Q6K_BYTES };
    let unpack = |buf: &mut UnpackedRow, row: &[u8], nb: usize| {
        if K == Q4K {
            unpack_q4k(buf, row, nb)
        } else {
            unpack_q6k(buf, row, nb)
        }
    };
    let (nb, n, rows) = panel.clamp(rows, bb, n, out.len());
    let mut r0 = 0;
    while r0 < rows.len() {
        let pair = rows.len() - r0 >= 2;
        unpack(&mut bufs[0], rows[r0], nb);
        if pair {
            unpack(&mut bufs[1], rows[r0 + 1], nb);
        }
        for g in 0..n.div_ceil(PANEL_TOKENS) {
            let (qs, d, sums) = panel.group(g);
            let valid = (n - g * PANEL_TOKENS).min(PANEL_TOKENS);
            let at = g * PANEL_TOKENS;
            // SAFETY: the group and each unpacked row hold nb super-blocks (`Q8KPanel::clamp`);
            // out holds rows·n values, and row r's tokens at..at + valid are below n.
            unsafe {
                if pair {
                    let s = group_sums::<K, 2>([&bufs[0], &bufs[1]], nb, qs, d, sums);
                    store(&mut out[r0 * n + at..], s[0], valid);
                    store(&mut out[(r0 + 1) * n + at..], s[1], valid);
                } else {
                    let s = group_sums::<K, 1>([&bufs[0]], nb, qs, d, sums);
                    store(&mut out[r0 * n + at..], s[0], valid);
                }
            }
        }
        r0 += if pair { 2 } else { 1 };
    }
}

/// The `R` rows' results for one token group: super-blocks `0..nb`, the running sums by
/// super-block index mod 8, summed as `hsum8`.
///
/// # Safety
/// AVX-512 F/BW/VNNI; `qs`, `d`, `sums` hold `nb` super-blocks of the group, each row `nb`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn group_sums<const K: u8, const R: usize>(
    rows: [&UnpackedRow; R],
    nb: usize,
    qs: &[u8],
    d: &[f32],
    sums: &[i16],
) -> [__m512; R] {
    debug_assert!(qs.len() >= nb * PANEL_SUPER_BYTES && d.len() >= nb * PANEL_TOKENS);
    debug_assert!(sums.len() >= nb * 8 * PANEL_TOKENS);
    let mut acc = [[_mm512_setzero_ps(); 8]; R];
    for b in 0..nb {
        // SAFETY: b < nb (caller's bounds).
        let terms = unsafe { super_block_terms::<K, R>(&rows, b, qs, d, sums) };
        for r in 0..R {
            acc[r][b % 8] = _mm512_add_ps(acc[r][b % 8], terms[r]);
        }
    }
    core::array::from_fn(|r| {
        let a = &acc[r];
        _mm512_add_ps(
            _mm512_add_ps(_mm512_add_ps(a[0], a[4]), _mm512_add_ps(a[2], a[6])),
            _mm512_add_ps(_mm512_add_ps(a[1], a[5]), _mm512_add_ps(a[3], a[7])),
        )
    })
}

/// Super-block `b`'s f32 term of each row, for the sixteen tokens.
///
/// # Safety
/// AVX-512 F/BW/VNNI; super-block `b` is within `qs`, `d`, `sums` and every row.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn super_block_terms<const K: u8, const R: usize>(
    rows: &[&UnpackedRow; R],
    b: usize,
    qs: &[u8],
    d: &[f32],
    sums: &[i16],
) -> [__m512; R] {
    let subs = if K == Q4K { 8 } else { 16 };
    let quads = 64 / subs;
    // SAFETY: the caller's bounds cover super-block b: 4096 panel bytes at b·4096, 16 scales
    // and 128 sums; each row's 256 values at 256·b, `subs` scales, 4 minimum words; loads are
    // unaligned, and `read_unaligned` reads a word of four weights inside row r's values.
    unsafe {
        let base = qs.as_ptr().add(b * PANEL_SUPER_BYTES);
        let mut isum = [_mm512_setzero_si512(); R];
        for s in 0..subs {
            let mut even = [_mm512_setzero_si512(); R];
            let mut odd = [_mm512_setzero_si512(); R];
            for c in (0..quads).step_by(2) {
                let q = s * quads + c;
                let a0 = _mm512_loadu_si512(base.add(q * 64).cast());
                let a1 = _mm512_loadu_si512(base.add((q + 1) * 64).cast());
                for r in 0..R {
                    let w = rows[r].values.as_ptr().add(256 * b + 4 * q).cast::<i32>();
                    even[r] =
                        _mm512_dpbusd_epi32(even[r], a0, _mm512_set1_epi32(w.read_unaligned()));
                    odd[r] = _mm512_dpbusd_epi32(
                        odd[r],
                        a1,
                        _mm512_set1_epi32(w.add(1).read_unaligned()),
                    );
                }
            }
            for r in 0..R {
                let sc = _mm512_set1_epi32(*rows[r].scales.get_unchecked(subs * b + s));
                let raw = _mm512_add_epi32(even[r], odd[r]);
                isum[r] = _mm512_add_epi32(isum[r], _mm512_mullo_epi32(raw, sc));
            }
        }
        let dx = _mm512_loadu_ps(d.as_ptr().add(b * PANEL_TOKENS));
        let sub_sums: [__m512i; 4] = core::array::from_fn(|k| {
            if K == Q4K {
                _mm512_loadu_si512(sums.as_ptr().add((b * 4 + k) * 2 * PANEL_TOKENS).cast())
            } else {
                _mm512_setzero_si512()
            }
        });
        core::array::from_fn(|r| {
            let row = rows[r];
            let i = _mm512_sub_epi32(isum[r], _mm512_set1_epi32(*row.correction.get_unchecked(b)));
            let dd = _mm512_mul_ps(_mm512_set1_ps(*row.d.get_unchecked(b)), dx);
            if K == Q4K {
                let mut m = _mm512_setzero_si512();
                for (k, s) in sub_sums.iter().enumerate() {
                    let mins = _mm512_set1_epi32(*row.mins.get_unchecked(4 * b + k));
                    m = _mm512_add_epi32(m, _mm512_madd_epi16(*s, mins));
                }
                let mm = _mm512_mul_ps(_mm512_set1_ps(*row.m.get_unchecked(b)), dx);
                let mm_m = _mm512_mul_ps(mm, _mm512_cvtepi32_ps(m));
                _mm512_fmsub_ps(dd, _mm512_cvtepi32_ps(i), mm_m)
            } else {
                _mm512_mul_ps(dd, _mm512_cvtepi32_ps(i))
            }
        })
    }
}
