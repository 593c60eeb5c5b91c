//! How a [`TokenStore`](crate::token_store::TokenStore) lays its records out in memory.
//!
//! [`RecordOrder::Rows`] keeps each record's words together (token-major), what every codec
//! writes and reads. [`RecordOrder::FastScan`] keeps records **32 tokens at a time,
//! nibble-major**: the layout of the fast-scan kernel
//! ([`attention::fast_scan`](crate::attention::fast_scan)), in which one byte shuffle looks up
//! a nibble's table entries for 32 tokens at once. A record of `w` words is `8w` nibbles
//! (nibble `k` of a record is bits `4(k mod 8) ..` of its word `k / 8`), which hold one 4-bit,
//! two 2-bit or four 1-bit codes each in the order [`packing`](crate::codec::packing) writes
//! them; the order itself only moves nibbles. A block of 32 records is `8w · 16` bytes: for
//! each nibble lane `k`, 16 bytes, byte `i` holding token `i`'s nibble in its low half and
//! token `i + 16`'s in its high half. The same bytes as the records, permuted, so a fast-scan
//! store costs what a row store does; the scales (norms) stay token-major beside the codes.

use serde::{Deserialize, Serialize};

/// Tokens per block of the fast-scan order (and of the kernel's standalone layout,
/// [`fast_scan::BLOCK`](crate::attention::fast_scan::BLOCK), which is this constant).
pub const FAST_SCAN_BLOCK: usize = 32;

/// Bytes of one nibble lane of a block: 32 nibbles.
pub(crate) const LANE_BYTES: usize = FAST_SCAN_BLOCK / 2;

/// The memory order of a store's records.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RecordOrder {
    /// Token-major: each record's words contiguous.
    #[default]
    Rows,
    /// Records in blocks of 32 tokens, nibble-major (the module docs).
    FastScan,
}

/// Bytes of a fast-scan block of records of `record_words` words.
pub(crate) fn block_bytes(record_words: usize) -> usize {
    record_words * 8 * LANE_BYTES
}

/// Writes `record` (words of packed codes, read as nibbles) into slot `slot` (< 32) of `block`.
pub(crate) fn scatter(record: &[u32], slot: usize, block: &mut [u8]) {
    let (byte, shift) = (slot % LANE_BYTES, 4 * (slot / LANE_BYTES));
    let keep = !(0x0Fu8 << shift);
    for (w, &word) in record.iter().enumerate() {
        for k in 0..8 {
            let code = ((word >> (4 * k)) & 0x0F) as u8;
            let b = &mut block[(8 * w + k) * LANE_BYTES + byte];
            *b = (*b & keep) | (code << shift);
        }
    }
}

/// Reads slot `slot` (< 32) of `block` back into `record`: the inverse of [`scatter`].
pub(crate) fn gather(block: &[u8], slot: usize, record: &mut [u32]) {
    let (byte, shift) = (slot % LANE_BYTES, 4 * (slot / LANE_BYTES));
    for (w, word) in record.iter_mut().enumerate() {
        *word = (0..8).fold(0u32, |acc, k| {
            let code = (block[(8 * w + k) * LANE_BYTES + byte] >> shift) & 0x0F;
            acc | u32::from(code) << (4 * k)
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scatter_then_gather_is_the_identity_and_leaves_other_slots() {
        let w = 3;
        let mut block = vec![0u8; block_bytes(w)];
        let records: Vec<Vec<u32>> = (0..FAST_SCAN_BLOCK as u32)
            .map(|t| {
                (0..w as u32)
                    .map(|i| t.wrapping_mul(0x9E37_79B9) ^ i)
                    .collect()
            })
            .collect();
        for (slot, r) in records.iter().enumerate() {
            scatter(r, slot, &mut block);
        }
        // Overwrite one slot twice: the last write wins, the others are untouched.
        scatter(&[u32::MAX; 3], 7, &mut block);
        scatter(&records[7], 7, &mut block);
        let mut back = vec![0u32; w];
        for (slot, r) in records.iter().enumerate() {
            gather(&block, slot, &mut back);
            assert_eq!(&back, r, "slot {slot}");
        }
        // Coordinate 9 of token 20: word 1, nibble 1; byte 9·16 + 4, high nibble.
        let code = (records[20][1] >> 4) & 0x0F;
        assert_eq!(u32::from(block[9 * 16 + 4] >> 4), code);
    }
}
