//! AVX-512 VNNI matrix products in the block-lanes order: weight rows against sixteen tokens at
//! once, tokens in the vector lanes.
//!
//! Per weight block and token group ([`Q8Panel`]): eight `vpdpbusd`, each multiplying one
//! broadcast word of four signed weights by the same four values (unsigned, +128) of sixteen
//! tokens and adding the four products into each token's i32 lane; minus `128·Σw` that is the
//! block's exact integer sum for every token at once. The f32 steps are then those of
//! [`combine_block_lanes`](super::scalar::combine_block_lanes), lane by lane: `dd = d_w·d_x`,
//! the term `dd·isum` (Q4_1: `fma(dd, isum, m_w·s_x)`), added to the running sum of the block's
//! index mod 8 — eight accumulators per row, so each token's result has the bits the scalar
//! kernel gives it, whatever the group, the thread or the instruction set.
//!
//! Per block and sixteen tokens that is about twelve instructions per weight row where a row
//! kernel spends about seven per token: the products of a prefill chunk stop being bound by
//! instructions. No step overflows: a product is at most `255·128`, a block's sum at most
//! `32·255·128 < 2²⁰`, and `vpdpbusd` does not saturate.

use core::arch::x86_64::*;

use super::panel::{GemmBufs, PANEL_BLOCK_BYTES, PANEL_TOKENS, Q8Panel, UnpackedRow};
use super::x86::{Q4_1, block_bytes, unpack_row};

/// `out[r·n + i]` = row `r` of `rows` against token `i` of `panel`, for the `n` tokens the
/// panel holds, two rows at a time (one for an odd last row). `bufs` is unpacking space.
///
/// # Safety
/// The CPU supports AVX-512 F, BW and VNNI besides AVX2, FMA and F16C.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn gemm<const K: u8>(
    rows: &[&[u8]],
    panel: &Q8Panel,
    n: usize,
    out: &mut [f32],
    bufs: &mut GemmBufs,
) {
    let bufs = &mut bufs.rows;
    let (nb, n, rows) = panel.clamp(rows, block_bytes(K), n, out.len());
    let mut r0 = 0;
    while r0 < rows.len() {
        let pair = rows.len() - r0 >= 2;
        // SAFETY: every row holds nb blocks (`Q8Panel::clamp`).
        unsafe {
            unpack_row::<K>(&mut bufs[0], rows[r0], nb);
            if pair {
                unpack_row::<K>(&mut bufs[1], rows[r0 + 1], nb);
            }
        }
        for g in 0..n.div_ceil(PANEL_TOKENS) {
            let (qs, d, s) = panel.group(g);
            let valid = (n - g * PANEL_TOKENS).min(PANEL_TOKENS);
            let at = g * PANEL_TOKENS;
            // SAFETY: the group holds nb blocks (`Q8Panel::clamp`: nb is at most the panel's blocks); each unpacked row holds
            // nb blocks; out holds rows·n values, and row r's tokens at..at + valid are below n.
            unsafe {
                if pair {
                    let sums = group_sums::<K, 2>([&bufs[0], &bufs[1]], nb, qs, d, s);
                    store(&mut out[r0 * n + at..], sums[0], valid);
                    store(&mut out[(r0 + 1) * n + at..], sums[1], valid);
                } else {
                    let sums = group_sums::<K, 1>([&bufs[0]], nb, qs, d, s);
                    store(&mut out[r0 * n + at..], sums[0], valid);
                }
            }
        }
        r0 += if pair { 2 } else { 1 };
    }
}

/// Writes the first `valid` lanes of `v` to `out`.
///
/// # Safety
/// AVX-512 F; `out` holds at least `valid ≤ 16` values.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn store(out: &mut [f32], v: __m512, valid: usize) {
    let mask = ((1u32 << valid) - 1) as __mmask16;
    // SAFETY: the masked lanes lie within `out` (caller).
    unsafe { _mm512_mask_storeu_ps(out.as_mut_ptr(), mask, v) }
}

/// The `R` rows' results for one token group: blocks `0..nb`, the running sums by block index
/// mod 8, summed as `hsum8`.
///
/// # Safety
/// AVX-512 F/BW/VNNI; `qs`, `d`, `s` hold `nb` blocks of the group, each row `nb` blocks.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn group_sums<const K: u8, const R: usize>(
    rows: [&UnpackedRow; R],
    nb: usize,
    qs: &[u8],
    d: &[f32],
    s: &[f32],
) -> [__m512; R] {
    debug_assert!(qs.len() >= nb * PANEL_BLOCK_BYTES && d.len() >= nb * PANEL_TOKENS);
    let mut acc = [[_mm512_setzero_ps(); 8]; R];
    let full = nb / 8 * 8;
    let mut b = 0;
    while b < full {
        for k in 0..8 {
            // SAFETY: b + k < nb (caller's bounds).
            unsafe { block_step::<K, R>(&rows, b + k, qs, d, s, &mut acc, k) };
        }
        b += 8;
    }
    for k in 0..8 {
        if b + k < nb {
            // SAFETY: as above.
            unsafe { block_step::<K, R>(&rows, b + k, qs, d, s, &mut acc, k) };
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

/// Adds block `b`'s term to running sum `k` of each row.
///
/// # Safety
/// AVX-512 F/BW/VNNI; block `b` is within `qs`, `d`, `s` and every row.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn block_step<const K: u8, const R: usize>(
    rows: &[&UnpackedRow; R],
    b: usize,
    qs: &[u8],
    d: &[f32],
    s: &[f32],
    acc: &mut [[__m512; 8]; R],
    k: usize,
) {
    // SAFETY: the caller's bounds cover block b; loads are unaligned; `read_unaligned` reads a
    // word of four weights inside row r's 32 values of block b.
    unsafe {
        let a = qs.as_ptr().add(b * PANEL_BLOCK_BYTES);
        let mut even = [_mm512_setzero_si512(); R];
        let mut odd = [_mm512_setzero_si512(); R];
        for c in (0..8).step_by(2) {
            let a0 = _mm512_loadu_si512(a.add(c * 64).cast());
            let a1 = _mm512_loadu_si512(a.add((c + 1) * 64).cast());
            for r in 0..R {
                let w = rows[r].values.as_ptr().add(32 * b + 4 * c).cast::<i32>();
                even[r] = _mm512_dpbusd_epi32(even[r], a0, _mm512_set1_epi32(w.read_unaligned()));
                odd[r] =
                    _mm512_dpbusd_epi32(odd[r], a1, _mm512_set1_epi32(w.add(1).read_unaligned()));
            }
        }
        let dx = _mm512_loadu_ps(d.as_ptr().add(b * PANEL_TOKENS));
        let sx = if K == Q4_1 {
            _mm512_loadu_ps(s.as_ptr().add(b * PANEL_TOKENS))
        } else {
            _mm512_setzero_ps()
        };
        for r in 0..R {
            let row = rows[r];
            let isum = _mm512_sub_epi32(
                _mm512_add_epi32(even[r], odd[r]),
                _mm512_set1_epi32(*row.correction.get_unchecked(b)),
            );
            let f = _mm512_cvtepi32_ps(isum);
            let dd = _mm512_mul_ps(_mm512_set1_ps(*row.d.get_unchecked(b)), dx);
            let t = if K == Q4_1 {
                let ms = _mm512_mul_ps(_mm512_set1_ps(*row.m.get_unchecked(b)), sx);
                _mm512_fmadd_ps(dd, f, ms)
            } else {
                _mm512_mul_ps(dd, f)
            };
            acc[r][k] = _mm512_add_ps(acc[r][k], t);
        }
    }
}
