//! The K formats (Q4_K, Q6_K) against Q8_K activations: the reference engine's orders, and the
//! block-lanes order ([`dot_q4k_block_lanes`], [`dot_q6k_block_lanes`], the default), which
//! makes one f32 term per super-block from its exact integers.
//!
//! In the `vec_dot` order:
//!
//! Per super-block of 256 values the products are exact integers gathered into eight lanes
//! (lane `l` holds values `32c + 4l .. 32c + 4l + 4` of every 32-value chunk `c`, each chunk's
//! sum times its integer sub-block scale), as llama.cpp's AVX2 `ggml_vec_dot_q4_K_q8_K` and
//! `ggml_vec_dot_q6_K_q8_K` leave them. The f32 combination is theirs:
//!
//! ```text
//! Q6_K: for each super-block: acc[l] = fma(d_x·d_w, lane_l, acc[l]);    result = hsum8(acc)
//! Q4_K: the same, plus the minimum term in four lanes:
//!       m[k] = fma(−d_x·dmin_w, mins[2k]·S[2k] + mins[2k+1]·S[2k+1], m[k])
//!       (S[j] = Σ of the 32 activation bytes of sub-block j, from the stored sums)
//!       result = hsum8(acc) + ((m[0] + m[2]) + (m[1] + m[3]))
//! ```
//!
//! so a row product equals the engine's bit for bit given the same quantized activation.

use super::super::activation_k::{Q8KRow, QK_K};
use super::super::dequant::{f16_at, unpack_q4k_scales};
use super::scalar::hsum8;

