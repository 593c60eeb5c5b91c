//! Portable kernels: the integer lane sums of a block, the fixed-order f32 combination every
//! instruction set reproduces, and the f32-activation reference dot product.

use super::super::activation::{Q8_BLOCK, Q8Row};
use super::super::dequant::{dequantize_unchecked, f16_at, q5_0_values};
use super::super::kind::QuantKind;

/// Sums eight lanes in the fixed order `((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))` (what the AVX2
/// horizontal sum computes).
#[inline]
pub(crate) fn hsum8(a: &[f32; 8]) -> f32 {
    ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]))
}

/// The eight lane sums of a block's products `q_w,j·q_x,j`: lane `l` holds `j = 4l..4l+4`
/// (what `vpmaddubsw` + `vpmaddwd` leave in lane `l`). Exact integers.
pub(crate) type Lanes = [i32; 8];

/// Lane sums of a Q8_0 block (34 bytes) against 32 activation bytes.
#[inline]
pub(crate) fn lanes_q8_0(w: &[u8], y: &[i8]) -> Lanes {
    lanes(|j| w[2 + j] as i8 as i32, y)
}

/// Lane sums of a Q4_0 block (18 bytes: values `(q − 8)`, low nibbles first) against 32
/// activation bytes.
#[inline]
pub(crate) fn lanes_q4_0(w: &[u8], y: &[i8]) -> Lanes {
    lanes(|j| nibble(&w[2..18], j) - 8, y)
}

/// Lane sums of a Q4_1 block (20 bytes: unsigned nibbles, low first) against 32 activation
/// bytes.
#[inline]
pub(crate) fn lanes_q4_1(w: &[u8], y: &[i8]) -> Lanes {
    lanes(|j| nibble(&w[4..20], j), y)
}

/// Lane sums of a Q5_0 block (22 bytes: values `q − 16`, `q` = nibble plus fifth bit) against
/// 32 activation bytes.
#[inline]
pub(crate) fn lanes_q5_0(w: &[u8], y: &[i8]) -> Lanes {
    let q = q5_0_values(w);
    lanes(|j| q[j] as i32 - 16, y)
}

/// Nibble value `j` of 16 bytes: low nibbles are values 0..16, high nibbles 16..32.
#[inline]
fn nibble(qs: &[u8], j: usize) -> i32 {
    let byte = qs[j % 16];
    (if j < 16 { byte & 0xF } else { byte >> 4 }) as i32
}

#[inline]
fn lanes(w: impl Fn(usize) -> i32, y: &[i8]) -> Lanes {
    let mut p = [0i32; 8];
    for (l, p) in p.iter_mut().enumerate() {
        *p = (4 * l..4 * l + 4).map(|j| w(j) * y[j] as i32).sum();
    }
    p
}

/// The fixed f32 combination of the lane sums, shared by the scalar and NEON paths and
/// reproduced by AVX2 — the combination of llama.cpp's x86 AVX2 `ggml_vec_dot_q8_0_q8_0`,
/// `_q4_0_q8_0`, `_q5_0_q8_0` and `_q4_1_q8_1`:
///
/// ```text
/// for each block b, in order:
///     dd = d_w[b] · d_x[b]                                  (one rounding)
///     acc[l] = fma(dd, lane_l[b], acc[l])   for l = 0..8    (one rounding each)
///     summs  = fma(m_w[b], s_x[b], summs)                   (Q4_1 only)
/// result = hsum8(acc) (+ summs)
/// ```
///
/// `BB` is the block's byte size; `MIN` says the block stores an f16 minimum at bytes 2..4.
#[inline]
pub(crate) fn combine<const BB: usize, const MIN: bool>(
    row: &[u8],
    act: &Q8Row<'_>,
    lanes: impl Fn(&[u8], &[i8]) -> Lanes,
) -> f32 {
    let mut acc = [0.0f32; 8];
    let mut summs = 0.0f32;
    let blocks = row.chunks_exact(BB).zip(act.qs.chunks_exact(Q8_BLOCK));
    for (b, (w, y)) in blocks.enumerate() {
        let dd = f16_at(w, 0) * act.d[b];
        let p = lanes(w, y);
        for (acc, &p) in acc.iter_mut().zip(&p) {
            *acc = dd.mul_add(p as f32, *acc);
        }
        if MIN {
            summs = f16_at(w, 2).mul_add(act.s[b], summs);
        }
    }
    if MIN {
        hsum8(&acc) + summs
    } else {
        hsum8(&acc)
    }
}

