//! Q8_K activations regrouped token-parallel, and K-format weight rows unpacked, for the
//! matrix-product kernels of Q4_K and Q6_K in the block-lanes order.

use super::super::activation_k::{Q8KActivation, QK_K};
use super::super::dequant::{f16_at, unpack_q4k_scales};
use super::panel::{PANEL_BLOCK_BYTES, PANEL_TOKENS, UnpackedRow, clamp_product, scatter_block};

/// 32-value blocks per super-block (each a [`PANEL_BLOCK_BYTES`] cell of a group).
const BLOCKS_PER_SUPER: usize = QK_K / 32;

/// Bytes of one super-block of one token group.
pub(crate) const PANEL_SUPER_BYTES: usize = BLOCKS_PER_SUPER * PANEL_BLOCK_BYTES;

/// The rows of a [`Q8KActivation`] in groups of [`PANEL_TOKENS`] tokens. Per group `g` and
/// super-block `b` (`cell = g·superblocks + b`):
///
/// - `qs[cell·4096 + q·64 + 4t + i]` = value `4q + i` of token `16g + t`'s super-block `b`,
///   plus 128 (`q < 64`: one `vpdpbusd` operand per word of four weights, as in
///   [`Q8Panel`](super::Q8Panel));
/// - `d[cell·16 + t]`: the super-block's scale;
/// - `sums[(cell·4 + k)·32 + 2t + h]` = the sum of token `t`'s values `32(2k+h) ..
///   32(2k+h) + 32` (the Q4_K sub-block `2k + h`), as i16 pairs so that one `vpmaddwd` against
///   a word of two minimums gives `m_2k·S_2k + m_2k+1·S_2k+1` per token.
///
/// Tokens past the last row hold value 0 and scale 0.
#[derive(Clone, Debug, Default)]
pub(crate) struct Q8KPanel {
    groups: usize,
    superblocks: usize,
    qs: Vec<u8>,
    d: Vec<f32>,
    sums: Vec<i16>,
}

impl Q8KPanel {
    /// Regroups every row of `act` (replacing the previous contents; the buffers only grow).
    pub(crate) fn build(&mut self, act: &Q8KActivation) {
        let (rows, superblocks) = (act.rows(), act.cols() / QK_K);
        let groups = rows.div_ceil(PANEL_TOKENS);
        self.groups = groups;
        self.superblocks = superblocks;
        let cells = groups * superblocks;
        self.qs.clear();
        self.qs.resize(cells * PANEL_SUPER_BYTES, 0x80);
        self.d.clear();
        self.d.resize(cells * PANEL_TOKENS, 0.0);
        self.sums.clear();
        self.sums.resize(cells * 4 * 2 * PANEL_TOKENS, 0);
        for i in 0..rows {
            let (g, t) = (i / PANEL_TOKENS, i % PANEL_TOKENS);
            let row = act.row_unchecked(i);
            for b in 0..superblocks {
                let cell = g * superblocks + b;
                let values = &row.qs[b * QK_K..(b + 1) * QK_K];
                let dst = &mut self.qs[cell * PANEL_SUPER_BYTES..(cell + 1) * PANEL_SUPER_BYTES];
                for (block, cell_bytes) in dst.chunks_exact_mut(PANEL_BLOCK_BYTES).enumerate() {
                    scatter_block(cell_bytes, &values[32 * block..32 * (block + 1)], t);
                }
                self.d[cell * PANEL_TOKENS + t] = row.d[b];
                let bsums = &row.bsums[b * 16..(b + 1) * 16];
                for j in 0..BLOCKS_PER_SUPER {
                    let (k, h) = (j / 2, j % 2);
                    self.sums[(cell * 4 + k) * 2 * PANEL_TOKENS + 2 * t + h] =
                        bsums[2 * j] + bsums[2 * j + 1];
                }
            }
        }
    }

    /// What a matrix product over this panel may read and write (as
    /// [`Q8Panel::clamp`](super::Q8Panel::clamp)): the super-blocks every row and the panel
    /// hold, the tokens, and the rows whose `n` results fit in `out_len` values.
    pub(crate) fn clamp<'r, 'a>(
        &self,
        rows: &'r [&'a [u8]],
        block_bytes: usize,
        n: usize,
        out_len: usize,
    ) -> (usize, usize, &'r [&'a [u8]]) {
        clamp_product(self.superblocks, self.groups, rows, block_bytes, n, out_len)
    }

    /// Group `g`'s values, scales and sub-block sums (`g < groups`).
    pub(crate) fn group(&self, g: usize) -> (&[u8], &[f32], &[i16]) {
        let cells = g * self.superblocks..(g + 1) * self.superblocks;
        (
            &self.qs[cells.start * PANEL_SUPER_BYTES..cells.end * PANEL_SUPER_BYTES],
            &self.d[cells.start * PANEL_TOKENS..cells.end * PANEL_TOKENS],
            &self.sums[cells.start * 8 * PANEL_TOKENS..cells.end * 8 * PANEL_TOKENS],
        )
    }

    /// Bytes the buffers hold (their capacities).
    pub(crate) fn allocated_bytes(&self) -> usize {
        self.qs.capacity() + 4 * self.d.capacity() + 2 * self.sums.capacity()
    }
}