/// A row kernel of the Q8_K path: `(weight row bytes, quantized activation row) → Σ`.
pub(crate) type Q8KKernel = fn(&[u8], &Q8KRow<'_>) -> f32;

/// Bytes of a Q4_K super-block.
const Q4K_BYTES: usize = 144;
/// Bytes of a Q6_K super-block.
const Q6K_BYTES: usize = 210;

/// The eight lane sums of a super-block: `Σ_c scale(c, l)·Σ_{b<4} w[32c+4l+b]·y[32c+4l+b]`.
#[inline]
fn lanes(w: &[i32; QK_K], y: &[i8], scale: impl Fn(usize) -> i32) -> [i32; 8] {
    let mut lanes = [0i32; 8];
    for c in 0..QK_K / 32 {
        for (l, lane) in lanes.iter_mut().enumerate() {
            let at = 32 * c + 4 * l;
            let p: i32 = (at..at + 4).map(|j| w[j] * y[j] as i32).sum();
            // Every 4-value group lies inside one 16-value scale group.
            *lane += scale(at) * p;
        }
    }
    lanes
}

/// Scalar Q4_K · Q8_K.
pub(crate) fn dot_q4k(row: &[u8], act: &Q8KRow<'_>) -> f32 {
    let mut acc = [0.0f32; 8];
    let mut acc_m = [0.0f32; 4];
    for (b, w) in row.chunks_exact(Q4K_BYTES).enumerate() {
        let y = &act.qs[b * QK_K..(b + 1) * QK_K];
        let mut packed = [0u8; 12];
        packed.copy_from_slice(&w[4..16]);
        let (scales, mins) = unpack_q4k_scales(&packed);
        let mut q = [0i32; QK_K];
        for i in 0..4 {
            for (l, &byte) in w[16 + 32 * i..16 + 32 * (i + 1)].iter().enumerate() {
                q[64 * i + l] = (byte & 0xF) as i32;
                q[64 * i + 32 + l] = (byte >> 4) as i32;
            }
        }
        let p = lanes(&q, y, |at| scales[at / 32] as i32);
        let d = act.d[b] * f16_at(w, 0);
        let dmin = -act.d[b] * f16_at(w, 2);
        for (acc, &p) in acc.iter_mut().zip(&p) {
            *acc = d.mul_add(p as f32, *acc);
        }
        let sums = &act.bsums[b * 16..(b + 1) * 16];
        let sub = |j: usize| sums[2 * j] as i32 + sums[2 * j + 1] as i32;
        for (k, m) in acc_m.iter_mut().enumerate() {
            let prod = mins[2 * k] as i32 * sub(2 * k) + mins[2 * k + 1] as i32 * sub(2 * k + 1);
            *m = dmin.mul_add(prod as f32, *m);
        }
    }
    hsum8(&acc) + ((acc_m[0] + acc_m[2]) + (acc_m[1] + acc_m[3]))
}

/// Scalar Q6_K · Q8_K. The offset of 32 is taken out of the lanes and subtracted per lane from
/// the stored activation sums, as ggml's AVX2 kernel does: lane `l` holds the unsigned 6-bit
/// products of positions `4l..4l+4` of every chunk minus `32·(sc[2l]·S[2l] + sc[2l+1]·S[2l+1])`
/// (`S[i]` the sum of activation bytes `16i..16i+16`) — the same total as signed products,
/// split differently over the lanes, so the f32 combination sees ggml's lanes.
pub(crate) fn dot_q6k(row: &[u8], act: &Q8KRow<'_>) -> f32 {
    let mut acc = [0.0f32; 8];
    for (b, w) in row.chunks_exact(Q6K_BYTES).enumerate() {
        let y = &act.qs[b * QK_K..(b + 1) * QK_K];
        let mut q = [0i32; QK_K];
        for half in 0..2 {
            let ql = &w[64 * half..64 * half + 64];
            let qh = &w[128 + 32 * half..128 + 32 * half + 32];
            let o = &mut q[128 * half..128 * (half + 1)];
            for l in 0..32 {
                let h = qh[l];
                o[l] = ((ql[l] & 0xF) | ((h & 3) << 4)) as i32;
                o[l + 32] = ((ql[l + 32] & 0xF) | (((h >> 2) & 3) << 4)) as i32;
                o[l + 64] = ((ql[l] >> 4) | (((h >> 4) & 3) << 4)) as i32;
                o[l + 96] = ((ql[l + 32] >> 4) | (((h >> 6) & 3) << 4)) as i32;
            }
        }
        let scales = &w[192..208];
        let sc = |i: usize| scales[i] as i8 as i32;
        let mut p = lanes(&q, y, |at| sc(at / 16));
        let sums = &act.bsums[b * 16..(b + 1) * 16];
        for (l, p) in p.iter_mut().enumerate() {
            *p -= 32 * (sums[2 * l] as i32 * sc(2 * l) + sums[2 * l + 1] as i32 * sc(2 * l + 1));
        }
        let d = act.d[b] * f16_at(w, 208);
        for (acc, &p) in acc.iter_mut().zip(&p) {
            *acc = d.mul_add(p as f32, *acc);
        }
    }
    hsum8(&acc)
}

/// The integer products of one Q4_K super-block with its Q8_K activation: per 32-value
/// sub-block `j`, `sc_j·Σ q·y` and `m_j·S_j` (exact).
fn q4k_subblock_sums(w: &[u8], y: &[i8], bsums: &[i16]) -> ([i32; 8], [i32; 8]) {
    let mut packed = [0u8; 12];
    packed.copy_from_slice(&w[4..16]);
    let (scales, mins) = unpack_q4k_scales(&packed);
    let mut dots = [0i32; 8];
    let mut min_terms = [0i32; 8];
    for i in 0..4 {
        let qs = &w[16 + 32 * i..16 + 32 * (i + 1)];
        let (mut lo, mut hi) = (0i32, 0i32);
        for (l, &byte) in qs.iter().enumerate() {
            lo += (byte & 0xF) as i32 * y[64 * i + l] as i32;
            hi += (byte >> 4) as i32 * y[64 * i + 32 + l] as i32;
        }
        dots[2 * i] = scales[2 * i] as i32 * lo;
        dots[2 * i + 1] = scales[2 * i + 1] as i32 * hi;
    }
    for (j, m) in min_terms.iter_mut().enumerate() {
        *m = mins[j] as i32 * (bsums[2 * j] as i32 + bsums[2 * j + 1] as i32);
    }
    (dots, min_terms)
}

/// Q4_K · Q8_K as llama.cpp computes it on x86 after repacking Q4_K weights into interleaved
/// groups of eight rows (`ggml_gemv_q4_K_8x8_q8_K` / `ggml_gemm_q4_K_8x8_q8_K`, the path its
/// CPU backend takes for Q4_K matrices on AVX2 machines). Each output is two single FMA chains,
/// `acc = fma(I, d_w·d_x, acc)` and `m = fma(M, dmin_w·d_x, m)`, returned as `acc − m`; the
/// matrix–vector kernel (`PAIRS = false`) feeds one `(I, M)` per super-block, the
/// matrix–matrix kernel (`PAIRS = true`, rows of a batch in groups of four) one per pair of
/// sub-blocks.
fn dot_q4k_repacked<const PAIRS: bool>(row: &[u8], act: &Q8KRow<'_>) -> f32 {
    let (mut acc, mut acc_m) = (0.0f32, 0.0f32);
    for (b, w) in row.chunks_exact(Q4K_BYTES).enumerate() {
        let y = &act.qs[b * QK_K..(b + 1) * QK_K];
        let (dots, min_terms) = q4k_subblock_sums(w, y, &act.bsums[b * 16..(b + 1) * 16]);
        let d = f16_at(w, 0) * act.d[b];
        let dmin = f16_at(w, 2) * act.d[b];
        if PAIRS {
            for p in 0..4 {
                let i = dots[2 * p] + dots[2 * p + 1];
                let m = min_terms[2 * p] + min_terms[2 * p + 1];
                acc = (i as f32).mul_add(d, acc);
                acc_m = (m as f32).mul_add(dmin, acc_m);
            }
        } else {
            let i: i32 = dots.iter().sum();
            let m: i32 = min_terms.iter().sum();
            acc = (i as f32).mul_add(d, acc);
            acc_m = (m as f32).mul_add(dmin, acc_m);
        }
    }
    acc - acc_m
}

/// Repacked Q4_K, matrix–vector order (see [`dot_q4k_repacked`]).
pub(crate) fn dot_q4k_repacked_gemv(row: &[u8], act: &Q8KRow<'_>) -> f32 {
    dot_q4k_repacked::<false>(row, act)
}

/// Repacked Q4_K, matrix–matrix order (see [`dot_q4k_repacked`]).
pub(crate) fn dot_q4k_repacked_gemm(row: &[u8], act: &Q8KRow<'_>) -> f32 {
    dot_q4k_repacked::<true>(row, act)
}

/// The exact integer `Σ_s sc_s·(Σ q·y − 32·S_s)` of one Q6_K super-block (210 bytes) over its
/// sixteen 16-value sub-blocks: the super-block's whole product in units of `d_w·d_x`.
fn q6k_total(w: &[u8], y: &[i8], sums: &[i16]) -> i32 {
    let scales = &w[192..208];
    let mut total = 0i32;
    for half in 0..2 {
        let ql = &w[64 * half..64 * half + 64];
        let qh = &w[128 + 32 * half..128 + 32 * half + 32];
        let mut q = [0i32; 128];
        for l in 0..32 {
            let h = qh[l];
            q[l] = ((ql[l] & 0xF) | ((h & 3) << 4)) as i32;
            q[l + 32] = ((ql[l + 32] & 0xF) | (((h >> 2) & 3) << 4)) as i32;
            q[l + 64] = ((ql[l] >> 4) | (((h >> 4) & 3) << 4)) as i32;
            q[l + 96] = ((ql[l + 32] >> 4) | (((h >> 6) & 3) << 4)) as i32;
        }
        for s in 0..8 {
            let sub = 8 * half + s;
            let raw: i32 = (0..16)
                .map(|i| q[16 * s + i] * y[128 * half + 16 * s + i] as i32)
                .sum();
            total += scales[sub] as i8 as i32 * (raw - 32 * sums[sub] as i32);
        }
    }
    total
}

/// Q6_K · Q8_K as llama.cpp's tiled K-quant matmul computes it (its x86 path for batches of at
/// least eight activation rows, AVX-512 VNNI build): per super-block the exact integer
/// `Σ_s sc_s·(Σ q·y − 32·S_s)` over the sixteen 16-value sub-blocks, times the weight scale in
/// f32, times the activation scale added to the running sum — `acc = fma(s·d_w, d_x, acc)`
/// (GCC contracts the kernel's multiply and add).
pub(crate) fn dot_q6k_tiled(row: &[u8], act: &Q8KRow<'_>) -> f32 {
    let mut acc = 0.0f32;
    for (b, w) in row.chunks_exact(Q6K_BYTES).enumerate() {
        let y = &act.qs[b * QK_K..(b + 1) * QK_K];
        let total = q6k_total(w, y, &act.bsums[b * 16..(b + 1) * 16]);
        let r = total as f32 * f16_at(w, 208);
        acc = r.mul_add(act.d[b], acc);
    }
    acc
}

/// Q4_K · Q8_K in the block-lanes order ([`KQuantOrder::BlockLanes`](super::KQuantOrder::BlockLanes)),
/// the definition every kernel of that order reproduces:
///
/// ```text
/// for each super-block b, in order:
///     I  = Σ_j sc_j·Σ q·y,   M = Σ_j m_j·S_j                (exact integers, j < 8)
///     dd = d_w[b] · d_x[b],  mm = dmin_w[b] · d_x[b]       (one rounding each)
///     t  = fma(dd, I, −(mm · M))                           (I, M, mm·M rounded to f32)
///     acc[b mod 8] += t
/// result = hsum8(acc)
/// ```
///
/// One f32 term per super-block, as [`combine_block_lanes`](super::scalar::combine_block_lanes)
/// makes one per Q8 block: a matrix product can keep tokens in its vector lanes.
pub(crate) fn dot_q4k_block_lanes(row: &[u8], act: &Q8KRow<'_>) -> f32 {
    let mut acc = [0.0f32; 8];
    for (b, w) in row.chunks_exact(Q4K_BYTES).enumerate() {
        let y = &act.qs[b * QK_K..(b + 1) * QK_K];
        let (dots, min_terms) = q4k_subblock_sums(w, y, &act.bsums[b * 16..(b + 1) * 16]);
        let (i, m) = (dots.iter().sum::<i32>(), min_terms.iter().sum::<i32>());
        let dd = f16_at(w, 0) * act.d[b];
        let mm = f16_at(w, 2) * act.d[b];
        acc[b % 8] += dd.mul_add(i as f32, -(mm * m as f32));
    }
    hsum8(&acc)
}

/// Q6_K · Q8_K in the block-lanes order: per super-block `t = (d_w[b]·d_x[b])·I`, `I` the
/// exact integer of [`q6k_total`], added to `acc[b mod 8]`; result `hsum8(acc)`.
pub(crate) fn dot_q6k_block_lanes(row: &[u8], act: &Q8KRow<'_>) -> f32 {
    let mut acc = [0.0f32; 8];
    for (b, w) in row.chunks_exact(Q6K_BYTES).enumerate() {
        let y = &act.qs[b * QK_K..(b + 1) * QK_K];
        let total = q6k_total(w, y, &act.bsums[b * 16..(b + 1) * 16]);
        let dd = f16_at(w, 208) * act.d[b];
        acc[b % 8] += dd * total as f32;
    }
    hsum8(&acc)
}
