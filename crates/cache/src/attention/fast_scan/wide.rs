//! Codes stored as bit planes: TQ_mse codes of 3 and 5 to 8 bits in the cache's fast-scan
//! order ([`record_order::BitPlanes`](crate::record_order::BitPlanes)).
//!
//! A `b`-bit code is kept as planes of 4, 2 and 1 of its bits, each plane whole in nibbles
//! as 4-, 2- and 1-bit codes are, so the block stays 32 tokens per 16 bytes of a lane and a
//! 6-bit code costs ¾ of a byte per token. No nibble lane holds such a code whole, so the
//! nibble kernels skip them (their lanes' table entries are zero) and this pass adds them:
//! per coordinate, the 32 tokens' codes are put back together from their planes (a shift, a
//! mask and an or per plane) into one byte each — [`gather_codes`] — and looked up in the
//! coordinate's table of `2^b` entries: for keys the query's 16-bit entries (in steps of
//! `δ/2^k`, the nibble lanes' bytes counting `2^k` of them, so a score is still one integer
//! sum), for values the centroid bytes, multiplied by the weight bytes. Integer sums, so the
//! same bits on every instruction set; the x86 forms (`wide_x86`: AVX-512 VBMI's byte
//! permutes, AVX2's byte shuffles) are tested against these loops.

use super::BLOCK;
use super::table::{ScoreTable, WidePart};
use super::values_int::ValueTables;
use crate::attention::simd::Isa;

/// `codes[t]` = the code of coordinate `j` of `part` at slot `t` of the block `block`.
#[inline(always)]
pub(super) fn gather_codes(part: &WidePart, block: &[u8], j: usize, codes: &mut [u8; BLOCK]) {
    for (t, c) in codes.iter_mut().enumerate() {
        *c = part.code(block, j, t) as u8;
    }
}

