//! Host-side reads and writes of one record in a page's words, in the stream's order: rows
//! (`[kv_heads, page_tokens, record_words]`) or the fast-scan order of `tq_cache::record_order`
//! (per KV head, blocks of 32 slots, each the words 32 rows would take, nibble-major, through
//! the stream's bit planes). The upload and download paths use these; the kernels read and
//! write the same layout (`common.wgsl`: `block_word`, `lane_at`).
//!
//! The blocks are written and read as bytes, the order the GPU reads a u32 word's bytes in
//! (little-endian: byte `i` of a lane is bits `8·(i mod 4)` of its word), on any host.

use std::ops::Range;

use tq_cache::record_order::{self, FAST_SCAN_BLOCK};

use crate::tables::StreamLayoutGpu;

/// The words of KV head `h`'s 32-slot block holding slot `local` of a page of `page_tokens`
/// slots, for records of `record_words` words.
pub(crate) fn block_words(
    h: usize,
    local: usize,
    page_tokens: usize,
    record_words: usize,
) -> Range<usize> {
    let first = (h * page_tokens + local / FAST_SCAN_BLOCK * FAST_SCAN_BLOCK) * record_words;
    first..first + FAST_SCAN_BLOCK * record_words
}

/// Writes the plain record `record` (as the codec packs it) of KV head `h` into slot `local`.
pub(crate) fn put_record(
    words: &mut [u32],
    stream: &StreamLayoutGpu,
    h: usize,
    page_tokens: usize,
    local: usize,
    record: &[u32],
) {
    let rw = stream.record_words;
    if !stream.fast_scan() {
        let row = h * page_tokens + local;
        words[row * rw..(row + 1) * rw].copy_from_slice(record);
        return;
    }
    let block = &mut words[block_words(h, local, page_tokens, rw)];
    let slot = local % FAST_SCAN_BLOCK;
    match stream.planes.get(h).and_then(Option::as_ref) {
        Some(planes) => {
            let mut permuted = vec![0u32; rw];
            planes.permute(record, &mut permuted);
            record_order::scatter(&permuted, slot, bytemuck::cast_slice_mut(block));
        }
        None => record_order::scatter(record, slot, bytemuck::cast_slice_mut(block)),
    }
}

/// The plain record of KV head `h` in slot `local` (the inverse of [`put_record`]).
pub(crate) fn take_record(
    words: &[u32],
    stream: &StreamLayoutGpu,
    h: usize,
    page_tokens: usize,
    local: usize,
) -> Vec<u32> {
    let rw = stream.record_words;
    if !stream.fast_scan() {
        let row = h * page_tokens + local;
        return words[row * rw..(row + 1) * rw].to_vec();
    }
    let block = &words[block_words(h, local, page_tokens, rw)];
    let mut stored = vec![0u32; rw];
    record_order::gather(
        bytemuck::cast_slice(block),
        local % FAST_SCAN_BLOCK,
        &mut stored,
    );
    match stream.planes.get(h).and_then(Option::as_ref) {
        Some(planes) => {
            let mut record = vec![0u32; rw];
            planes.restore(&stored, &mut record);
            record
        }
        None => stored,
    }
}

/// Copies whole fast-scan blocks `codes` (a CPU store's bytes, its first block starting at slot
/// `local`, a multiple of 32) into KV head `h`'s blocks from that slot on: as many as cover `n`
/// slots.
pub(crate) fn put_blocks(
    words: &mut [u32],
    record_words: usize,
    h: usize,
    page_tokens: usize,
    local: usize,
    codes: &[u8],
    n: usize,
) {
    debug_assert_eq!(local % FAST_SCAN_BLOCK, 0);
    let bytes =
        (n.div_ceil(FAST_SCAN_BLOCK) * record_order::block_bytes(record_words)).min(codes.len());
    let first = block_words(h, local, page_tokens, record_words).start;
    let dst: &mut [u8] = bytemuck::cast_slice_mut(&mut words[first..first + bytes / 4]);
    dst.copy_from_slice(&codes[..bytes]);
}
