//! AVX2 matrix products of the K formats (Q4_K, Q6_K) in the block-lanes order, tokens in the
//! vector lanes: the kernel of [`x86_vnni_kquant`](super::x86_vnni_kquant) for CPUs without
//! VNNI, eight tokens per 256-bit vector, over the same [`Q8KPanel`].
//!
//! Per sub-block and eight tokens: one `vpmaddubsw` per word of four weights (the tokens' four
//! values unsigned, +128, times the broadcast signed weights) into pairs of 16-bit sums, added
//! in 16 bits as far as they cannot saturate and widened by `vpmaddwd` against ones; the raw
//! sum times the sub-block scale (`vpmulld`); minus `128·Σ_j sc_j·Σw_j` per super-block: the
//! exact `I` of the scalar definition. Q4_K's minimum term is two `vpmaddwd` of the panel's
//! i16 sub-block sums against words of two minimums per pair of sub-blocks, as in the VNNI
//! kernel. The f32 steps are the scalar ones lane by lane, so every token's result has the
//! scalar kernel's bits.
//!
//! No step saturates: a Q4_K pair is at most `2·255·15 = 7650` and four are added
//! (`30600 < 2¹⁵`); a Q6_K pair is within `±2·255·32 = ±16320` and two are added
//! (`±32640`), then widened.

use core::arch::x86_64::*;

use super::panel::{GemmBufs, PANEL_TOKENS, UnpackedRow};
use super::panel_k::{PANEL_SUPER_BYTES, Q4K_BYTES, Q6K_BYTES, Q8KPanel, unpack_q4k, unpack_q6k};

/// Tokens per vector.
const HALF: usize = PANEL_TOKENS / 2;

/// `out[r·n + i]` = row `r` of `rows` (Q6_K if `Q6`, else Q4_K) against token `i` of
/// `panel`, for the `n` tokens the panel holds. `bufs` is unpacking space.
///
/// # Safety
/// The CPU supports AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn gemm<const Q6: bool>(
    rows: &[&[u8]],
    panel: &Q8KPanel,
    n: usize,
    out: &mut [f32],
    bufs: &mut GemmBufs,
) {
    let bb = if Q6 { Q6K_BYTES } else { Q4K_BYTES };
    let (nb, n, rows) = panel.clamp(rows, bb, n, out.len());
    let buf = &mut bufs.rows[0];
    for (r, row) in rows.iter().enumerate() {
        if Q6 {
            unpack_q6k(buf, row, nb);
        } else {
            unpack_q4k(buf, row, nb);
        }
        for h in 0..n.div_ceil(HALF) {
            let (g, half) = (h / 2, h % 2);
            let (qs, d, sums) = panel.group(g);
            let mut acc = [_mm256_setzero_ps(); 8];
            for b in 0..nb {
                // SAFETY: the group and the unpacked row hold nb super-blocks
                // (`Q8KPanel::clamp`).
                let t = unsafe { super_block_term::<Q6>(buf, b, qs, d, sums, half) };
                acc[b % 8] = _mm256_add_ps(acc[b % 8], t);
            }
            let v = _mm256_add_ps(
                _mm256_add_ps(_mm256_add_ps(acc[0], acc[4]), _mm256_add_ps(acc[2], acc[6])),
                _mm256_add_ps(_mm256_add_ps(acc[1], acc[5]), _mm256_add_ps(acc[3], acc[7])),
            );
            let mut lanes = [0.0f32; HALF];
            // SAFETY: `lanes` holds eight floats.
            unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), v) };
            let at = h * HALF;
            let valid = (n - at).min(HALF);
            out[r * n + at..r * n + at + valid].copy_from_slice(&lanes[..valid]);
        }
    }
}

/// Super-block `b`'s f32 term for tokens `8·half .. 8·half + 8` of a group.
///
/// # Safety
/// AVX2/FMA/F16C; super-block `b` is within `qs`, `d`, `sums` and `row`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn super_block_term<const Q6: bool>(
    row: &UnpackedRow,
    b: usize,
    qs: &[u8],
    d: &[f32],
    sums: &[i16],
    half: usize,
) -> __m256 {
    debug_assert!(qs.len() >= (b + 1) * PANEL_SUPER_BYTES && d.len() >= (b + 1) * PANEL_TOKENS);
    let subs = if Q6 { 16 } else { 8 };
    let quads = 64 / subs;
    let ones = _mm256_set1_epi16(1);
    // SAFETY: each load lies in super-block b of the group (4096 bytes at b·4096, 16 scales,
    // 128 sums) or of the row (256 values, `subs` scales, 4 minimum words) (caller);
    // `read_unaligned` reads a word of four weights.
    unsafe {
        let base = qs.as_ptr().add(b * PANEL_SUPER_BYTES + half * 32);
        let w = row.values.as_ptr().add(256 * b).cast::<i32>();
        let mut isum = _mm256_setzero_si256();
        for sub in 0..subs {
            let pair = |c: usize| {
                let q = quads * sub + c;
                _mm256_maddubs_epi16(
                    _mm256_loadu_si256(base.add(q * 64).cast()),
                    _mm256_set1_epi32(w.add(q).read_unaligned()),
                )
            };
            // Q4_K: four pairs per 16-bit sum; Q6_K: two.
            let per = if Q6 { 2 } else { 4 };
            let mut raw = _mm256_setzero_si256();
            for c0 in (0..quads).step_by(per) {
                let mut s16 = pair(c0);
                for c in c0 + 1..c0 + per {
                    s16 = _mm256_add_epi16(s16, pair(c));
                }
                raw = _mm256_add_epi32(raw, _mm256_madd_epi16(s16, ones));
            }
            let sc = _mm256_set1_epi32(*row.scales.get_unchecked(subs * b + sub));
            isum = _mm256_add_epi32(isum, _mm256_mullo_epi32(raw, sc));
        }
        let i = _mm256_sub_epi32(isum, _mm256_set1_epi32(*row.correction.get_unchecked(b)));
        let dx = _mm256_loadu_ps(d.as_ptr().add(b * PANEL_TOKENS + half * HALF));
        let dd = _mm256_mul_ps(_mm256_set1_ps(*row.d.get_unchecked(b)), dx);
        if Q6 {
            return _mm256_mul_ps(dd, _mm256_cvtepi32_ps(i));
        }
        let mut m = _mm256_setzero_si256();
        for k in 0..4 {
            let s = _mm256_loadu_si256(
                sums.as_ptr()
                    .add((b * 4 + k) * 2 * PANEL_TOKENS + 2 * HALF * half)
                    .cast(),
            );
            let mins = _mm256_set1_epi32(*row.mins.get_unchecked(4 * b + k));
            m = _mm256_add_epi32(m, _mm256_madd_epi16(s, mins));
        }
        let mm = _mm256_mul_ps(_mm256_set1_ps(*row.m.get_unchecked(b)), dx);
        let mm_m = _mm256_mul_ps(mm, _mm256_cvtepi32_ps(m));
        _mm256_fmsub_ps(dd, _mm256_cvtepi32_ps(i), mm_m)
    }
}