/// Bytes of a Q4_K super-block.
pub(crate) const Q4K_BYTES: usize = 144;
/// Bytes of a Q6_K super-block.
pub(crate) const Q6K_BYTES: usize = 210;

/// Unpacks the first `superblocks` super-blocks of a Q4_K row: `values` the 256 nibbles of
/// each in value order, `scales` and `mins` the eight 6-bit sub-block scales and minimums
/// (`mins` as `m_2k | m_2k+1 << 16`, four words per super-block: the `vpmaddwd` operand),
/// `correction` `128·Σ_j sc_j·Σ q_j` (what the panel's +128 adds to `I`), `d` and `m` the f16
/// `d` and `dmin`.
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
pub(crate) fn unpack_q4k(buf: &mut UnpackedRow, row: &[u8], superblocks: usize) {
    resize(buf, superblocks, 8);
    for (b, w) in row.chunks_exact(Q4K_BYTES).take(superblocks).enumerate() {
        let packed: [u8; 12] = w[4..16].try_into().expect("12 scale bytes");
        let (scales, mins) = unpack_q4k_scales(&packed);
        let values = &mut buf.values[b * QK_K..(b + 1) * QK_K];
        for i in 0..4 {
            for (l, &byte) in w[16 + 32 * i..16 + 32 * (i + 1)].iter().enumerate() {
                values[64 * i + l] = (byte & 0xF) as i8;
                values[64 * i + 32 + l] = (byte >> 4) as i8;
            }
        }
        let mut correction = 0i32;
        for (j, &sc) in scales.iter().enumerate() {
            let sum: i32 = values[32 * j..32 * (j + 1)].iter().map(|&v| v as i32).sum();
            correction += sc as i32 * sum;
            buf.scales[8 * b + j] = sc as i32;
        }
        for k in 0..4 {
            buf.mins[4 * b + k] = mins[2 * k] as i32 | (mins[2 * k + 1] as i32) << 16;
        }
        buf.correction[b] = 128 * correction;
        buf.d[b] = f16_at(w, 0);
        buf.m[b] = f16_at(w, 2);
    }
}

/// Unpacks the first `superblocks` super-blocks of a Q6_K row: `values` the 256 values
/// `q − 32` (−32..=31) of each in value order, `scales` the sixteen i8 sub-block scales,
/// `correction` `128·Σ_s sc_s·Σ (q − 32)`, `d` the f16 `d`.
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
pub(crate) fn unpack_q6k(buf: &mut UnpackedRow, row: &[u8], superblocks: usize) {
    resize(buf, superblocks, 16);
    for (b, w) in row.chunks_exact(Q6K_BYTES).take(superblocks).enumerate() {
        let values = &mut buf.values[b * QK_K..(b + 1) * QK_K];
        for half in 0..2 {
            let ql = &w[64 * half..64 * half + 64];
            let qh = &w[128 + 32 * half..128 + 32 * half + 32];
            let o = &mut values[128 * half..128 * (half + 1)];
            for l in 0..32 {
                let h = qh[l];
                o[l] = ((ql[l] & 0xF) | ((h & 3) << 4)) as i8 - 32;
                o[l + 32] = ((ql[l + 32] & 0xF) | (((h >> 2) & 3) << 4)) as i8 - 32;
                o[l + 64] = ((ql[l] >> 4) | (((h >> 4) & 3) << 4)) as i8 - 32;
                o[l + 96] = ((ql[l + 32] >> 4) | (((h >> 6) & 3) << 4)) as i8 - 32;
            }
        }
        let mut correction = 0i32;
        for s in 0..16 {
            let sc = w[192 + s] as i8 as i32;
            let sum: i32 = values[16 * s..16 * (s + 1)].iter().map(|&v| v as i32).sum();
            correction += sc * sum;
            buf.scales[16 * b + s] = sc;
        }
        buf.correction[b] = 128 * correction;
        buf.d[b] = f16_at(w, 208);
    }
}

/// Sizes `buf` for `superblocks` super-blocks of `subs` sub-blocks (the buffers only grow).
fn resize(buf: &mut UnpackedRow, superblocks: usize, subs: usize) {
    buf.values.resize(superblocks * QK_K, 0);
    buf.scales.resize(superblocks * subs, 0);
    buf.mins.resize(superblocks * 4, 0);
    buf.correction.resize(superblocks, 0);
    buf.d.resize(superblocks, 0.0);
    buf.m.resize(superblocks, 0.0);
}
