//! The softmax of a decode step on the fast-scan layout: each head's weights
//! `p_t · ‖v_t‖ / Σ p` in f32 ([`softmax_weights`]), or straight as the integer value sums'
//! bytes and block scales ([`softmax_weight_bytes`], which never stores the f32 weights).
//!
//! Each loop is compiled twice from one body — for the baseline target and for AVX2 — and
//! runs the AVX2 copy where the CPU has it (eight lanes where the baseline has four). The
//! bodies are plain float operations (Rust never fuses a multiplication and an addition on its
//! own) with every sum in explicit lanes, so both copies give the same bits (tested through
//! `attend` on every instruction set, `tests/fast_scan.rs`).

use super::{BLOCK, values_int};
use crate::attention::simd::Isa;

/// Lanes of partial sums per coordinate (and of the softmax's denominator).
pub(super) const LANES: usize = 16;

/// Each head's weights `p_t · ‖v_t‖ / Σ p` into `weights[h·padded ..]`, from its row of
/// `n = norms.len()` scores in `scores` (which become `e^(x − max)`); the padding of `weights`
/// is left as it is.
pub(super) fn softmax_weights(
    isa: Isa,
    scores: &mut [f32],
    norms: &[f32],
    weights: &mut [f32],
    padded: usize,
) {
    #[cfg(target_arch = "x86_64")]
    if super::avx2_kernels(isa) {
        // SAFETY: AVX2 was detected at run time (`avx2_kernels`).
        unsafe { softmax_weights_avx2(scores, norms, weights, padded) };
        return;
    }
    let _ = isa;
    softmax_weights_body(scores, norms, weights, padded);
}

/// [`softmax_weights_body`] compiled for AVX2.
///
/// # Safety
/// AVX2 must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn softmax_weights_avx2(
    scores: &mut [f32],
    norms: &[f32],
    weights: &mut [f32],
    padded: usize,
) {
    softmax_weights_body(scores, norms, weights, padded);
}

#[inline(always)]
fn softmax_weights_body(scores: &mut [f32], norms: &[f32], weights: &mut [f32], padded: usize) {
    let n = norms.len();
    for (row, w) in scores
        .chunks_exact_mut(n)
        .zip(weights.chunks_exact_mut(padded))
    {
        let inv = exponentials(row);
        for ((w, &e), &norm) in w.iter_mut().zip(row.iter()).zip(norms) {
            *w = e * norm * inv;
        }
    }
}

/// What [`softmax_weights`] gives, turned by `values_int::weight_bytes` into each block's
/// weight bytes and scale, block-major: `bytes[b·H + h]` and `scales[b·H + h]` for block `b`
/// and head `h` of `H = scores.len() / norms.len()`. A block's 32 weights live only in
/// registers, so the f32 weights are never written out (for 3 heads at 64K tokens they would
/// be 768 KiB, more than this CPU family's L2 cache).
pub(super) fn softmax_weight_bytes(
    isa: Isa,
    scores: &mut [f32],
    norms: &[f32],
    bytes: &mut [[u8; BLOCK]],
    scales: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if super::avx2_kernels(isa) {
        // SAFETY: AVX2 was detected at run time (`avx2_kernels`).
        unsafe { softmax_weight_bytes_avx2(scores, norms, bytes, scales) };
        return;
    }
    let _ = isa;
    softmax_weight_bytes_body(scores, norms, bytes, scales);
}

/// [`softmax_weight_bytes_body`] compiled for AVX2.
///
/// # Safety
/// AVX2 must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn softmax_weight_bytes_avx2(
    scores: &mut [f32],
    norms: &[f32],
    bytes: &mut [[u8; BLOCK]],
    scales: &mut [f32],
) {
    softmax_weight_bytes_body(scores, norms, bytes, scales);
}

#[inline(always)]
fn softmax_weight_bytes_body(
    scores: &mut [f32],
    norms: &[f32],
    bytes: &mut [[u8; BLOCK]],
    scales: &mut [f32],
) {
    let n = norms.len();
    let heads = scores.len() / n;
    for (h, row) in scores.chunks_exact_mut(n).enumerate() {
        let inv = exponentials(row);
        let blocks = row.chunks_exact(BLOCK).zip(norms.chunks_exact(BLOCK));
        for (b, (e, norms)) in blocks.enumerate() {
            let i = b * heads + h;
            let (e, norms) = (
                e.try_into().expect("block"),
                norms.try_into().expect("block"),
            );
            scales[i] = block_bytes(e, norms, inv, &mut bytes[i]);
        }
        let whole = n - n % BLOCK;
        let (e, norms) = (&row[whole..], &norms[whole..]);
        if !e.is_empty() {
            // The last, partial block, its padding zero (a zero norm gives a zero weight).
            let padded = |x: &[f32]| {
                let mut p = [0.0f32; BLOCK];
                p[..x.len()].copy_from_slice(x);
                p
            };
            let i = (whole / BLOCK) * heads + h;
            scales[i] = block_bytes(&padded(e), &padded(norms), inv, &mut bytes[i]);
        }
    }
}

