//! The reference loop: one table look-up per nibble.

use super::BLOCK;
use super::layout::LANE_BYTES;

/// `out[t] = Σ_j entries[16 j + code(t, j)]` over the block's padded coordinates.
pub(super) fn sums(entries: &[u8], codes: &[u8], out: &mut [u32; BLOCK]) {
    out.fill(0);
    for (lut, lane) in entries
        .chunks_exact(LANE_BYTES)
        .zip(codes.chunks_exact(LANE_BYTES))
    {
        for (i, &byte) in lane.iter().enumerate() {
            out[i] += u32::from(lut[usize::from(byte & 0x0F)]);
            out[i + LANE_BYTES] += u32::from(lut[usize::from(byte >> 4)]);
        }
    }
}
