//! The fast scan on a cache's records: runs of a [`TokenStore`](crate::token_store::TokenStore)
//! kept in [`RecordOrder::FastScan`](crate::record_order::RecordOrder::FastScan), as the fused
//! kernel walks them ([`RunRecords::FastScan`](crate::token_store::RunRecords::FastScan): the
//! whole blocks of 32 records that cover the run, the run starting at slot `lead`).
//!
//! [`score_run`] gives each token of the run its fast score against each head's
//! [`ScoreTable`]; [`accumulate_run`] adds each head's weighted values, in the rotated domain,
//! to the fused kernel's accumulator, summed in integers. Both read the blocks with the kernels
//! of the standalone layout ([`FastScanBlocks`](super::FastScanBlocks)), whose bytes these
//! are, so a token's score is the one [`scores`](super::scores) gives for it, bit for bit,
//! wherever its block starts in the run. Slots of a block outside the run are read and
//! ignored: their scores are not written and their weights are zero.
//!
//! Why integer value sums: values summed in f32 from this layout (a centroid looked up per
//! code and multiplied by each head's weight, sixteen lanes per coordinate) measured no faster
//! than the rows kernel, which does the same work per code; `vpmaddubsw` multiplies and pairs
//! 32 tokens' weight and centroid bytes in one instruction (docs/results.md, "The fast-scan
//! order in the cache").

use super::layout::LANE_BYTES;
use super::values_int::ValueTables;
use super::{BLOCK, ScoreTable, sums_tile};
use crate::attention::simd::Isa;

/// The slots of block `b` of a run of `n` tokens that starts at slot `lead` of block 0, as
/// `(first slot, end slot, run index of the first slot)`; `None` past the run.
fn block_slots(b: usize, lead: usize, n: usize) -> Option<(usize, usize, usize)> {
    let lo = if b == 0 { lead } else { 0 };
    let first = (b * BLOCK + lo).checked_sub(lead)?;
    (first < n).then(|| (lo, BLOCK.min(lo + n - first), first))
}

/// The norms of a whole block, one per token, where the AVX2 block kernels take it (compiled
/// for AVX2, all 32 slots of the block in the run); `None` sends the block to the loops.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn whole_block_norms<const AVX2: bool>(
    norms: &[f32],
    stride: usize,
    (lo, hi, k0): (usize, usize, usize),
) -> Option<&[f32; BLOCK]> {
    if !AVX2 || stride != 1 || hi - lo != BLOCK {
        return None;
    }
    norms.get(k0..k0 + BLOCK)?.try_into().ok()
}

/// Dispatch of [`score_run_body`]: compiled for AVX2 where the CPU has it, so the scores'
/// float steps run eight lanes at a time (the same operations, so the same bits).
#[allow(clippy::too_many_arguments)]
pub(crate) fn score_run(
    isa: Isa,
    tables: &[ScoreTable],
    codes: &[u8],
    lead: usize,
    n: usize,
    norms: (&[f32], usize),
    out: &mut [f32],
    row: usize,
    add: bool,
) {
    #[cfg(target_arch = "x86_64")]
    if super::avx2_kernels(isa) {
        // SAFETY: AVX2 was detected at run time (`avx2_kernels`).
        unsafe { score_run_avx2(isa, tables, codes, lead, n, norms, out, row, add) };
        return;
    }
    score_run_body::<false>(isa, tables, codes, lead, n, norms, out, row, add);
}

/// [`score_run_body`] compiled for AVX2.
///
/// # Safety
/// AVX2 must be available.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2")]
unsafe fn score_run_avx2(
    isa: Isa,
    tables: &[ScoreTable],
    codes: &[u8],
    lead: usize,
    n: usize,
    norms: (&[f32], usize),
    out: &mut [f32],
    row: usize,
    add: bool,
) {
    score_run_body::<true>(isa, tables, codes, lead, n, norms, out, row, add);
}

