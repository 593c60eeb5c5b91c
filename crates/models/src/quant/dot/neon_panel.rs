//! NEON matrix products with the dot-product instructions (`sdot`, Armv8.2 DotProd) in the
//! block-lanes orders: weight rows against four tokens per vector, tokens in the lanes — the
//! aarch64 counterpart of `x86_vnni` (Q8_0, Q4_0, Q4_1, Q5_0 over a [`Q8Panel`]) and
//! `x86_vnni_kquant` (Q4_K, Q6_K over a [`Q8KPanel`]).
//!
//! The panels hold each token's values `+128` (what `vpdpbusd`'s unsigned operand needs); here
//! one `eor` per load takes them back to signed bytes, and `sdot` by element multiplies four
//! tokens' four values by one word of four signed weights, adding the four products into each
//! token's i32 lane. The sums are then exact integers with no correction; the f32 steps are
//! those of [`combine_block_lanes`](super::scalar::combine_block_lanes) and of
//! [`dot_q4k_block_lanes`](super::kquant::dot_q4k_block_lanes) /
//! [`dot_q6k_block_lanes`](super::kquant::dot_q6k_block_lanes), lane by lane (`fmla` is a
//! fused multiply-add, `scvtf` rounds to nearest like `as f32`), so every token's result has
//! the scalar kernel's bits.
//!
//! `sdot` is written with `asm!`: the `vdotq_laneq_s32` intrinsic is not stable in Rust yet.
//! The kernels are handed out only where `dotprod` is detected at run time (Apple M1 and
//! later, Neoverse, Cortex-A76 and later); elsewhere products of several tokens take the row
//! kernel per token.

use core::arch::aarch64::*;
use core::arch::asm;

use super::super::kind::QuantKind;
use super::panel::unpack_row_portable;
use super::panel::{GemmBufs, PANEL_BLOCK_BYTES, PANEL_TOKENS, Q8Panel, UnpackedRow};
use super::panel_k::{PANEL_SUPER_BYTES, Q4K_BYTES, Q6K_BYTES, Q8KPanel, unpack_q4k, unpack_q6k};

/// Tokens per vector.
const QUAD: usize = 4;

/// `acc[t] += Σ_i a[4t + i]·w[4L + i]` for the four tokens `t` (`sdot` by element).
#[inline]
#[target_feature(enable = "neon,dotprod")]
fn sdot_lane<const L: i32>(acc: int32x4_t, a: int8x16_t, w: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    // SAFETY: `sdot` reads and writes registers only; `dotprod` is enabled for this function,
    // and its callers are reached only after run-time detection.
    unsafe {
        asm!(
            "sdot {acc:v}.4s, {a:v}.16b, {w:v}.4b[{l}]",
            acc = inout(vreg) acc,
            a = in(vreg) a,
            w = in(vreg) w,
            l = const L,
            options(pure, nomem, nostack),
        );
    }
    acc
}

/// [`sdot_lane`] with weight word `c` of the eight held in `w` (two registers of four words).
#[inline]
#[target_feature(enable = "neon,dotprod")]
fn sdot_word(acc: int32x4_t, a: int8x16_t, w: &[int8x16_t; 2], c: usize) -> int32x4_t {
    let half = w[c / 4];
    match c % 4 {
        0 => sdot_lane::<0>(acc, a, half),
        1 => sdot_lane::<1>(acc, a, half),
        2 => sdot_lane::<2>(acc, a, half),
        _ => sdot_lane::<3>(acc, a, half),
    }
}

/// Four tokens' four values at `p` (panel bytes, +128) as signed bytes.
///
/// # Safety
/// `p` points to 16 readable bytes.
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn load_tokens(p: *const u8) -> int8x16_t {
    // SAFETY: 16 readable bytes at `p` (caller).
    let raw = unsafe { vld1q_u8(p) };
    vreinterpretq_s8_u8(veorq_u8(raw, vdupq_n_u8(0x80)))
}

/// The eight running sums of one row, summed as `hsum8`.
#[inline]
#[target_feature(enable = "neon,dotprod")]
fn tree(a: &[float32x4_t; 8]) -> float32x4_t {
    vaddq_f32(
        vaddq_f32(vaddq_f32(a[0], a[4]), vaddq_f32(a[2], a[6])),
        vaddq_f32(vaddq_f32(a[1], a[5]), vaddq_f32(a[3], a[7])),
    )
}

/// Writes the first `valid ≤ 4` lanes of `v` to `out` (which holds at least `valid`).
#[inline]
#[target_feature(enable = "neon,dotprod")]
fn store(out: &mut [f32], v: float32x4_t, valid: usize) {
    let mut lanes = [0.0f32; QUAD];
    // SAFETY: `lanes` holds four f32.
    unsafe { vst1q_f32(lanes.as_mut_ptr(), v) };
    out[..valid].copy_from_slice(&lanes[..valid]);
}

