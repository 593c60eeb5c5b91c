//! Codes stored as bit planes: TQ_mse codes of 3 and 5 to 8 bits in the cache's fast-scan
//! order ([`record_order::BitPlanes`](crate::record_order::BitPlanes)).
//!
//! A `b`-bit code is kept as planes of 4, 2 and 1 of its bits, each plane whole in nibbles
//! as 4-, 2- and 1-bit codes are, so the block stays 32 tokens per 16 bytes of a lane and a
//! 6-bit code costs ¾ of a byte per token. No nibble lane holds such a code whole, so the
//! nibble kernels skip them (their lanes' table entries are zero) and this pass adds them:
//! per coordinate, the 32 tokens' codes are put back together from their planes (a shift, a
//! mask and an or per plane) into one byte each — [`gather_codes`] — and looked up: for keys
//! in the part's 16-bit centroids `E_k`, multiplied by each query head's integer `Q_j`
//! ([`ScoreTable`]: the products count the units of which a nibble lane's byte counts
//! `lane_unit`, so a score is still one integer sum), for values in the centroid bytes,
//! multiplied by the weight bytes. Integer sums, so the same bits on every instruction set;
//! the x86 forms (`wide_x86`: AVX2's byte shuffles and 16-bit multiply-adds; `wide_avx512`:
//! VBMI's byte permutes, 64 codes per lookup, and 512-bit multiply-adds) are tested against
//! these loops.

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
/// Σ_j Q_hj · E[code(t, j)]` (wrapping: the sums are two's complement), `tables[h]` head
/// `h`'s table (all of one record layout, so the same centroids `E`).
pub(super) fn add_sums(isa: Isa, tables: &[ScoreTable], block: &[u8], out: &mut [[u32; BLOCK]]) {
    let Some(first) = tables.first() else {
        return;
    };
    if first.wide().is_empty() {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 && isa.is_available() {
        // SAFETY: AVX-512 F, BW, VL, VBMI and AVX2 were detected at run time
        // (`is_available`); every table has the same wide parts (one record layout).
        unsafe { super::wide_avx512::add_sums_avx512(tables, block, out) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if super::avx2_kernels(isa) {
        // SAFETY: AVX2 was detected at run time (`avx2_kernels`); every table has the same
        // wide parts (one record layout).
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
                let q = i32::from(table.wide_query()[own.query_at + j]);
                for (s, &c) in sums.iter_mut().zip(&codes) {
                    let e = i32::from(table.wide_centroid(own, usize::from(c)));
                    *s = s.wrapping_add((q * e) as u32);
                }
            }
        }
    }
}

/// [`accumulate_block`] on the instruction set asked for (AVX-512 or AVX2 where the CPU has
/// it).
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
    if isa == Isa::Avx512 && isa.is_available() {
        // SAFETY: AVX-512 F, BW, VL, VBMI and AVX2 were detected at run time
        // (`is_available`), VNNI where `vnni()` says so; `lanes` holds `heads · rows` values
        // (asserted there).
        unsafe {
            super::wide_avx512::accumulate_block_avx512(
                super::values_avx512::vnni(),
                part,
                block,
                rows,
                tables,
                weights,
                scales,
                lanes,
            )
        };
        return;
    }
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

    /// A random codebook per part of `PARTS`.
    fn codebooks(rng: &mut Rng) -> Vec<Vec<f32>> {
        PARTS
            .iter()
            .map(|&(b, _)| (0..1 << b).map(|_| rng.unit()).collect())
            .collect()
    }

    /// A random query slice per part of `PARTS`, the wide parts' scaled by `boost`.
    fn queries(rng: &mut Rng, boost: f32) -> Vec<Vec<f32>> {
        PARTS
            .iter()
            .map(|&(b, d)| {
                let scale = if super::super::table::is_wide(b) {
                    boost
                } else {
                    1.0
                };
                (0..d).map(|_| scale * rng.unit()).collect()
            })
            .collect()
    }

    /// The table parts of a record of `PARTS` with these queries and codebooks.
    fn table_parts<'a>(queries: &'a [Vec<f32>], codebooks: &'a [Vec<f32>]) -> Vec<TablePart<'a>> {
        PARTS
            .iter()
            .zip(queries)
            .zip(codebooks)
            .map(|((&(bits, d), query), centroids)| TablePart {
                query,
                centroids,
                bits,
                lanes: 8 * words_for(d, bits),
            })
            .collect()
    }

    /// One table per entry of `boosts` over a record of `PARTS` (random codebooks, then per
    /// head random queries, the wide parts' scaled by the head's boost), and the record's lanes.
    fn tables(rng: &mut Rng, boosts: &[f32]) -> (Vec<ScoreTable>, usize) {
        let lanes: usize = PARTS.iter().map(|&(b, d)| 8 * words_for(d, b)).sum();
        let codebooks = codebooks(rng);
        let tables = boosts
            .iter()
            .map(|&boost| {
                let queries = queries(rng, boost);
                let mut table = ScoreTable::default();
                table
                    .rebuild_parts(&table_parts(&queries, &codebooks), lanes)
                    .unwrap();
                table
            })
            .collect();
        (tables, lanes)
    }

    /// Tables of four heads (a whole tile) over a record of `PARTS`, and one block of random
    /// bytes.
    fn tables_and_block(seed: u64) -> (Vec<ScoreTable>, Vec<u8>, usize) {
        let mut rng = Rng(seed);
        let (tables, lanes) = tables(&mut rng, &[1.0; 4]);
        let block = (0..lanes * 16).map(|_| rng.next() as u8).collect();
        (tables, block, lanes)
    }

    /// Every instruction set adds the same integers as the loop, for one to four heads,
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
            for heads in 1..=4 {
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
    /// coordinate's product `Q_j · E_k` computed here from its query and codebook, wrapping
    /// as two's complement. Three heads in one tile, their wide coordinates' queries scaled so
    /// that their units differ (the larger the wide queries, the coarser the unit).
    #[test]
    fn a_blocks_sums_count_lanes_and_planes_in_the_finer_unit() {
        let mut rng = Rng(5);
        let (tables, lanes) = tables(&mut rng, &[1.0, 20.0, 300.0]);
        let units: Vec<u32> = tables.iter().map(ScoreTable::lane_unit).collect();
        assert!(
            units[0] >= 1 << 12 && units[1] < units[0] && units[2] < units[1],
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
                        let mut expected: i64 = (0..lanes)
                            .map(|l| {
                                let n = (block[l * 16 + byte] >> shift) & 0x0F;
                                i64::from(table.lane_unit() * u32::from(table.entry(l, n).unwrap()))
                            })
                            .sum();
                        for part in table.wide() {
                            for j in 0..part.dim {
                                let k = part.code(&block, j, t);
                                let q = table.wide_query()[part.query_at + j];
                                expected += i64::from(q) * i64::from(table.wide_centroid(part, k));
                            }
                        }
                        let expected = i32::try_from(expected).expect("a sum within 31 bits");
                        assert_eq!(got as i32, expected, "{isa:?}, seed {seed}, token {t}");
                    }
                }
            }
        }
    }

    /// The wide parts' integers are what the table's documentation says, from its public
    /// step and unit: `E_k = round(2048·c_k / max|c|)`, `Q_j = round(q'_j · (max|c| / 2048 /
    /// sum_step))`; every sum fits 31 bits; and the error bound holds for every code.
    #[test]
    fn wide_integers_follow_the_documented_grids() {
        let mut rng = Rng(11);
        for boost in [1.0f32, 20.0, 300.0, 1e-3] {
            let mut rng2 = Rng(rng.next());
            let codebooks = codebooks(&mut rng2);
            let queries = queries(&mut rng2, boost);
            let parts = table_parts(&queries, &codebooks);
            let lanes: usize = parts.iter().map(|p| p.lanes).sum();
            let mut table = ScoreTable::default();
            table
                .rebuild_parts(&parts, lanes.next_multiple_of(4))
                .unwrap();
            let wide: Vec<_> = parts
                .iter()
                .filter(|p| super::super::table::is_wide(p.bits))
                .collect();
            assert_eq!(wide.len(), table.wide().len());
            let (mut largest, mut wide_bound) = (0i64, 0.0f64);
            for (part, own) in wide.iter().zip(table.wide()) {
                let c_abs = part.centroids.iter().fold(0.0f32, |m, c| m.max(c.abs()));
                for (k, &c) in part.centroids.iter().enumerate() {
                    let e = (c * 2048.0 / c_abs).round() as i16;
                    assert_eq!(table.wide_centroid(own, k), e);
                }
                let scale = c_abs / 2048.0 / table.sum_step();
                for (j, &q) in part.query.iter().enumerate() {
                    let q_int = table.wide_query()[own.query_at + j];
                    assert_eq!(q_int, (q * scale).round() as i16);
                    largest += 2048 * i64::from(q_int.unsigned_abs());
                    // The error per coordinate, worst code, against the documented bound.
                    let bound = (2048.0 + f64::from(q_int.unsigned_abs())) / 2.0;
                    for (k, &c) in part.centroids.iter().enumerate() {
                        let exact = f64::from(q) * f64::from(c) / f64::from(table.sum_step());
                        let got = f64::from(q_int) * f64::from(table.wide_centroid(own, k));
                        assert!(
                            (exact - got).abs() <= bound * (1.0 + 1e-4) + 1e-3,
                            "{boost}"
                        );
                    }
                    wide_bound += bound;
                }
                for j in part.query.len()..own.query_len() {
                    assert_eq!(table.wide_query()[own.query_at + j], 0);
                }
            }
            // Lanes that hold nibble codes: ⌈d / m⌉, m = 4 / b codes per nibble (one at 4 bits).
            let used: usize = parts
                .iter()
                .filter(|p| !super::super::table::is_wide(p.bits))
                .map(|p| p.query.len().div_ceil(usize::from(4 / p.bits)))
                .sum();
            let unit = f64::from(table.lane_unit());
            let nibbles = 255.0 * used as f64 * unit;
            assert!(nibbles + largest as f64 <= f64::from(i32::MAX), "{boost}");
            // The unit is the largest power of two that fits (up to the margin of one unit
            // per `Q_j` it keeps for rounding): at twice it, a `Q_j` would leave 16 bits or
            // a sum 31 bits.
            let (mut widest, mut total, mut count) = (0.0f64, 0.0f64, 0.0f64);
            for part in &wide {
                let c_abs = part.centroids.iter().fold(0.0f32, |m, c| m.max(c.abs()));
                for &q in part.query {
                    let x =
                        f64::from(q.abs()) * f64::from(c_abs) / 2048.0 / f64::from(table.step())
                            * 2.0
                            * unit;
                    widest = widest.max(x);
                    total += x;
                    count += 1.0;
                }
            }
            assert!(
                unit == f64::from(1u32 << 24)
                    || widest >= 32766.0 - 1.0
                    || 2.0 * nibbles + 2048.0 * total > f64::from(i32::MAX) - 2048.0 * count - 1e4,
                "{boost}: unit {unit} could double"
            );
            let nibble_bound =
                table.error_bound() as f64 - wide_bound * f64::from(table.sum_step());
            assert!(
                (nibble_bound - used as f64 * f64::from(table.step()) / 2.0).abs()
                    <= 1e-4 * f64::from(table.error_bound()),
                "{boost}"
            );
        }
    }

    /// Value sums of `part` over `block` for one head per scale, every lane starting at
    /// `start`: random centroids and weight bytes drawn from `rng` (in that order), the loop's
    /// sums, asserted bit for bit on every instruction set; returns them with the weights and
    /// the tables.
    fn value_sums_on_every_isa(
        rng: &mut Rng,
        part: &WidePart,
        block: &[u8],
        scales: &[f32],
        start: f32,
    ) -> (Vec<f32>, Vec<[u8; BLOCK]>, ValueTables) {
        let bits = part.bits;
        let centroids: Vec<f32> = (0..1 << bits).map(|_| rng.unit()).collect();
        let tables = ValueTables::new(&centroids, bits);
        let weights: Vec<[u8; BLOCK]> = (0..scales.len())
            .map(|_| std::array::from_fn(|_| (rng.next() % 128) as u8))
            .collect();
        let rows = part.dim.next_multiple_of(2);
        let mut expected = vec![start; scales.len() * rows];
        accumulate_block(part, block, rows, &tables, &weights, scales, &mut expected);
        let bits_of = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for isa in Isa::available() {
            let mut got = vec![start; scales.len() * rows];
            accumulate(isa, part, block, rows, &tables, &weights, scales, &mut got);
            assert_eq!(
                bits_of(&got),
                bits_of(&expected),
                "{isa:?}, {bits} bits, d {}",
                part.dim
            );
        }
        // AVX-512 without VNNI too, which `accumulate` takes only on CPUs that lack it.
        #[cfg(target_arch = "x86_64")]
        if Isa::Avx512.is_available() {
            let mut got = vec![start; scales.len() * rows];
            // SAFETY: AVX-512 F, BW, VL, VBMI and AVX2 were detected; `vnni` is false.
            unsafe {
                super::super::wide_avx512::accumulate_block_avx512(
                    false, part, block, rows, &tables, &weights, scales, &mut got,
                )
            };
            assert_eq!(bits_of(&got), bits_of(&expected), "AVX-512 without VNNI");
        }
        (expected, weights, tables)
    }

    /// The values' bit-plane sums: the same bits on every instruction set as the loop.
    #[test]
    fn wide_value_sums_are_the_same_on_every_instruction_set() {
        let mut rng = Rng(99);
        for &(bits, dim) in &PARTS {
            if !super::super::table::is_wide(bits) {
                continue;
            }
            let part = WidePart::new(bits, dim, 3).unwrap();
            let lanes = 3 + 8 * words_for(dim, bits);
            let block: Vec<u8> = (0..lanes * 16).map(|_| rng.next() as u8).collect();
            let (expected, weights, tables) =
                value_sums_on_every_isa(&mut rng, &part, &block, &[0.5, 1e-3, 3.0], 0.25);
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

    /// A part whose last group's padding reaches past the block — a 6- or 8-bit part, its
    /// last plane as wide as 2 or 4 bits, over a dimension not a multiple of 4, at the end of
    /// a record — is read lane by lane (the vector kernels check the lanes once per part and
    /// read within them unchecked): the same bits as the scalar loop, which reads only the
    /// part's own coordinates.
    #[test]
    fn a_part_ending_its_block_sums_the_same_on_every_instruction_set() {
        let mut rng = Rng(41);
        for (bits, dim) in [
            (6u8, 5usize),
            (6, 9),
            (8, 7),
            (8, 1),
            (7, 9),
            (3, 10),
            (3, 64),
            (5, 37),
        ] {
            let part = WidePart::new(bits, dim, 2).unwrap();
            let end = part
                .spans
                .iter()
                .map(|s| s.first_lane + s.lanes)
                .max()
                .unwrap();
            let block: Vec<u8> = (0..end * 16).map(|_| rng.next() as u8).collect();
            value_sums_on_every_isa(&mut rng, &part, &block, &[0.75, 2.0], 0.5);
        }
    }
}
