//! Portable kernels: the integer block sums, the fixed-order f32 combination every instruction
//! set reproduces, and the f32-activation reference dot product.

use super::super::activation::{Q8_BLOCK, Q8Row};
use super::super::dequant::{dequantize_unchecked, f16_at};
use super::super::kind::QuantKind;

/// Sums eight lanes in the fixed order `((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))` (what the AVX2
/// horizontal sum computes).
#[inline]
pub(crate) fn hsum8(a: &[f32; 8]) -> f32 {
    ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]))
}

/// `Σ q_w·q_x` of a Q8_0 block (34 bytes) and 32 activation bytes.
#[inline]
pub(crate) fn isum_q8_0(w: &[u8], y: &[i8]) -> i32 {
    w[2..34]
        .iter()
        .zip(y)
        .map(|(&q, &y)| q as i8 as i32 * y as i32)
        .sum()
}

/// `Σ (q_w − 8)·q_x` of a Q4_0 block (18 bytes) and 32 activation bytes.
#[inline]
pub(crate) fn isum_q4_0(w: &[u8], y: &[i8]) -> i32 {
    let (lo, hi) = y.split_at(16);
    w[2..18]
        .iter()
        .zip(lo.iter().zip(hi))
        .map(|(&q, (&a, &b))| ((q & 0xF) as i32 - 8) * a as i32 + ((q >> 4) as i32 - 8) * b as i32)
        .sum()
}

/// `Σ q_w·q_x` of a Q4_1 block (20 bytes, unsigned nibbles) and 32 activation bytes.
#[inline]
pub(crate) fn isum_q4_1(w: &[u8], y: &[i8]) -> i32 {
    let (lo, hi) = y.split_at(16);
    w[4..20]
        .iter()
        .zip(lo.iter().zip(hi))
        .map(|(&q, (&a, &b))| (q & 0xF) as i32 * a as i32 + (q >> 4) as i32 * b as i32)
        .sum()
}

/// The fixed f32 combination of per-block integer sums, shared by the scalar and NEON paths
/// and mirrored lane for lane by AVX2:
///
/// ```text
/// acc[b mod 8]   += (d_w[b] · d_x[b]) · isum[b]        (two roundings: product, then product)
/// acc_m[b mod 8] += m_w[b] · s_x[b]                    (Q4_1 only)
/// result = hsum8(acc) + hsum8(acc_m)                    (hsum8: the fixed lane order)
/// ```
///
/// `BB` is the block's byte size; `MIN` says the block stores an f16 minimum at bytes 2..4.
#[inline]
pub(crate) fn combine<const BB: usize, const MIN: bool>(
    row: &[u8],
    act: &Q8Row<'_>,
    isum: impl Fn(&[u8], &[i8]) -> i32,
) -> f32 {
    let mut acc = [0.0f32; 8];
    let mut acc_m = [0.0f32; 8];
    let blocks = row.chunks_exact(BB).zip(act.qs.chunks_exact(Q8_BLOCK));
    for (b, (w, y)) in blocks.enumerate() {
        let lane = b % 8;
        acc[lane] += (f16_at(w, 0) * act.d[b]) * isum(w, y) as f32;
        if MIN {
            acc_m[lane] += f16_at(w, 2) * act.s[b];
        }
    }
    if MIN {
        hsum8(&acc) + hsum8(&acc_m)
    } else {
        hsum8(&acc)
    }
}

/// Scalar Q8_0 · Q8 activation.
pub(crate) fn dot_q8_0(row: &[u8], act: &Q8Row<'_>) -> f32 {
    combine::<34, false>(row, act, isum_q8_0)
}

/// Scalar Q4_0 · Q8 activation.
pub(crate) fn dot_q4_0(row: &[u8], act: &Q8Row<'_>) -> f32 {
    combine::<18, false>(row, act, isum_q4_0)
}

/// Scalar Q4_1 · Q8 activation (q8_1: with the block sums).
pub(crate) fn dot_q4_1(row: &[u8], act: &Q8Row<'_>) -> f32 {
    combine::<20, true>(row, act, isum_q4_1)
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