/// `out[r·n + i]` = row `r` of `rows` (format `kind`: Q8_0, Q4_0, Q4_1 or Q5_0) against token
/// `i` of `panel`, in the block-lanes order, two rows at a time.
///
/// # Safety
/// The CPU supports the DotProd extension.
#[target_feature(enable = "neon,dotprod")]
pub(crate) unsafe fn gemm(
    kind: QuantKind,
    rows: &[&[u8]],
    panel: &Q8Panel,
    n: usize,
    out: &mut [f32],
    bufs: &mut GemmBufs,
) {
    let bufs = &mut bufs.rows;
    let (nb, n, rows) = panel.clamp(rows, kind.block_bytes(), n, out.len());
    let min = kind == QuantKind::Q4_1;
    let mut r0 = 0;
    while r0 < rows.len() {
        let pair = rows.len() - r0 >= 2;
        unpack_row_portable(kind, &mut bufs[0], rows[r0], nb);
        if pair {
            unpack_row_portable(kind, &mut bufs[1], rows[r0 + 1], nb);
        }
        for g in 0..n.div_ceil(PANEL_TOKENS) {
            let (qs, d, s) = panel.group(g);
            for v in 0..PANEL_TOKENS / QUAD {
                let at = g * PANEL_TOKENS + QUAD * v;
                if at >= n {
                    break;
                }
                let valid = (n - at).min(QUAD);
                // SAFETY: the group and each unpacked row hold nb blocks (`Q8Panel::clamp`);
                // out holds rows·n values and row r's tokens at..at + valid are below n.
                unsafe {
                    if pair {
                        let sums = quad_sums::<2>([&bufs[0], &bufs[1]], nb, qs, d, s, v, min);
                        store(&mut out[r0 * n + at..], sums[0], valid);
                        store(&mut out[(r0 + 1) * n + at..], sums[1], valid);
                    } else {
                        let sums = quad_sums::<1>([&bufs[0]], nb, qs, d, s, v, min);
                        store(&mut out[r0 * n + at..], sums[0], valid);
                    }
                }
            }
        }
        r0 += if pair { 2 } else { 1 };
    }
}

/// The `R` rows' results for tokens `4v..4v+4` of one group, blocks `0..nb`.
///
/// # Safety
/// DotProd; `qs`, `d`, `s` hold `nb` blocks of the group, each row `nb` blocks, `v < 4`.
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn quad_sums<const R: usize>(
    rows: [&UnpackedRow; R],
    nb: usize,
    qs: &[u8],
    d: &[f32],
    s: &[f32],
    v: usize,
    min: bool,
) -> [float32x4_t; R] {
    debug_assert!(qs.len() >= nb * PANEL_BLOCK_BYTES && d.len() >= nb * PANEL_TOKENS);
    let mut acc = [[vdupq_n_f32(0.0); 8]; R];
    for b in 0..nb {
        // SAFETY: block b lies within the group's bytes, scales and sums and within every
        // row's values (caller's bounds); each load reads 16 bytes or four f32.
        unsafe {
            let w: [[int8x16_t; 2]; R] = core::array::from_fn(|r| {
                let p = rows[r].values.as_ptr().add(32 * b);
                [vld1q_s8(p), vld1q_s8(p.add(16))]
            });
            let base = qs.as_ptr().add(b * PANEL_BLOCK_BYTES + 16 * v);
            let mut isum = [vdupq_n_s32(0); R];
            for c in 0..8 {
                let a = load_tokens(base.add(64 * c));
                for r in 0..R {
                    isum[r] = sdot_word(isum[r], a, &w[r], c);
                }
            }
            let dx = vld1q_f32(d.as_ptr().add(b * PANEL_TOKENS + QUAD * v));
            let sx = vld1q_f32(s.as_ptr().add(b * PANEL_TOKENS + QUAD * v));
            for r in 0..R {
                let f = vcvtq_f32_s32(isum[r]);
                let dd = vmulq_n_f32(dx, *rows[r].d.get_unchecked(b));
                let t = if min {
                    let ms = vmulq_n_f32(sx, *rows[r].m.get_unchecked(b));
                    vfmaq_f32(ms, dd, f)
                } else {
                    vmulq_f32(dd, f)
                };
                acc[r][b % 8] = vaddq_f32(acc[r][b % 8], t);
            }
        }
    }
    core::array::from_fn(|r| tree(&acc[r]))
}