/// Adds each head's wide coordinates to its 32 sums of one block: `out[h][t] +=
/// Σ_j v_hj[code(t, j)]` (16-bit entries), `tables[h]` head `h`'s table (all of one record
/// layout).
pub(super) fn add_sums(isa: Isa, tables: &[ScoreTable], block: &[u8], out: &mut [[u32; BLOCK]]) {
    let Some(first) = tables.first() else {
        return;
    };
    if first.wide().is_empty() {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if super::wide_x86::vbmi(isa) {
        // SAFETY: AVX-512 F, BW, VL and VBMI were detected at run time (`vbmi`); every table
        // has the same wide parts (one record layout).
        unsafe { super::wide_x86::add_sums_vbmi(tables, block, out) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if super::avx2_kernels(isa) {
        // SAFETY: AVX2 was detected at run time (`avx2_kernels`); the tables as above.
        unsafe { super::wide_x86::add_sums_avx2(tables, block, out) };
        return;
    }
    let _ = isa;
    add_sums_scalar(tables, block, out);
}

/// The reference loop of [`add_sums`].
pub(super) fn add_sums_scalar(tables: &[ScoreTable], block: &[u8], out: &mut [[u32; BLOCK]]) {
    let mut codes = [0u8; BLOCK];
    for (p, part) in tables[0].wide().iter().enumerate() {
        for j in 0..part.dim {
            gather_codes(part, block, j, &mut codes);
            for (table, sums) in tables.iter().zip(out.iter_mut()) {
                let own = &table.wide()[p];
                let entries = &table.wide_entries()[own.entries(j)..];
                let len = own.table_len();
                for (s, &c) in sums.iter_mut().zip(&codes) {
                    let c = usize::from(c);
                    *s += u32::from(u16::from_le_bytes([entries[c], entries[len + c]]));
                }
            }
        }
    }
}

/// [`accumulate_block`] on the instruction set asked for (AVX2 where the CPU has it).
#[allow(clippy::too_many_arguments)]
pub(super) fn accumulate(
    isa: Isa,
    part: &WidePart,
    block: &[u8],
    rows: usize,
    tables: &ValueTables,
    weights: &[[u8; BLOCK]],
    scales: &[f32],
    lanes: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if super::avx2_kernels(isa) {
        // SAFETY: AVX2 was detected at run time (`avx2_kernels`); `lanes` holds
        // `heads · rows` values (asserted there).
        unsafe {
            super::wide_x86::accumulate_block_avx2(
                part, block, rows, tables, weights, scales, lanes,
            )
        };
        return;
    }
    let _ = isa;
    accumulate_block(part, block, rows, tables, weights, scales, lanes);
}

/// The values of one block for a part stored as bit planes: for coordinate `j` and head `h`,
/// `lanes[h·rows + j] += s_h · Σ_t u_ht · e[code(t, j)]` — what
/// [`accumulate_block`](super::values_int::accumulate_block) adds for a nibble lane, with the
/// code put back together from its planes.
pub(super) fn accumulate_block(
    part: &WidePart,
    block: &[u8],
    rows: usize,
    tables: &ValueTables,
    weights: &[[u8; BLOCK]],
    scales: &[f32],
    lanes: &mut [f32],
) {
    let mut codes = [0u8; BLOCK];
    let mut centroids = [0i32; BLOCK];
    for j in 0..part.dim {
        gather_codes(part, block, j, &mut codes);
        for (e, &c) in centroids.iter_mut().zip(&codes) {
            *e = i32::from(tables.bytes[usize::from(c)]);
        }
        for (h, (u, &scale)) in weights.iter().zip(scales).enumerate() {
            let sum: i32 = u
                .iter()
                .zip(&centroids)
                .map(|(&u, &e)| i32::from(u) * e)
                .sum();
            lanes[h * rows + j] += scale * sum as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::fast_scan::TablePart;
    use crate::codec::packing::words_for;

    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        fn unit(&mut self) -> f32 {
            (self.next() % 2001) as f32 / 1000.0 - 1.0
        }
    }

    /// Parts of every width (1 to 8 bits), odd dimensions among them, one after another.
    const PARTS: [(u8, usize); 9] = [
        (6, 16),
        (4, 12),
        (3, 10),
        (5, 6),
        (7, 5),
        (8, 4),
        (2, 6),
        (1, 8),
        (6, 3),
    ];

    /// One table per entry of `boosts` over a record of `PARTS` (random codebooks, then per
    /// head random queries, the wide parts' scaled by the head's boost), and the record's lanes.
    fn tables(rng: &mut Rng, boosts: &[f32]) -> (Vec<ScoreTable>, usize) {
        let lanes: usize = PARTS.iter().map(|&(b, d)| 8 * words_for(d, b)).sum();
        let codebooks: Vec<Vec<f32>> = PARTS
            .iter()
            .map(|&(b, _)| (0..1 << b).map(|_| rng.unit()).collect())
            .collect();
        let tables = boosts
            .iter()
            .map(|&boost| {
                let queries: Vec<Vec<f32>> = PARTS
                    .iter()
                    .map(|&(b, d)| {
                        let scale = if super::super::table::is_wide(b) {
                            boost
                        } else {
                            1.0
                        };
                        (0..d).map(|_| scale * rng.unit()).collect()
                    })
                    .collect();
                let parts: Vec<TablePart<'_>> = PARTS
                    .iter()
                    .zip(&queries)
                    .zip(&codebooks)
                    .map(|((&(bits, d), query), centroids)| TablePart {
                        query,
                        centroids,
                        bits,
                        lanes: 8 * words_for(d, bits),
                    })
                    .collect();
                let mut table = ScoreTable::default();
                table.rebuild_parts(&parts, lanes).unwrap();
                table
            })
            .collect();
        (tables, lanes)
    }

    /// Tables of three heads over a record of `PARTS`, and one block of random bytes.
    fn tables_and_block(seed: u64) -> (Vec<ScoreTable>, Vec<u8>, usize) {
        let mut rng = Rng(seed);
        let (tables, lanes) = tables(&mut rng, &[1.0; 3]);
        let block = (0..lanes * 16).map(|_| rng.next() as u8).collect();
        (tables, block, lanes)
    }

    /// Every instruction set adds the same integers as the loop, for one to three heads,
    /// and the loop adds, per wide coordinate, the entry of the code its planes spell.
    #[test]
    fn wide_sums_are_the_same_integers_on_every_instruction_set() {
        for seed in 1..=20 {
            let (tables, block, _) = tables_and_block(seed);
            let wide = tables[0].wide();
            assert_eq!(
                wide.iter().map(|p| (p.bits, p.dim)).collect::<Vec<_>>(),
                [(6, 16), (3, 10), (5, 6), (7, 5), (8, 4), (6, 3)]
            );
            for heads in 1..=3 {
                let mut expected = vec![[0u32; BLOCK]; heads];
                add_sums_scalar(&tables[..heads], &block, &mut expected);
                for isa in Isa::available() {
                    let mut got = vec![[7u32; BLOCK]; heads];
                    add_sums(isa, &tables[..heads], &block, &mut got);
                    for (g, e) in got.iter().zip(&expected) {
                        let e: Vec<u32> = e.iter().map(|x| x + 7).collect();
                        assert_eq!(g.as_slice(), e.as_slice(), "{isa:?}, seed {seed}");
                    }
                }
            }
            // One coordinate by hand: the 7-bit part's second coordinate at token 20.
            let part = &wide[3];
            let first_lane: usize = PARTS[..4].iter().map(|&(b, d)| 8 * words_for(d, b)).sum();
            let nibble = |lane: usize| (block[lane * 16 + 4] >> 4) & 0x0F;
            // Planes of 4, 2 and 1 bits over 5 coordinates: 5, 3 and 2 lanes.
            let code = usize::from(nibble(first_lane + 1))
                | usize::from((nibble(first_lane + 5) >> 2) & 3) << 4
                | usize::from((nibble(first_lane + 8) >> 1) & 1) << 6;
            assert_eq!(part.code(&block, 1, 20), code);
        }
    }

    /// A whole block's sums (nibble lanes and bit planes, `sums_tile`) against the sums read
    /// here token by token: each nibble lane's byte entry, `lane_unit` times, plus each wide
    /// coordinate's 16-bit entry of the code its planes spell. Three heads in one tile, their
    /// wide coordinates' queries scaled so that their units differ (256, then coarser).
    #[test]
    fn a_blocks_sums_count_lanes_and_planes_in_the_finer_unit() {
        let mut rng = Rng(5);
        let (tables, lanes) = tables(&mut rng, &[1.0, 20.0, 300.0]);
        let units: Vec<u32> = tables.iter().map(ScoreTable::lane_unit).collect();
        assert!(
            units[0] == 256 && units[1] < 256 && units[2] < units[1],
            "{units:?}"
        );
        for seed in 0..10 {
            let block: Vec<u8> = (0..lanes * 16)
                .map(|_| (rng.next() >> seed) as u8)
                .collect();
            for isa in Isa::available() {
                let mut got = [[0u32; BLOCK]; 3];
                super::super::sums_tile(isa, &tables, &block, &mut got);
                for (table, got) in tables.iter().zip(&got) {
                    for (t, &got) in got.iter().enumerate() {
                        let (byte, shift) = (t % 16, 4 * (t / 16));
                        let mut expected: u32 = (0..lanes)
                            .map(|l| {
                                let n = (block[l * 16 + byte] >> shift) & 0x0F;
                                table.lane_unit() * u32::from(table.entry(l, n).unwrap())
                            })
                            .sum();
                        let e = table.wide_entries();
                        for part in table.wide() {
                            for j in 0..part.dim {
                                let (k, at) = (part.code(&block, j, t), part.entries(j));
                                let high = e[at + part.table_len() + k];
                                expected += u32::from(u16::from_le_bytes([e[at + k], high]));
                            }
                        }
                        assert_eq!(got, expected, "{isa:?}, seed {seed}, token {t}");
                    }
                }
            }
        }
    }

    /// The values' bit-plane sums: the same bits on every instruction set as the loop.
    #[test]
    fn wide_value_sums_are_the_same_on_every_instruction_set() {
        let mut rng = Rng(99);
        for &(bits, dim) in &PARTS {
            if !super::super::table::is_wide(bits) {
                continue;
            }
            let part = WidePart::new(bits, dim, 3, 0).unwrap();
            let lanes = 3 + 8 * words_for(dim, bits);
            let block: Vec<u8> = (0..lanes * 16).map(|_| rng.next() as u8).collect();
            let centroids: Vec<f32> = (0..1 << bits).map(|_| rng.unit()).collect();
            let tables = ValueTables::new(&centroids, bits);
            let weights: Vec<[u8; BLOCK]> = (0..3)
                .map(|_| std::array::from_fn(|_| (rng.next() % 128) as u8))
                .collect();
            let scales = [0.5f32, 1e-3, 3.0];
            let rows = dim.next_multiple_of(2);
            let mut expected = vec![0.25f32; 3 * rows];
            accumulate_block(
                &part,
                &block,
                rows,
                &tables,
                &weights,
                &scales,
                &mut expected,
            );
            for isa in Isa::available() {
                let mut got = vec![0.25f32; 3 * rows];
                accumulate(
                    isa, &part, &block, rows, &tables, &weights, &scales, &mut got,
                );
                let bits_of = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits_of(&got), bits_of(&expected), "{isa:?}, {bits} bits");
            }
            // Coordinate 0 of head 0 by hand.
            let sum: i32 = (0..BLOCK)
                .map(|t| {
                    let k = part.code(&block, 0, t);
                    i32::from(weights[0][t]) * i32::from(tables.bytes[k])
                })
                .sum();
            assert_eq!(expected[0], 0.25 + 0.5 * sum as f32);
        }
    }
}