/// One block's weights `e_t · ‖v_t‖ · inv` as bytes and a scale (`values_int::weight_bytes`).
/// Fixed-size arrays, so the compiler keeps the block's weights in registers (over slices of
/// unknown length they stayed on the stack, and every pass over them waited on a store).
#[inline(always)]
fn block_bytes(e: &[f32; BLOCK], norms: &[f32; BLOCK], inv: f32, out: &mut [u8; BLOCK]) -> f32 {
    let mut w = [0.0f32; BLOCK];
    for ((w, &e), &norm) in w.iter_mut().zip(e).zip(norms) {
        *w = e * norm * inv;
    }
    values_int::weight_bytes(&w, out)
}

/// Replaces `row` by `e^(x − max row)` and returns `1 / Σ` of them.
#[inline(always)]
fn exponentials(row: &mut [f32]) -> f32 {
    let m = lane_max(row, f32::NEG_INFINITY);
    for x in row.iter_mut() {
        *x = exp_det(*x - m);
    }
    1.0 / lane_sum(row)
}

/// The largest of `values` and `floor`, in 8 lanes (a fold of `max` one value at a time is
/// compiled as a chain of scalar instructions). `max` is exact, so the result is the fold's.
#[inline(always)]
pub(super) fn lane_max(values: &[f32], floor: f32) -> f32 {
    let mut lanes = [floor; 8];
    // Whole chunks apart from the rest, so the lanes stay in a register.
    let mut chunks = values.chunks_exact(8);
    for chunk in &mut chunks {
        for (l, &v) in lanes.iter_mut().zip(chunk) {
            *l = l.max(v);
        }
    }
    for (l, &v) in lanes.iter_mut().zip(chunks.remainder()) {
        *l = l.max(v);
    }
    lanes.iter().fold(floor, |a, &b| a.max(b))
}

/// `e^x` for `x ≤ 0` (0 below −87) from plain multiplications and additions, branch-free so
/// a loop of it vectorizes into the same operations per lane: `2^n · p(r)` with
/// `r = x − n·ln 2` and a degree-6 Taylor polynomial of `e^r` on `|r| ≤ ln2/2` (relative
/// error below 2e-7).
#[inline(always)]
fn exp_det(x: f32) -> f32 {
    let x = x.max(-87.0);
    // Round to nearest even by adding and subtracting 1.5·2^23 (|x·log2 e| < 2^22 here):
    // plain additions, where `round_ties_even` is a library call without SSE4.1.
    const ROUND: f32 = 12_582_912.0;
    let shifted = x * std::f32::consts::LOG2_E + ROUND;
    let n = shifted - ROUND;
    let r = (x - n * 0.693_145_75) - n * 1.428_606_8e-6;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    // `n` as an integer from the bits of `shifted`, whose last place is 1 (the same value as
    // `n as i32`, without the saturating float-to-int conversion the compiler keeps scalar).
    let k = shifted.to_bits() as i32 - ROUND.to_bits() as i32;
    p * f32::from_bits(((k + 127) as u32) << 23)
}

/// `Σ values` in 16 lanes (value `t` into lane `t mod 16`) reduced by [`reduce_lanes`].
#[inline(always)]
fn lane_sum(values: &[f32]) -> f32 {
    let mut lanes = [0.0f32; LANES];
    let mut chunks = values.chunks_exact(LANES);
    for chunk in &mut chunks {
        for (l, &v) in lanes.iter_mut().zip(chunk) {
            *l += v;
        }
    }
    for (l, &v) in lanes.iter_mut().zip(chunks.remainder()) {
        *l += v;
    }
    reduce_lanes(&lanes)
}

/// The fixed reduction tree of 16 lanes: halves added pairwise until one is left.
#[inline(always)]
pub(super) fn reduce_lanes(lanes: &[f32]) -> f32 {
    let mut l = [0.0f32; LANES];
    l.copy_from_slice(lanes);
    let mut width = LANES / 2;
    while width > 0 {
        for i in 0..width {
            l[i] += l[i + width];
        }
        width /= 2;
    }
    l[0]
}