/// `out[r·n + i]` = row `r` of `rows` (Q4_K or Q6_K, `q6`) against token `i` of `panel`, in
/// the K formats' block-lanes order, two rows at a time.
///
/// # Safety
/// The CPU supports the DotProd extension.
#[target_feature(enable = "neon,dotprod")]
pub(crate) unsafe fn gemm_k(
    q6: bool,
    rows: &[&[u8]],
    panel: &Q8KPanel,
    n: usize,
    out: &mut [f32],
    bufs: &mut GemmBufs,
) {
    let bufs = &mut bufs.rows;
    let bb = if q6 { Q6K_BYTES } else { Q4K_BYTES };
    let unpack = |buf: &mut UnpackedRow, row: &[u8], nb: usize| {
        if q6 {
            unpack_q6k(buf, row, nb)
        } else {
            unpack_q4k(buf, row, nb)
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
            for v in 0..PANEL_TOKENS / QUAD {
                let at = g * PANEL_TOKENS + QUAD * v;
                if at >= n {
                    break;
                }
                let valid = (n - at).min(QUAD);
                // SAFETY: as in `gemm`, with super-blocks (`Q8KPanel::clamp`).
                unsafe {
                    if pair {
                        let t = quad_sums_k::<2>([&bufs[0], &bufs[1]], nb, qs, d, sums, v, q6);
                        store(&mut out[r0 * n + at..], t[0], valid);
                        store(&mut out[(r0 + 1) * n + at..], t[1], valid);
                    } else {
                        let t = quad_sums_k::<1>([&bufs[0]], nb, qs, d, sums, v, q6);
                        store(&mut out[r0 * n + at..], t[0], valid);
                    }
                }
            }
        }
        r0 += if pair { 2 } else { 1 };
    }
}

/// The `R` rows' K-format results for tokens `4v..4v+4` of one group, super-blocks `0..nb`.
///
/// # Safety
/// DotProd; `qs`, `d`, `sums` hold `nb` super-blocks of the group, each row `nb`, `v < 4`.
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn quad_sums_k<const R: usize>(
    rows: [&UnpackedRow; R],
    nb: usize,
    qs: &[u8],
    d: &[f32],
    sums: &[i16],
    v: usize,
    q6: bool,
) -> [float32x4_t; R] {
    debug_assert!(qs.len() >= nb * PANEL_SUPER_BYTES && d.len() >= nb * PANEL_TOKENS);
    debug_assert!(sums.len() >= nb * 8 * PANEL_TOKENS);
    let subs = if q6 { 16 } else { 8 };
    let quads = 64 / subs;
    let mut acc = [[vdupq_n_f32(0.0); 8]; R];
    for b in 0..nb {
        // SAFETY: super-block b lies within the group's bytes, scales and sums and within
        // every row's values, scales and minimums (caller's bounds); each load reads 16 bytes,
        // eight i16 or four f32.
        unsafe {
            let base = qs.as_ptr().add(b * PANEL_SUPER_BYTES + 16 * v);
            let mut isum = [vdupq_n_s32(0); R];
            for sub in 0..subs {
                // The sub-block's weights: `quads` words, in one or two registers of four.
                let w: [[int8x16_t; 2]; R] = core::array::from_fn(|r| {
                    let p = rows[r].values.as_ptr().add(256 * b + 4 * quads * sub);
                    let hi = if quads == 8 { p.add(16) } else { p };
                    [vld1q_s8(p), vld1q_s8(hi)]
                });
                let mut raw = [vdupq_n_s32(0); R];
                for c in 0..quads {
                    let a = load_tokens(base.add(64 * (quads * sub + c)));
                    for r in 0..R {
                        raw[r] = sdot_word(raw[r], a, &w[r], c);
                    }
                }
                for r in 0..R {
                    let sc = *rows[r].scales.get_unchecked(subs * b + sub);
                    isum[r] = vmlaq_n_s32(isum[r], raw[r], sc);
                }
            }
            let dx = vld1q_f32(d.as_ptr().add(b * PANEL_TOKENS + QUAD * v));
            // Q4_K: each token's sub-block sums S_2k, S_2k+1 as an i16 pair, k < 4.
            let pairs: [int16x8_t; 4] = core::array::from_fn(|k| {
                if q6 {
                    vdupq_n_s16(0)
                } else {
                    vld1q_s16(
                        sums.as_ptr()
                            .add((b * 4 + k) * 2 * PANEL_TOKENS + 2 * QUAD * v),
                    )
                }
            });
            for r in 0..R {
                let row = rows[r];
                let f = vcvtq_f32_s32(isum[r]);
                let dd = vmulq_n_f32(dx, *row.d.get_unchecked(b));
                let t = if q6 {
                    vmulq_f32(dd, f)
                } else {
                    let mut m = vdupq_n_s32(0);
                    for (k, pair) in pairs.iter().enumerate() {
                        let word = *row.mins.get_unchecked(4 * b + k);
                        let mins = vreinterpretq_s16_s32(vdupq_n_s32(word));
                        // m_2k·S_2k + m_2k+1·S_2k+1 per token: widening products, pairwise add.
                        let lo = vmull_s16(vget_low_s16(*pair), vget_low_s16(mins));
                        let hi = vmull_s16(vget_high_s16(*pair), vget_high_s16(mins));
                        m = vaddq_s32(m, vpaddq_s32(lo, hi));
                    }
                    let mm = vmulq_n_f32(dx, *row.m.get_unchecked(b));
                    let mm_m = vmulq_f32(mm, vcvtq_f32_s32(m));
                    // fma(dd, I, −(mm·M)): the negation is exact.
                    vfmaq_f32(vnegq_f32(mm_m), dd, f)
                };
                acc[r][b % 8] = vaddq_f32(acc[r][b % 8], t);
            }
        }
    }
    core::array::from_fn(|r| tree(&acc[r]))
}