/// `out[h·row + k] = norm_k · (δ_h · sum_h(k) + o_h)` for the `n` tokens `k` of the run whose
/// blocks are `codes` (from slot `lead`), `tables[h]` the table of head `h`; `norms[k·stride]`
/// is token `k`'s norm. With `add` the product is added to `out` instead (the tables of a
/// second scale: two tiers), the same float steps on every instruction set.
///
/// # Panics
/// If `codes` is not whole blocks of the tables' width, or `out` / `norms` are too short.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn score_run_body<const AVX2: bool>(
    isa: Isa,
    tables: &[ScoreTable],
    codes: &[u8],
    lead: usize,
    n: usize,
    (norms, stride): (&[f32], usize),
    out: &mut [f32],
    row: usize,
    add: bool,
) {
    let Some(first) = tables.first() else {
        return;
    };
    let block_bytes = first.entries().len();
    assert!(codes.len().is_multiple_of(block_bytes) && lead < BLOCK);
    let mut sums = [[0u32; BLOCK]; 4];
    for (b, block) in codes.chunks_exact(block_bytes).enumerate() {
        let Some((lo, hi, k0)) = block_slots(b, lead, n) else {
            break;
        };
        #[cfg(target_arch = "x86_64")]
        let block_norms = whole_block_norms::<AVX2>(norms, stride, (lo, hi, k0));
        for (tile, group) in tables.chunks(4).enumerate() {
            sums_tile(isa, group, block, &mut sums[..group.len()]);
            for (g, table) in group.iter().enumerate() {
                let h = 4 * tile + g;
                let out = &mut out[h * row + k0..h * row + k0 + hi - lo];
                let sums = &sums[g][lo..hi];
                #[cfg(target_arch = "x86_64")]
                if let (Some(norms), Ok(out), Ok(sums)) = (
                    block_norms,
                    <&mut [f32; BLOCK]>::try_from(&mut *out),
                    <&[u32; BLOCK]>::try_from(sums),
                ) {
                    // SAFETY: `AVX2` is set only in `score_run_avx2`, which runs where AVX2
                    // was detected.
                    unsafe { super::x86::dequantize_block_avx2(table, sums, norms, out, add) };
                    continue;
                }
                let put = |o: &mut f32, v: f32| *o = if add { *o + v } else { v };
                // One scale per token (the usual case) reads the norms as a slice, which
                // compiles to vector instructions; the strided loop stays scalar.
                if stride == 1 {
                    let norms = &norms[k0..k0 + hi - lo];
                    for ((o, &norm), &sum) in out.iter_mut().zip(norms).zip(sums) {
                        put(o, norm * table.dequantize(sum));
                    }
                } else {
                    for (i, (o, &sum)) in out.iter_mut().zip(sums).enumerate() {
                        put(o, norms[(k0 + i) * stride] * table.dequantize(sum));
                    }
                }
            }
        }
    }
}

/// Where one coded part of a record lies in a fast-scan block: the whole record, or one
/// equal-bit group of a basis record (its words, so its nibble lanes, follow the previous
/// group's).
#[derive(Clone, Copy, Debug)]
pub(crate) struct RunPart {
    /// Nibble lanes of a block (8 per record word).
    pub block_lanes: usize,
    /// The part's first lane.
    pub first_lane: usize,
    /// The part's lanes (8 per word of the part).
    pub lanes: usize,
    /// The part's coordinates (`≤ lanes · m`).
    pub dim: usize,
    /// Bits per code: 1, 2 and 4 in nibbles, others as bit planes
    /// ([`record_order::planes_from`](crate::record_order::planes_from)).
    pub bits: u8,
}

/// Reusable buffers of [`accumulate_run`].
#[derive(Default)]
pub(crate) struct RunScratch {
    /// Each head's weight bytes of one block.
    bytes: Vec<[u8; BLOCK]>,
    /// Each head's weight scale of one block.
    scales: Vec<f32>,
    /// `[group, rows]`: the run's scaled sums per head and coordinate.
    lanes: Vec<f32>,
}

/// Dispatch of [`accumulate_run_body`]: compiled for AVX2 where the CPU has it, so each
/// block's weights, their bytes and the sums' scaling run eight lanes at a time (plain
/// float operations, so the same bits).
#[allow(clippy::too_many_arguments)]
pub(crate) fn accumulate_run(
    isa: Isa,
    codes: &[u8],
    lead: usize,
    n: usize,
    part: RunPart,
    tables: &ValueTables,
    weights: (&[f32], usize, usize),
    norms: (&[f32], usize),
    scratch: &mut RunScratch,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if super::avx2_kernels(isa) {
        // SAFETY: AVX2 was detected at run time (`avx2_kernels`).
        unsafe {
            accumulate_run_avx2(
                isa, codes, lead, n, part, tables, weights, norms, scratch, out,
            )
        };
        return;
    }
    accumulate_run_body::<false>(
        isa, codes, lead, n, part, tables, weights, norms, scratch, out,
    );
}

/// [`accumulate_run_body`] compiled for AVX2.
///
/// # Safety
/// AVX2 must be available.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2")]
unsafe fn accumulate_run_avx2(
    isa: Isa,
    codes: &[u8],
    lead: usize,
    n: usize,
    part: RunPart,
    tables: &ValueTables,
    weights: (&[f32], usize, usize),
    norms: (&[f32], usize),
    scratch: &mut RunScratch,
    out: &mut [f32],
) {
    accumulate_run_body::<true>(
        isa, codes, lead, n, part, tables, weights, norms, scratch, out,
    );
}