/// The default combination ([`Q8Order::BlockLanes`](super::Q8Order::BlockLanes)): each
/// block's products become one exact integer and one f32 term, and the terms are summed in
/// eight running sums by block index:
///
/// ```text
/// for each block b, in order:
///     isum = Σ_l lane_l[b]                                  (exact integer)
///     dd   = d_w[b] · d_x[b]                                (one rounding)
///     t    = dd · isum                                      (one rounding)
///            fma(dd, isum, m_w[b] · s_x[b])                 (Q4_1: two roundings)
///     acc[b mod 8] += t                                     (one rounding)
/// result = hsum8(acc)
/// ```
///
/// One term per block (not eight lanes per block, as llama.cpp's order) is what lets a matrix
/// product keep tokens, not positions, in its vector lanes; the running sums by `b mod 8` let a
/// one-row kernel add eight blocks' terms with one vector addition. The accumulators start at
/// `+0` and so never hold `−0`: adding a `±0` term for a block past the row's end (as vector
/// kernels do for a row's last, partial group of eight blocks) changes nothing.
#[inline]
pub(crate) fn combine_block_lanes<const BB: usize, const MIN: bool>(
    row: &[u8],
    act: &Q8Row<'_>,
    lanes: impl Fn(&[u8], &[i8]) -> Lanes,
) -> f32 {
    let mut acc = [0.0f32; 8];
    let blocks = row.chunks_exact(BB).zip(act.qs.chunks_exact(Q8_BLOCK));
    for (b, (w, y)) in blocks.enumerate() {
        let dd = f16_at(w, 0) * act.d[b];
        let isum = lanes(w, y).iter().sum::<i32>() as f32;
        let t = if MIN {
            dd.mul_add(isum, f16_at(w, 2) * act.s[b])
        } else {
            dd * isum
        };
        acc[b % 8] += t;
    }
    hsum8(&acc)
}

/// Scalar Q8_0 · Q8 activation in the block-lanes order.
pub(crate) fn dot_q8_0_block_lanes(row: &[u8], act: &Q8Row<'_>) -> f32 {
    combine_block_lanes::<34, false>(row, act, lanes_q8_0)
}

/// Scalar Q4_0 · Q8 activation in the block-lanes order.
pub(crate) fn dot_q4_0_block_lanes(row: &[u8], act: &Q8Row<'_>) -> f32 {
    combine_block_lanes::<18, false>(row, act, lanes_q4_0)
}

/// Scalar Q5_0 · Q8 activation in the block-lanes order.
pub(crate) fn dot_q5_0_block_lanes(row: &[u8], act: &Q8Row<'_>) -> f32 {
    combine_block_lanes::<22, false>(row, act, lanes_q5_0)
}

/// Scalar Q4_1 · Q8 activation in the block-lanes order.
pub(crate) fn dot_q4_1_block_lanes(row: &[u8], act: &Q8Row<'_>) -> f32 {
    combine_block_lanes::<20, true>(row, act, lanes_q4_1)
}

/// Scalar Q8_0 · Q8 activation.
pub(crate) fn dot_q8_0(row: &[u8], act: &Q8Row<'_>) -> f32 {
    combine::<34, false>(row, act, lanes_q8_0)
}

/// Scalar Q4_0 · Q8 activation.
pub(crate) fn dot_q4_0(row: &[u8], act: &Q8Row<'_>) -> f32 {
    combine::<18, false>(row, act, lanes_q4_0)
}

/// Scalar Q5_0 · Q8 activation.
pub(crate) fn dot_q5_0(row: &[u8], act: &Q8Row<'_>) -> f32 {
    combine::<22, false>(row, act, lanes_q5_0)
}

/// Scalar Q4_1 · Q8 activation (q8_1: with the block sums).
pub(crate) fn dot_q4_1(row: &[u8], act: &Q8Row<'_>) -> f32 {
    combine::<20, true>(row, act, lanes_q4_1)
}

/// The f32-activation dot product `Σ_j w_j·x_j` of a row with dequantized weights `w`
/// (bit-exact with [`dequantize_row`](super::super::dequantize_row)): product `j` is added to
/// lane `j mod 8`, and the lanes are summed by [`hsum8`]. Lengths are the caller's to check.
pub(crate) fn dot_f32(kind: QuantKind, row: &[u8], x: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    match kind {
        QuantKind::F32 => {
            for (j, (w, &x)) in row.chunks_exact(4).zip(x).enumerate() {
                acc[j % 8] += f32::from_le_bytes([w[0], w[1], w[2], w[3]]) * x;
            }
        }
        QuantKind::F16 => {
            for (j, (w, &x)) in row.chunks_exact(2).zip(x).enumerate() {
                acc[j % 8] += f16_at(w, 0) * x;
            }
        }
        _ => {
            // Blocks are 32 or 256 values, multiples of 8: lane j mod 8 is position mod 8.
            let (bs, bb) = (kind.block_size(), kind.block_bytes());
            let mut buf = [0.0f32; 256];
            for (w, xb) in row.chunks_exact(bb).zip(x.chunks_exact(bs)) {
                dequantize_unchecked(kind, w, &mut buf[..bs]);
                for (wc, xc) in buf[..bs].chunks_exact(8).zip(xb.chunks_exact(8)) {
                    for l in 0..8 {
                        acc[l] += wc[l] * xc[l];
                    }
                }
            }
        }
    }
    hsum8(&acc)
}
