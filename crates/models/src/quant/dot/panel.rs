//! Quantized activations regrouped token-parallel for the matrix-product kernels.

use super::super::activation::{Q8_BLOCK, Q8Activation};
#[cfg(any(target_arch = "aarch64", test))]
use super::super::dequant::{f16_at, q5_0_values};
#[cfg(any(target_arch = "aarch64", test))]
use super::super::kind::QuantKind;

/// Tokens per group of a [`Q8Panel`]: the lanes of one 512-bit vector of i32 sums.
pub(crate) const PANEL_TOKENS: usize = 16;

/// Bytes of one block of one token group: 32 values × 16 tokens.
pub(crate) const PANEL_BLOCK_BYTES: usize = Q8_BLOCK * PANEL_TOKENS;

/// The rows of a [`Q8Activation`] in groups of [`PANEL_TOKENS`] tokens, laid out so that one
/// vector load gives four consecutive values of one block for each of sixteen tokens — the
/// operand of `vpdpbusd`, which then adds one weight word's four products into each token's
/// lane. Per group `g` and block `b`:
///
/// - `qs[((g·blocks + b)·8 + c)·64 + 4t + i]` = value `4c + i` of token `16g + t`'s block `b`,
///   plus 128 (unsigned: `vpdpbusd` multiplies unsigned by signed bytes; the kernels take
///   `128·Σw` back off each block's sum);
/// - `d[(g·blocks + b)·16 + t]` and `s[…]`: that block's scale and Q8_1 sum.
///
/// Tokens past the last row (the last group's padding) hold value 0 and scale 0.
#[derive(Clone, Debug, Default)]
pub(crate) struct Q8Panel {
    groups: usize,
    blocks: usize,
    qs: Vec<u8>,
    d: Vec<f32>,
    s: Vec<f32>,
}

impl Q8Panel {
    /// Regroups every row of `act` (replacing the previous contents; the buffers only grow).
    pub(crate) fn build(&mut self, act: &Q8Activation) {
        let (rows, blocks) = (act.rows(), act.cols() / Q8_BLOCK);
        let groups = rows.div_ceil(PANEL_TOKENS);
        self.groups = groups;
        self.blocks = blocks;
        let cells = groups * blocks;
        self.qs.clear();
        self.qs.resize(cells * PANEL_BLOCK_BYTES, 0x80);
        self.d.clear();
        self.d.resize(cells * PANEL_TOKENS, 0.0);
        self.s.clear();
        self.s.resize(cells * PANEL_TOKENS, 0.0);
        for i in 0..rows {
            let (g, t) = (i / PANEL_TOKENS, i % PANEL_TOKENS);
            let row = act.row_unchecked(i);
            for b in 0..blocks {
                let cell = g * blocks + b;
                let values = &row.qs[b * Q8_BLOCK..(b + 1) * Q8_BLOCK];
                let dst = &mut self.qs[cell * PANEL_BLOCK_BYTES..(cell + 1) * PANEL_BLOCK_BYTES];
                scatter_block(dst, values, t);
                self.d[cell * PANEL_TOKENS + t] = row.d[b];
                self.s[cell * PANEL_TOKENS + t] = row.s[b];
            }
        }
    }

    /// What a matrix product over this panel may read and write: the blocks every row and
    /// the panel hold, the tokens (`n` at most, within the groups held), and the rows whose
    /// `n` results fit in an output of `out_len` values. The kernels' bounds, in one place.
    pub(crate) fn clamp<'r, 'a>(
        &self,
        rows: &'r [&'a [u8]],
        block_bytes: usize,
        n: usize,
        out_len: usize,
    ) -> (usize, usize, &'r [&'a [u8]]) {
        clamp_product(self.blocks, self.groups, rows, block_bytes, n, out_len)
    }

    /// Group `g`'s values, scales and sums (`g < groups`).
    pub(crate) fn group(&self, g: usize) -> (&[u8], &[f32], &[f32]) {
        let cells = g * self.blocks..(g + 1) * self.blocks;
        (
            &self.qs[cells.start * PANEL_BLOCK_BYTES..cells.end * PANEL_BLOCK_BYTES],
            &self.d[cells.start * PANEL_TOKENS..cells.end * PANEL_TOKENS],
            &self.s[cells.start * PANEL_TOKENS..cells.end * PANEL_TOKENS],
        )
    }

    /// Bytes the buffers hold (their capacities).
    pub(crate) fn allocated_bytes(&self) -> usize {
        self.qs.capacity() + 4 * (self.d.capacity() + self.s.capacity())
    }
}

/// The bounds of a product over a panel of `groups` token groups and `blocks` blocks per
/// token (blocks of `block_bytes` weight bytes): the blocks every row and the panel hold, the
/// tokens (`n` at most, within the groups held), and the rows whose `n` results fit in an
/// output of `out_len` values. Shared by [`Q8Panel::clamp`] and `Q8KPanel::clamp`.
pub(crate) fn clamp_product<'r, 'a>(
    blocks: usize,
    groups: usize,
    rows: &'r [&'a [u8]],
    block_bytes: usize,
    n: usize,
    out_len: usize,
) -> (usize, usize, &'r [&'a [u8]]) {
    let nb = rows
        .iter()
        .fold(blocks, |nb, row| nb.min(row.len() / block_bytes));
    // Callers pass the panel's own token count; a larger `n` would lay the output out with the
    // reduced one.
    debug_assert!(n <= groups * PANEL_TOKENS, "{n} tokens, panel of {groups}");
    let n = n.min(groups * PANEL_TOKENS);
    (nb, n, &rows[..rows.len().min(out_len / n.max(1))])
}

