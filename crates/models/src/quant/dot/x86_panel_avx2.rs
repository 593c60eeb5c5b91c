//! AVX2 matrix products in the block-lanes order, tokens in the vector lanes: the kernel of
//! [`x86_vnni`](super::x86_vnni) for CPUs without VNNI, eight tokens per 256-bit vector.
//!
//! Per weight block, for the eight tokens of half a [`Q8Panel`] group: eight `vpmaddubsw`, each
//! multiplying the same four values (unsigned, +128) of eight tokens by one broadcast word of
//! four signed weights into pairs of 16-bit sums; four of those added in 16 bits and widened by
//! one `vpmaddwd` against ones, twice; minus `128·Σw`: the block's exact integer sum for the
//! eight tokens. Then the f32 steps of the block-lanes order lane by lane, as the VNNI kernel
//! does, so every token's result has the scalar kernel's bits.
//!
//! No step saturates for the formats served here (Q4_0, Q4_1, Q5_0: `|w| ≤ 16`): a pair is at
//! most `2·255·16 = 8160`, four pairs `32640 < 2¹⁵`. Q8_0 weights (`|w| ≤ 128`) would saturate
//! a pair, so Q8_0 keeps the tile kernel.

use core::arch::x86_64::*;

use super::panel::{GemmBufs, PANEL_BLOCK_BYTES, PANEL_TOKENS, Q8Panel, UnpackedRow};
use super::x86::{Q4_1, block_bytes, unpack_row};

/// Tokens per vector.
const HALF: usize = PANEL_TOKENS / 2;

/// `out[r·n + i]` = row `r` of `rows` against token `i` of `panel`, for the `n` tokens the
/// panel holds. `bufs` is unpacking space.
///
/// # Safety
/// The CPU supports AVX2, FMA and F16C; `K` is Q4_0, Q4_1 or Q5_0.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn gemm<const K: u8>(
    rows: &[&[u8]],
    panel: &Q8Panel,
    n: usize,
    out: &mut [f32],
    bufs: &mut GemmBufs,
) {
    let (nb, n, rows) = panel.clamp(rows, block_bytes(K), n, out.len());
    let buf = &mut bufs.rows[0];
    for (r, row) in rows.iter().enumerate() {
        // SAFETY: the row holds nb blocks (`Q8Panel::clamp`).
        unsafe { unpack_row::<K>(buf, row, nb) };
        for h in 0..n.div_ceil(HALF) {
            let (g, half) = (h / 2, h % 2);
            let (qs, d, s) = panel.group(g);
            // SAFETY: the group holds nb blocks (`Q8Panel::clamp`: nb is at most the panel's blocks), the row nb blocks.
            let sums = unsafe { half_sums::<K>(buf, nb, qs, d, s, half) };
            let at = h * HALF;
            let valid = (n - at).min(HALF);
            out[r * n + at..r * n + at + valid].copy_from_slice(&sums[..valid]);
        }
    }
}

/// One row's results for tokens `8·half .. 8·half + 8` of a group: blocks `0..nb`.
///
/// # Safety
/// AVX2/FMA/F16C; `qs`, `d`, `s` hold `nb` blocks of the group, `row` `nb` blocks.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn half_sums<const K: u8>(
    row: &UnpackedRow,
    nb: usize,
    qs: &[u8],
    d: &[f32],
    s: &[f32],
    half: usize,
) -> [f32; HALF] {
    debug_assert!(qs.len() >= nb * PANEL_BLOCK_BYTES && d.len() >= nb * PANEL_TOKENS);
    let mut acc = [_mm256_setzero_ps(); 8];
    let full = nb / 8 * 8;
    let mut b = 0;
    while b < full {
        for (k, acc) in acc.iter_mut().enumerate() {
            // SAFETY: b + k < nb.
            unsafe { block_step::<K>(row, b + k, qs, d, s, half, acc) };
        }
        b += 8;
    }
    for (k, acc) in acc.iter_mut().enumerate().take(nb - full) {
        // SAFETY: b + k < nb.
        unsafe { block_step::<K>(row, b + k, qs, d, s, half, acc) };
    }
    lane_trees(&acc)
}

/// Adds block `b`'s term for the half group's eight tokens to `acc`.
///
/// # Safety
/// AVX2/FMA/F16C; block `b` is within `qs`, `d`, `s` and `row`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block_step<const K: u8>(
    row: &UnpackedRow,
    b: usize,
    qs: &[u8],
    d: &[f32],
    s: &[f32],
    half: usize,
    acc: &mut __m256,
) {
    // SAFETY: each load lies in block b of the group or of the row (caller); `read_unaligned`
    // reads a word of four weights of block b.
    unsafe {
        let a = qs.as_ptr().add(b * PANEL_BLOCK_BYTES + half * 32);
        let w = row.values.as_ptr().add(32 * b).cast::<i32>();
        let mut pairs = [_mm256_setzero_si256(); 8];
        for (c, p) in pairs.iter_mut().enumerate() {
            *p = _mm256_maddubs_epi16(
                _mm256_loadu_si256(a.add(c * 64).cast()),
                _mm256_set1_epi32(w.add(c).read_unaligned()),
            );
        }
        let lo = _mm256_add_epi16(
            _mm256_add_epi16(pairs[0], pairs[1]),
            _mm256_add_epi16(pairs[2], pairs[3]),
        );
        let hi = _mm256_add_epi16(
            _mm256_add_epi16(pairs[4], pairs[5]),
            _mm256_add_epi16(pairs[6], pairs[7]),
        );
        let ones = _mm256_set1_epi16(1);
        let isum = _mm256_sub_epi32(
            _mm256_add_epi32(_mm256_madd_epi16(lo, ones), _mm256_madd_epi16(hi, ones)),
            _mm256_set1_epi32(*row.correction.get_unchecked(b)),
        );
        let f = _mm256_cvtepi32_ps(isum);
        let at = b * PANEL_TOKENS + half * HALF;
        let dx = _mm256_loadu_ps(d.as_ptr().add(at));
        let dd = _mm256_mul_ps(_mm256_set1_ps(*row.d.get_unchecked(b)), dx);
        let t = if K == Q4_1 {
            let sx = _mm256_loadu_ps(s.as_ptr().add(at));
            let ms = _mm256_mul_ps(_mm256_set1_ps(*row.m.get_unchecked(b)), sx);
            _mm256_fmadd_ps(dd, f, ms)
        } else {
            _mm256_mul_ps(dd, f)
        };
        *acc = _mm256_add_ps(*acc, t);
    }
}

/// Lane by lane, `((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7))` of eight accumulators (the
/// block-lanes order's final tree, `hsum8`, for eight tokens at once).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn lane_trees(a: &[__m256; 8]) -> [f32; HALF] {
    let v = _mm256_add_ps(
        _mm256_add_ps(_mm256_add_ps(a[0], a[4]), _mm256_add_ps(a[2], a[6])),
        _mm256_add_ps(_mm256_add_ps(a[1], a[5]), _mm256_add_ps(a[3], a[7])),
    );
    let mut out = [0.0f32; HALF];
    // SAFETY: `out` holds eight floats.
    unsafe { _mm256_storeu_ps(out.as_mut_ptr(), v) };
    out
}
