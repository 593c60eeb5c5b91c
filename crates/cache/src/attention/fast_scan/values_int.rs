//! The values' weighted sum in integers ([`ValueSums::Int8`](super::ValueSums::Int8)).
//!
//! Per head `h` and block `b` of 32 tokens the weights `w_t = p_t·‖v_t‖/Σp` (non-negative)
//! become 7-bit integers `u_t = round(w_t / s_hb)`, `s_hb = max_{t ∈ b} w_t / 127`, and the
//! value codebook 8-bit integers `e_k = round(c_k / γ)`, `γ = max_k |c_k| / 127`. A block's
//! contribution to rotated coordinate `j` is then an exact integer, `Σ_t u_t·e[code(t, j)]`
//! (`|·| ≤ 32·127·127 < 2^24`), computed as `vpmaddubsw` computes it: one byte shuffle looks
//! up 32 tokens' centroids, one multiply-add pairs them with the weights (a pair's sum stays
//! within `2·127·127 < 2^15`, so nothing saturates), one more widens to 32 bits, and additions
//! of integers reduce them to the block's whole sum per coordinate (at most `2^24` in
//! magnitude: exact in f32). That sum is then scaled by `s_hb` (a multiplication, then an
//! addition to the coordinate's running f32 sum, in block order), and the output coordinate is
//! `γ` times the running sum. The integers are exact and the float steps fixed, so every
//! instruction set gives the same bits.
//!
//! **Error.** Against the exact `Σ_t w_t·c[code]`: rounding a weight moves it by at most
//! `s_hb/2`, a centroid by at most `γ/2`, so coordinate `j` of a head moves by at most
//! `Σ_b 32·(s_hb/2)·(max|c| + γ/2) + Σ_t w_t·γ/2` (plus f32 rounding) — tested, and compared
//! with the value codec's own error in `tests/fast_scan.rs`: 0.6–1.2% of it at b = 2, up to 9%
//! at b = 4, where rounding the centroids to bytes (`γ/√12` per coordinate) dominates.
//!
//! **Speed.** Per block, eight coordinates and a head take eight `vpmaddubsw`, eight
//! `vpmaddwd`, four integer adds and three horizontal ones, a permutation and four vector
//! float operations, against 32 multiplications and additions per coordinate and head in the
//! f32 lanes (`tq bench scan --attention`, docs/results.md).

use super::BLOCK;
use super::layout::LANE_BYTES;

/// The largest magnitude of a quantized weight or centroid.
pub(super) const LEVELS: f32 = 127.0;

/// `(e, γ)`: the centroids (up to 256) as signed bytes `round(c_k / γ)`, padded with zeros
/// to 256 entries, and their step `γ = max|c_k| / 127` (zero for an all-zero codebook).
fn centroid_bytes(centroids: &[f32]) -> ([i8; 256], f32) {
    let max = centroids.iter().fold(0.0f32, |m, c| m.max(c.abs()));
    let gamma = max / LEVELS;
    let mut e = [0i8; 256];
    if gamma > 0.0 {
        for (e, c) in e.iter_mut().zip(centroids) {
            *e = round_half_even(c / gamma).clamp(-LEVELS, LEVELS) as i8;
        }
    }
    (e, gamma)
}

/// A value codebook as the integer sums read it: per position `i` of a nibble lane (`m` codes
/// per nibble, [`codes_per_lane`](super::layout::codes_per_lane)), the 16 bytes
/// `e[(n >> b·i) mod 2^b]` that nibble `n` decodes to, `e` the centroids as bytes
/// `round(c_k / γ)`. Coordinate `j` reads lane `j / m` through table `j mod m`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct ValueTables {
    /// Tables `0..per`.
    pub(super) tables: [[i8; 16]; 4],
    /// Codes per nibble.
    pub(super) per: usize,
    /// The centroids' step `γ = max|c_k| / 127`.
    pub(super) gamma: f32,
    /// The centroids as bytes, `e[k]` for every code `k` (zero past `2^bits`): what a
    /// coordinate stored as bit planes looks its code up in.
    pub(super) bytes: [i8; 256],
}

impl ValueTables {
    /// The tables of `centroids` (`2^bits` of them, `bits` ≤ 8; the nibble tables hold
    /// `bits` ≤ 4).
    pub(crate) fn new(centroids: &[f32], bits: u8) -> Self {
        let (bytes, gamma) = centroid_bytes(centroids);
        let (tables, per) =
            super::layout::lane_tables(&bytes[..centroids.len().min(16)], bits.min(4));
        Self {
            tables,
            per,
            gamma,
            bytes,
        }
    }
}