/// Writes token `t`'s 32 values of one block into the block's cell of a group
/// ([`PANEL_BLOCK_BYTES`] bytes): value `4c + i` at `c·64 + 4t + i`, plus 128.
pub(crate) fn scatter_block(dst: &mut [u8], values: &[i8], t: usize) {
    for (c, quad) in values.chunks_exact(4).enumerate() {
        for (i, &v) in quad.iter().enumerate() {
            dst[c * 64 + 4 * t + i] = (v as u8) ^ 0x80;
        }
    }
}

/// One weight row unpacked for the matrix-product kernels: its values as signed bytes, and per
/// block `128·Σw` (what the panel's +128 adds to each token's sum), the scale and the minimum.
/// The K formats (`panel_k`) add per super-block the integer sub-block scales and minimums,
/// and their `correction` is `128·Σ_j sc_j·Σw_j`.
#[derive(Clone, Debug, Default)]
pub(crate) struct UnpackedRow {
    pub(crate) values: Vec<i8>,
    pub(crate) correction: Vec<i32>,
    pub(crate) d: Vec<f32>,
    pub(crate) m: Vec<f32>,
    pub(crate) scales: Vec<i32>,
    pub(crate) mins: Vec<i32>,
}

/// Unpacks the first `blocks` blocks of a row of `kind` (Q8_0, Q4_0, Q4_1 or Q5_0) into
/// `buf`, in portable code: the signed weights the row kernels multiply (Q8_0's bytes, Q4_0's
/// `q − 8`, Q5_0's `q − 16`, Q4_1's unsigned nibbles), `128·Σw`, the scale and (Q4_1) the
/// minimum per block. What the x86 kernels unpack with AVX2 (`x86::unpack_row`).
#[cfg(any(target_arch = "aarch64", test))]
pub(crate) fn unpack_row_portable(
    kind: QuantKind,
    buf: &mut UnpackedRow,
    row: &[u8],
    blocks: usize,
) {
    let bb = kind.block_bytes();
    buf.values.resize(blocks * Q8_BLOCK, 0);
    buf.correction.resize(blocks, 0);
    buf.d.resize(blocks, 0.0);
    buf.m.resize(blocks, 0.0);
    for (b, w) in row.chunks_exact(bb).take(blocks).enumerate() {
        let values = &mut buf.values[b * Q8_BLOCK..(b + 1) * Q8_BLOCK];
        let nibbles = |qs: &[u8], offset: i8, values: &mut [i8]| {
            for (j, &byte) in qs.iter().enumerate() {
                values[j] = (byte & 0xF) as i8 - offset;
                values[j + 16] = (byte >> 4) as i8 - offset;
            }
        };
        match kind {
            QuantKind::Q8_0 => {
                for (v, &byte) in values.iter_mut().zip(&w[2..34]) {
                    *v = byte as i8;
                }
            }
            QuantKind::Q4_0 => nibbles(&w[2..18], 8, values),
            QuantKind::Q4_1 => nibbles(&w[4..20], 0, values),
            _ => {
                for (v, q) in values.iter_mut().zip(q5_0_values(w)) {
                    *v = q as i8 - 16;
                }
            }
        }
        buf.correction[b] = 128 * values.iter().map(|&v| v as i32).sum::<i32>();
        buf.d[b] = f16_at(w, 0);
        buf.m[b] = if kind == QuantKind::Q4_1 {
            f16_at(w, 2)
        } else {
            0.0
        };
    }
}

/// Unpacking space of a matrix-product kernel: the weight rows it multiplies at once. Made
/// once per parallel task; only the x86 and aarch64 kernels read it.
#[derive(Clone, Debug, Default)]
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
pub(crate) struct GemmBufs {
    pub(crate) rows: [UnpackedRow; 2],
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::super::x86::{self, Q4_0, Q4_1, Q5_0, Q8_0};
    use super::*;

    /// The portable unpacking (what the NEON matrix products read) gives the AVX2 unpacking's
    /// values, corrections, scales and (Q4_1) minimums, on 13 blocks of random code bytes.
    #[test]
    fn portable_unpacking_matches_the_avx2_one() {
        if !is_x86_feature_detected!("avx2") || !is_x86_feature_detected!("f16c") {
            return;
        }
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut byte = || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 56) as u8
        };
        for (kind, k) in [
            (QuantKind::Q8_0, Q8_0),
            (QuantKind::Q4_0, Q4_0),
            (QuantKind::Q4_1, Q4_1),
            (QuantKind::Q5_0, Q5_0),
        ] {
            let blocks = 13;
            let mut row: Vec<u8> = (0..blocks * kind.block_bytes()).map(|_| byte()).collect();
            for block in row.chunks_mut(kind.block_bytes()) {
                // Finite f16 scales (and Q4_1 minimums): 0x3C00 = 1.0 with random low bits.
                block[1] = 0x3C;
                if kind == QuantKind::Q4_1 {
                    block[3] = 0xBC;
                }
            }
            let (mut portable, mut avx2) = (UnpackedRow::default(), UnpackedRow::default());
            unpack_row_portable(kind, &mut portable, &row, blocks);
            let unpack = match k {
                Q8_0 => x86::unpack_row::<Q8_0>,
                Q4_0 => x86::unpack_row::<Q4_0>,
                Q4_1 => x86::unpack_row::<Q4_1>,
                _ => x86::unpack_row::<Q5_0>,
            };
            // SAFETY: AVX2 and F16C were detected above; the row holds `blocks` whole blocks.
            unsafe { unpack(&mut avx2, &row, blocks) };
            assert_eq!(portable.values, avx2.values, "{kind}");
            assert_eq!(portable.correction, avx2.correction, "{kind}");
            assert_eq!(portable.d, avx2.d, "{kind}");
            if kind == QuantKind::Q4_1 {
                assert_eq!(portable.m, avx2.m, "{kind}");
            }
        }
    }
}