/// `out[h·dim + j] += Σ_k w_hk · c[code(k, j)]`, `w_hk = p[h·row + k] · norm_k`, over the `n`
/// tokens of the run whose blocks are `codes` (from slot `lead`): each head's weighted values
/// in the rotated domain, summed in integers as [`attend_with`](super::attend_with)'s
/// [`ValueSums::Int8`](super::ValueSums::Int8) sums them (the module `values_int`): per block
/// and head 7-bit weights `round(w / s)`, `s` the block's largest weight over 127, times the
/// centroids as bytes `e = round(c / γ)` (`tables`), exact integer sums scaled by `s` into
/// one running sum per coordinate, times `γ` once per run. Slots outside the run weigh
/// zero. Each coordinate is within `Σ_b (s_b/2)·Σ_t |e_t γ| + Σ_t w_t γ/2` of the exact sum
/// (tested, `tests/fast_scan_cache.rs`).
///
/// The part read is `part`: its lanes within each block's, and its dimension (`out` holds
/// `group · dim` values).
///
/// # Panics
/// If `codes` is not whole blocks of `part.block_lanes`, the part's lanes do not lie within
/// them or do not hold its `dim` coordinates (`m` codes per nibble), or a slice is too short.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn accumulate_run_body<const AVX2: bool>(
    isa: Isa,
    codes: &[u8],
    lead: usize,
    n: usize,
    part: RunPart,
    tables: &ValueTables,
    (probabilities, row, group): (&[f32], usize, usize),
    (norms, stride): (&[f32], usize),
    scratch: &mut RunScratch,
    out: &mut [f32],
) {
    let RunPart {
        block_lanes,
        first_lane,
        lanes: part_lanes,
        dim,
        bits,
    } = part;
    let block_bytes = block_lanes * LANE_BYTES;
    let RunScratch {
        bytes,
        scales,
        lanes,
    } = scratch;
    let planes = super::table::is_wide(bits)
        .then(|| super::table::WidePart::new(bits, dim, first_lane))
        .flatten();
    if let Some(planes) = &planes {
        assert!(planes.end_lane() <= first_lane + part_lanes);
    }
    // Coordinates `rows ≥ dim` of the part's lanes (padding past `dim` decodes as code 0 and
    // is dropped below); the kernels take coordinates in pairs.
    let rows = if planes.is_some() {
        dim.next_multiple_of(2)
    } else {
        part_lanes * tables.per
    };
    assert!(first_lane + part_lanes <= block_lanes && dim <= rows && rows.is_multiple_of(2));
    assert!(codes.len().is_multiple_of(block_bytes) && lead < BLOCK);
    bytes.resize(group, [0; BLOCK]);
    scales.resize(group, 0.0);
    lanes.clear();
    lanes.resize(group * rows, 0.0);
    let mut w = [0.0f32; BLOCK];
    for (b, block) in codes.chunks_exact(block_bytes).enumerate() {
        let Some((lo, hi, k0)) = block_slots(b, lead, n) else {
            break;
        };
        if hi - lo < BLOCK {
            w.fill(0.0);
        }
        #[cfg(target_arch = "x86_64")]
        let block_norms = whole_block_norms::<AVX2>(norms, stride, (lo, hi, k0));
        for h in 0..group {
            let p = &probabilities[h * row + k0..h * row + k0 + hi - lo];
            #[cfg(target_arch = "x86_64")]
            if let (Some(norms), Ok(p)) = (block_norms, <&[f32; BLOCK]>::try_from(p)) {
                // SAFETY: `AVX2` is set only in `accumulate_run_avx2`, which runs where AVX2
                // was detected.
                scales[h] = unsafe { super::x86::block_weight_bytes_avx2(p, norms, &mut bytes[h]) };
                continue;
            }
            // As in `score_run_body`: a slice of norms where there is one per token.
            if stride == 1 {
                let norms = &norms[k0..k0 + hi - lo];
                for ((w, &p), &norm) in w[lo..hi].iter_mut().zip(p).zip(norms) {
                    *w = p * norm;
                }
            } else {
                for ((w, &p), k) in w[lo..hi].iter_mut().zip(p).zip(k0..) {
                    *w = p * norms[k * stride];
                }
            }
            scales[h] = super::values_int::weight_bytes(&w, &mut bytes[h]);
        }
        if let Some(planes) = &planes {
            super::wide::accumulate(isa, planes, block, rows, tables, bytes, scales, lanes);
            continue;
        }
        let part_codes = &block[first_lane * LANE_BYTES..(first_lane + part_lanes) * LANE_BYTES];
        super::attend::accumulate_int(isa, part_codes, rows, tables, bytes, scales, lanes);
    }
    for (out, sums) in out.chunks_exact_mut(dim).zip(lanes.chunks_exact(rows)) {
        for (o, &sum) in out.iter_mut().zip(sums) {
            *o += super::values_int::reduce(sum, tables.gamma);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_slots_cover_the_run_once() {
        for lead in [0, 1, 17, 31] {
            for n in [1, 2, 15, 31, 32, 33, 64, 100] {
                let mut seen = Vec::new();
                for b in 0.. {
                    let Some((lo, hi, k0)) = block_slots(b, lead, n) else {
                        break;
                    };
                    assert!(lo < hi && hi <= BLOCK);
                    for (i, slot) in (lo..hi).enumerate() {
                        assert_eq!(b * BLOCK + slot - lead, k0 + i);
                        seen.push(k0 + i);
                    }
                }
                assert_eq!(seen, (0..n).collect::<Vec<_>>(), "lead {lead}, n {n}");
            }
        }
    }
}