/// `1.5·2^23`: added to `|x| < 2^22`, it rounds `x` to an integer (ties to even).
pub(super) const ROUND: f32 = 12_582_912.0;

/// `x` rounded to the nearest integer, ties to even, for `|x| < 2^22`: one addition and one
/// subtraction of [`ROUND`] (a library `round` costs more).
#[inline]
fn round_half_even(x: f32) -> f32 {
    (x + ROUND) - ROUND
}

/// One head's weights of one block (32 values, non-negative) as `(u, s)`: bytes
/// `u_t = round(w_t / s)` (tokens `0..16` then `16..32`) and the block's scale
/// `s = max w_t / 127` (zero, with every `u_t` zero, for a block of zero weights).
#[inline(always)]
pub(super) fn weight_bytes(weights: &[f32; BLOCK], out: &mut [u8; BLOCK]) -> f32 {
    let max = super::weights::lane_max(weights, 0.0);
    let scale = max / LEVELS;
    if scale > 0.0 {
        for (u, &w) in out.iter_mut().zip(weights) {
            // `w / scale` lies in [0, 127] (a division, not a multiplication by `1/scale`,
            // which overflows for a subnormal scale and turns a zero weight into NaN): adding
            // 1.5·2^23 rounds it to an integer (ties to even) held in the last mantissa bits,
            // read without a float-to-int conversion (which the compiler keeps scalar).
            let shifted = (w / scale).min(LEVELS) + ROUND;
            *u = (shifted.to_bits() - ROUND.to_bits()) as u8;
        }
    } else {
        out.fill(0);
    }
    scale
}

/// The reference loop: for each coordinate `j < rows` and head `h`, the block's integer sum
/// times the head's scale, added to `lanes[h·rows + j]`; coordinate `j` reads nibble lane
/// `j / m` through `tables.tables[j mod m]` (`rows` is the lanes times `m`).
///
/// `weights[h]` holds head `h`'s 32 weight bytes of this block and `scales[h]` its scale.
pub(super) fn accumulate_block(
    codes: &[u8],
    rows: usize,
    tables: &ValueTables,
    weights: &[[u8; BLOCK]],
    scales: &[f32],
    lanes: &mut [f32],
) {
    let per = tables.per;
    for j in 0..rows {
        let table = &tables.tables[j % per];
        let lane = &codes[(j / per) * LANE_BYTES..(j / per + 1) * LANE_BYTES];
        for (h, (u, &scale)) in weights.iter().zip(scales).enumerate() {
            let mut sum = 0i32;
            for (i, &byte) in lane.iter().enumerate() {
                let low = i32::from(u[i]) * i32::from(table[usize::from(byte & 0x0F)]);
                let high = i32::from(u[i + LANE_BYTES]) * i32::from(table[usize::from(byte >> 4)]);
                sum += low + high;
            }
            lanes[h * rows + j] += scale * sum as f32;
        }
    }
}

/// A coordinate's output from its running sum: `γ·P`.
#[inline]
pub(super) fn reduce(sum: f32, gamma: f32) -> f32 {
    gamma * sum
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Weights round to the nearest step of their block's scale, the largest to 127, zeros
    /// to 0 — also when the scale is subnormal, where `1/scale` would overflow (there the
    /// scale itself is coarse: the largest weight may take fewer than 127 steps of it).
    #[test]
    fn weight_bytes_round_to_the_blocks_steps() {
        for max in [1.0f32, 3.5e-3, 1e-30, 1e-38, 1e-43] {
            let mut weights = [0.0f32; BLOCK];
            for (t, w) in weights.iter_mut().enumerate() {
                *w = max * (t % 11) as f32 / 10.0;
            }
            let mut bytes = [0u8; BLOCK];
            let scale = weight_bytes(&weights, &mut bytes);
            assert_eq!(scale, max / 127.0);
            for (t, (&u, &w)) in bytes.iter().zip(&weights).enumerate() {
                let exact = f64::from(w) / f64::from(scale);
                assert!(
                    (f64::from(u) - exact).abs() <= 0.5 + 1e-3 * exact.max(1.0),
                    "max {max:e}, token {t}: {u} for {exact}"
                );
            }
            assert_eq!(bytes[0], 0);
            if scale.is_normal() {
                assert_eq!(bytes[10], 127, "max {max:e}");
            }
        }
        let mut bytes = [1u8; BLOCK];
        assert_eq!(weight_bytes(&[0.0; BLOCK], &mut bytes), 0.0);
        assert_eq!(bytes, [0; BLOCK]);
    }
}
