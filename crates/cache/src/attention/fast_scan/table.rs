//! [`ScoreTable`]: a query's products with every centroid, quantized to bytes.

use super::FastScanError;
use super::layout::{LANE_BYTES, codes_per_lane, lanes_for};
use crate::record_order::{PlaneSpans, planes_from};

/// Per nibble lane `l` of the layout ([`FastScanBlocks`](super::FastScanBlocks): `m` codes per
/// nibble, `m = 4 / b` for b = 1, 2, else one), the 16 bytes
/// `u_l[n] = round(Σ_i (q'_i c[n_i] − o_i) / δ)` over the lane's coordinates `i`, `n_i` the
/// code in bits `b·i ..` of nibble `n` (for m = 1, entries past the `2^b` centroids are zero),
/// with `o_i = min_k q'_i c_k` and one step `δ = max_l (Σ_i |q'_i|·(c_max − c_min)) / 255` for
/// all lanes. A score is then `δ · Σ_l u_l[nibble_l] + Σ_i o_i` up to `L · δ / 2`, `L` the
/// lanes that hold coordinates ([`error_bound`](Self::error_bound)).
///
/// Coordinates stored as bit planes (codes of 3 or 5 to 8 bits, in the cache's order) get
/// 16-bit entries `v_j[k] = round((q'_j c_k − o_j) / (δ/2^k))` instead (k = 8 unless their
/// span needs coarser steps to fit 16 bits), and `δ` is set by the nibble lanes alone: these
/// codes are fine enough, and their coordinates the widest (a fitted basis gives its most
/// bits to the components of most variance), that bytes in the step of the widest would add
/// a tenth or more of the codec's own error to the score. A table with such coordinates counts
/// its sum in units of `δ/2^k` (a nibble lane's byte weighs `2^k` of them,
/// [`lane_unit`](Self::lane_unit)), still one exact integer.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ScoreTable {
    dim: usize,
    bits: u8,
    /// Lanes that hold coordinates (the error bound's `L`), and the coordinates stored as bit
    /// planes (a step of `δ/2^k` each).
    used_lanes: usize,
    used_wide: usize,
    entries: Vec<u8>,
    /// The parts stored as bit planes (3 or 5 to 8 bits), whose codes no nibble lane holds
    /// whole: where their planes lie and where their entries start in `wide_entries`.
    wide: Vec<WidePart>,
    /// Per wide coordinate `j`, its `2^b` 16-bit entries `round((q'_j c_k − o_j) / (δ/2^k))`
    /// as two byte tables, the low bytes then the high bytes, each padded to at least 64 bytes.
    wide_entries: Vec<u8>,
    /// The runs of lanes that hold the nibble parts' codes, widened to whole groups of 4
    /// lanes: what the nibble kernels read (the other lanes' entries are zero).
    nibble_runs: Vec<std::ops::Range<usize>>,
    /// `δ`.
    step: f32,
    /// Units of a sum a nibble lane's byte counts ([`lane_unit`](Self::lane_unit)).
    unit: u32,
    /// What one unit of a sum is worth: `δ / unit`.
    sum_step: f32,
    offset: f32,
}

/// A part of a record stored as bit planes (codes of 3 or 5 to 8 bits): its planes
/// ([`planes_from`]) and, in a [`ScoreTable`], where its coordinates' entries start
/// (two tables of `table_len()` bytes each, the entries' low and high bytes, coordinate
/// after coordinate).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct WidePart {
    pub(crate) bits: u8,
    pub(crate) dim: usize,
    pub(crate) spans: PlaneSpans,
    pub(crate) first_entry: usize,
    /// Per plane `p` and position `i` of a nibble (`m = 4 / width` codes each), what nibble
    /// `n` gives that code: `luts[p][i][n] = ((n >> width·i) mod 2^width) << shift` (the
    /// vector kernels' byte shuffles).
    pub(crate) luts: [[[u8; 16]; 4]; 3],
}

impl WidePart {
    /// The part of `dim` codes of `bits` bits whose planes start at lane `first_lane`, its
    /// entries from `first_entry` on (`None` for a width that is not 1 to 8).
    pub(crate) fn new(bits: u8, dim: usize, first_lane: usize, first_entry: usize) -> Option<Self> {
        let spans = planes_from(bits, dim, first_lane)?;
        let mut luts = [[[0u8; 16]; 4]; 3];
        for (luts, span) in luts.iter_mut().zip(spans.iter()) {
            let mask = (1u8 << span.width) - 1;
            for (i, lut) in luts
                .iter_mut()
                .enumerate()
                .take(usize::from(4 / span.width))
            {
                for (n, e) in lut.iter_mut().enumerate() {
                    *e = ((n as u8 >> (span.width * i as u8)) & mask) << span.shift;
                }
            }
        }
        Some(Self {
            bits,
            dim,
            spans,
            first_entry,
            luts,
        })
    }

    /// Entries per coordinate: `2^b`, at least 64 (the AVX-512 form loads 64 bytes a table).
    pub(crate) fn table_len(&self) -> usize {
        (1usize << self.bits).max(64)
    }

    /// Where coordinate `j`'s entries start: its low bytes, then `table_len()` on its high
    /// bytes.
    pub(crate) fn entries(&self, j: usize) -> usize {
        self.first_entry + 2 * j * self.table_len()
    }

    /// The first entry past the part's.
    pub(crate) fn end_entry(&self) -> usize {
        self.entries(self.dim)
    }

    /// The last lane the part's planes use, plus one.
    pub(crate) fn end_lane(&self) -> usize {
        self.spans.last().map_or(0, |p| p.first_lane + p.lanes)
    }

    /// The code of coordinate `j` at slot `t` (< 32) of a block's `codes`: its planes' bits,
    /// put back together.
    #[inline(always)]
    pub(crate) fn code(&self, codes: &[u8], j: usize, t: usize) -> usize {
        let (byte, nibble) = (t % LANE_BYTES, 4 * (t / LANE_BYTES));
        self.spans.iter().fold(0, |code, p| {
            let m = usize::from(4 / p.width);
            let n = codes[(p.first_lane + j / m) * LANE_BYTES + byte] >> nibble;
            let sub = (n >> (usize::from(p.width) * (j % m))) & ((1 << p.width) - 1);
            code | usize::from(sub) << p.shift
        })
    }
}

/// Whether codes of `bits` bits are stored as several bit planes (not whole in a nibble).
pub(crate) const fn is_wide(bits: u8) -> bool {
    !matches!(bits, 1 | 2 | 4)
}

impl ScoreTable {
    /// The table of `rotated_query` (`Π·q`, length `d`) against `centroids` (the codebook,
    /// `2^bits` values, 1 to 4 bits: the layout of [`FastScanBlocks`](super::FastScanBlocks)).
    pub fn new(rotated_query: &[f32], centroids: &[f32], bits: u8) -> Result<Self, FastScanError> {
        let mut table = Self {
            dim: 0,
            bits,
            used_lanes: 0,
            used_wide: 0,
            entries: Vec::new(),
            wide: Vec::new(),
            wide_entries: Vec::new(),
            nibble_runs: Vec::new(),
            step: 1.0,
            unit: 1,
            sum_step: 1.0,
            offset: 0.0,
        };
        table.rebuild(rotated_query, centroids, bits)?;
        Ok(table)
    }

    /// This table made [`new`](Self::new)`(rotated_query, centroids, bits)` in place, reusing
    /// its memory (the cache's decode loop builds one per query head and step). Left unchanged
    /// on an error.
    pub fn rebuild(
        &mut self,
        rotated_query: &[f32],
        centroids: &[f32],
        bits: u8,
    ) -> Result<(), FastScanError> {
        // The standalone layout ([`FastScanBlocks`](super::FastScanBlocks)) holds 1 to 4 bits.
        if !(1..=4).contains(&bits) {
            return Err(FastScanError::UnsupportedBits { bits });
        }
        let lanes = lanes_for(rotated_query.len(), bits);
        let part = TablePart {
            query: rotated_query,
            centroids,
            bits,
            lanes,
        };
        // The standalone layout holds a 3-bit code whole in a nibble, not as planes.
        self.rebuild_lanes(&[part], lanes, false)?;
        self.bits = bits;
        Ok(())
    }

    /// The table of a record of several coded parts one after another (the equal-bit groups
    /// of a basis record, each with its own query slice, codebook and width), their lanes
    /// concatenated in order and padded with zero lanes to `lanes` (the record's nibbles).
    /// One step `δ` for all of them, so the kernels sum every part in one pass; a part's
    /// score is its slice of the same sum. [`bits`](Self::bits) is 0 for such a table (it
    /// matches no single-width [`FastScanBlocks`](super::FastScanBlocks)). Left unchanged on
    /// an error.
    ///
    /// ```
    /// use tq_cache::attention::fast_scan::{ScoreTable, TablePart};
    /// let q = [1.0f32, -0.5, 0.25, 2.0];
    /// let (c2, c1) = ([-1.5f32, -0.5, 0.5, 1.5], [-1.0f32, 1.0]);
    /// // Two 2-bit codes in one lane, then two 1-bit codes in another, padded to 4 lanes.
    /// let parts = [
    ///     TablePart { query: &q[..2], centroids: &c2, bits: 2, lanes: 1 },
    ///     TablePart { query: &q[2..], centroids: &c1, bits: 1, lanes: 1 },
    /// ];
    /// let mut table = ScoreTable::new(&q, &c2, 2).unwrap();
    /// table.rebuild_parts(&parts, 4).unwrap();
    /// assert_eq!((table.dim(), table.bits()), (4, 0));
    /// ```
    pub fn rebuild_parts(
        &mut self,
        parts: &[TablePart<'_>],
        lanes: usize,
    ) -> Result<(), FastScanError> {
        self.rebuild_lanes(parts, lanes, true)
    }

    /// [`rebuild_parts`](Self::rebuild_parts), with codes of 3 bits as bit planes (`planes_3`,
    /// the cache's order) or whole in a nibble (the standalone layout).
    fn rebuild_lanes(
        &mut self,
        parts: &[TablePart<'_>],
        lanes: usize,
        planes_3: bool,
    ) -> Result<(), FastScanError> {
        let wide = |bits: u8| is_wide(bits) && (planes_3 || bits != 3);
        for part in parts {
            part.check()?;
        }
        let dim: usize = parts.iter().map(|p| p.query.len()).sum();
        if dim == 0 {
            return Err(FastScanError::ZeroDim);
        }
        let needed: usize = parts.iter().map(|p| p.lanes).sum();
        if needed > lanes || !lanes.is_multiple_of(4) {
            return Err(FastScanError::LengthMismatch {
                what: "table lanes (the parts' lanes, a multiple of 4)",
                expected: needed.next_multiple_of(4),
                actual: lanes,
            });
        }
        // A lane's entries span Σ_i |q'_i|·(c_max − c_min) over its coordinates; the widest
        // nibble lane sets the step. A coordinate stored as bit planes spans
        // |q'_j|·(c_max − c_min) in its own 16-bit entries.
        let widest = |planes: bool| {
            parts
                .iter()
                .filter(|p| wide(p.bits) == planes)
                .map(|p| {
                    let (c_min, c_max) = p.range();
                    let per = if planes { 1 } else { codes_per_lane(p.bits) };
                    p.query
                        .chunks(per)
                        .map(|lane| lane.iter().map(|q| q.abs()).sum::<f32>())
                        .fold(0.0f32, f32::max)
                        * (c_max - c_min)
                })
                .fold(0.0f32, f32::max)
        };
        let (widest_lane, widest_wide) = (widest(false), widest(true));
        // The wide entries' step is `δ / 2^k`, k ≤ 8, the finest whose entries fit 16 bits;
        // `δ` is raised where even k = 0 would not fit them (a wide coordinate spanning more
        // than 257 nibble lanes' worth).
        let widest = widest_lane.max(widest_wide / 257.0);
        let step = if widest > 0.0 { widest / 255.0 } else { 1.0 };
        let mut unit = 256u32;
        while unit > 1 && widest_wide / (step / unit as f32) > 65535.0 {
            unit /= 2;
        }
        let entries = &mut self.entries;
        entries.clear();
        entries.resize(lanes * LANE_BYTES, 0);
        let mut offset = 0.0f64;
        let mut used = 0;
        let mut first = 0;
        self.wide.clear();
        self.wide_entries.clear();
        self.nibble_runs.clear();
        let mut used_wide = 0;
        let fine = step / unit as f32;
        for part in parts {
            if part.query.is_empty() {
                // A part another table scores (two tiers): its lanes hold no entries and no
                // kernel reads them.
                first += part.lanes;
                continue;
            }
            let (c_min, c_max) = part.range();
            if wide(part.bits) {
                let planes =
                    WidePart::new(part.bits, part.query.len(), first, self.wide_entries.len())
                        .ok_or(FastScanError::UnsupportedBits { bits: part.bits })?;
                self.wide_entries.resize(planes.end_entry(), 0);
                for (j, &q) in part.query.iter().enumerate() {
                    let o = q * if q >= 0.0 { c_min } else { c_max };
                    offset += f64::from(o);
                    let (at, len) = (planes.entries(j), planes.table_len());
                    for (k, &c) in part.centroids.iter().enumerate() {
                        let [low, high] = entry_u16((q * c - o) / fine).to_le_bytes();
                        self.wide_entries[at + k] = low;
                        self.wide_entries[at + len + k] = high;
                    }
                }
                self.wide.push(planes);
                used_wide += part.query.len();
                first += part.lanes;
                continue;
            }
            let (bits, per) = (part.bits, codes_per_lane(part.bits));
            let mask = (1usize << bits) - 1;
            for (l, lane) in part.query.chunks(per).enumerate() {
                // `products[i][k] = q'_i c_k − o_i ≥ 0`, `o_i` the smallest product of
                // coordinate i.
                let mut products = [[0.0f32; 16]; 4];
                for (p, &q) in products.iter_mut().zip(lane) {
                    let o = q * if q >= 0.0 { c_min } else { c_max };
                    offset += f64::from(o);
                    for (p, &c) in p.iter_mut().zip(part.centroids) {
                        *p = q * c - o;
                    }
                }
                let at = (first + l) * LANE_BYTES;
                let codes = if per == 1 { part.centroids.len() } else { 16 };
                for (n, e) in entries[at..at + LANE_BYTES]
                    .iter_mut()
                    .enumerate()
                    .take(codes)
                {
                    let sum = (0..lane.len()).fold(0.0f32, |acc, i| {
                        acc + products[i][(n >> (usize::from(bits) * i)) & mask]
                    });
                    *e = entry_byte(sum / step);
                }
            }
            used += part.query.len().div_ceil(per);
            let run = first / 4 * 4..(first + part.lanes).next_multiple_of(4).min(lanes);
            match self.nibble_runs.last_mut() {
                Some(last) if last.end >= run.start => last.end = last.end.max(run.end),
                _ => self.nibble_runs.push(run),
            }
            first += part.lanes;
        }
        self.dim = dim;
        self.bits = 0;
        self.used_lanes = used;
        self.used_wide = used_wide;
        self.step = step;
        self.unit = if used_wide > 0 { unit } else { 1 };
        self.sum_step = step / self.unit as f32;
        self.offset = offset as f32;
        Ok(())
    }

    /// The head dimension.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Bits per code (0 for a table of several parts, [`rebuild_parts`](Self::rebuild_parts)).
    pub fn bits(&self) -> u8 {
        self.bits
    }

    /// The nibble lanes' step `δ`.
    pub fn step(&self) -> f32 {
        self.step
    }

    /// Units of a sum that a nibble lane's byte entry counts: 1, or `2^k` (k ≤ 8) in a table
    /// with coordinates stored as bit planes, whose 16-bit entries count steps of `δ / 2^k`
    /// (256 unless their span needs coarser steps to fit 16 bits).
    pub fn lane_unit(&self) -> u32 {
        self.unit
    }

    /// What one unit of an integer sum is worth: `δ / lane_unit`.
    pub fn sum_step(&self) -> f32 {
        self.sum_step
    }

    /// `Σ_j o_j`.
    pub fn offset(&self) -> f32 {
        self.offset
    }

    /// The bound on `|fast − exact|` per unit norm: `L · δ / 2`, `L` the lanes that hold
    /// coordinates (`⌈d / m⌉` for one part), plus `W · δ / (2·2^k)` for `W` coordinates
    /// stored as bit planes (before f32 rounding).
    pub fn error_bound(&self) -> f32 {
        self.used_lanes as f32 * self.step / 2.0 + self.used_wide as f32 * self.sum_step / 2.0
    }

    /// The score per unit norm of an integer sum: `sum_step · sum + Σ_j o_j`.
    #[inline(always)]
    pub fn dequantize(&self, sum: u32) -> f32 {
        // A sum is at most 65 535 per lane, far below 2^31, where the signed conversion (one
        // instruction, and one vector instruction for eight) gives the same f32.
        debug_assert!(sum < 1 << 31);
        self.sum_step * (sum as i32) as f32 + self.offset
    }

    /// Nibble lanes of the records the table scores (entries `16 · lanes`).
    pub fn lanes(&self) -> usize {
        self.entries.len() / LANE_BYTES
    }

    /// The entry of nibble `nibble` (< 16) in lane `lane`: a score's integer sum adds one per
    /// lane, `δ · sum + offset` its value per unit norm (`None` out of range).
    ///
    /// ```
    /// use tq_cache::attention::fast_scan::ScoreTable;
    /// // One 4-bit coordinate per lane; q' = [1, 0]: lane 0 spans the codebook, lane 1 is flat.
    /// let c: Vec<f32> = (0..16).map(|k| k as f32 - 7.5).collect();
    /// let table = ScoreTable::new(&[1.0, 0.0], &c, 4).unwrap();
    /// assert_eq!((table.entry(0, 0), table.entry(0, 15), table.entry(1, 9)), (Some(0), Some(255), Some(0)));
    /// assert_eq!(table.lanes(), 4);
    /// assert_eq!(table.entry(4, 0), None);
    /// ```
    pub fn entry(&self, lane: usize, nibble: u8) -> Option<u8> {
        (nibble < 16)
            .then(|| {
                self.entries
                    .get(lane * LANE_BYTES + usize::from(nibble))
                    .copied()
            })
            .flatten()
    }

    /// The byte entries, 16 per lane (padded lanes, and the lanes of bit planes, zero).
    pub(super) fn entries(&self) -> &[u8] {
        &self.entries
    }

    /// The runs of lanes (whole groups of 4) that hold codes of 1, 2 and 4 bits: the lanes the
    /// nibble kernels read.
    pub(crate) fn nibble_runs(&self) -> &[std::ops::Range<usize>] {
        &self.nibble_runs
    }

    /// The parts stored as bit planes, which the nibble lanes do not score.
    pub(crate) fn wide(&self) -> &[WidePart] {
        &self.wide
    }

    /// Their entries ([`WidePart::entries`] is where each coordinate's start).
    pub(crate) fn wide_entries(&self) -> &[u8] {
        &self.wide_entries
    }
}

/// One coded part of a record, for [`ScoreTable::rebuild_parts`].
#[derive(Clone, Copy, Debug)]
pub struct TablePart<'a> {
    /// The part's rotated query (with any scale folded in), one value per coordinate; empty
    /// for a part this table skips (its lanes scored by another table: a tier with its own
    /// norm).
    pub query: &'a [f32],
    /// The part's codebook, `2^bits` values.
    pub centroids: &'a [f32],
    /// Bits per code, 1 to 8: codes of 1, 2 and 4 bits sit whole in nibbles, wider and
    /// 3-bit ones are bit planes ([`record_order`](crate::record_order)).
    pub bits: u8,
    /// Lanes the part takes in a record: at least `⌈query.len() / m⌉` (`m` codes per nibble),
    /// or its planes' lanes; more where its packed words end in padding.
    pub lanes: usize,
}

impl TablePart<'_> {
    fn check(&self) -> Result<(), FastScanError> {
        if !(1..=8).contains(&self.bits) {
            return Err(FastScanError::UnsupportedBits { bits: self.bits });
        }
        if self.centroids.len() != 1 << self.bits {
            return Err(FastScanError::LengthMismatch {
                what: "centroids",
                expected: 1 << self.bits,
                actual: self.centroids.len(),
            });
        }
        let needed = planes_from(self.bits, self.query.len(), 0)
            .and_then(|p| p.last().map(|p| p.first_lane + p.lanes))
            .unwrap_or(usize::MAX);
        if self.lanes < needed {
            return Err(FastScanError::LengthMismatch {
                what: "part lanes",
                expected: needed,
                actual: self.lanes,
            });
        }
        if !self.query.iter().all(|v| v.is_finite()) {
            return Err(FastScanError::NotFinite { what: "query" });
        }
        if !self.centroids.iter().all(|v| v.is_finite()) {
            return Err(FastScanError::NotFinite { what: "centroid" });
        }
        Ok(())
    }

    /// `(c_min, c_max)` of the codebook.
    fn range(&self) -> (f32, f32) {
        self.centroids
            .iter()
            .fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &c| {
                (lo.min(c), hi.max(c))
            })
    }
}

/// `x.round().clamp(0.0, 65535.0) as u16` (`round`: half away from zero), as [`entry_byte`]
/// computes it.
#[inline]
fn entry_u16(x: f32) -> u16 {
    let x = x.clamp(0.0, 65535.0);
    let whole = x as i32;
    (whole + i32::from(x - whole as f32 >= 0.5)) as u16
}

/// `x.round().clamp(0.0, 255.0) as u8` (`round`: half away from zero) without the library
/// call `round` is on x86-64 without SSE4.1, the bulk of a table's rebuild: clamped first
/// (the same result), truncated, then one more where the remainder — exact, as `x` and its
/// integer part lie within a factor of two or the part is zero — is at least a half. A NaN
/// gives 0, as the cast does.
#[inline]
fn entry_byte(x: f32) -> u8 {
    let x = x.clamp(0.0, 255.0);
    let whole = x as i32;
    (whole + i32::from(x - whole as f32 >= 0.5)) as u8
}

#[cfg(test)]
mod tests {
    use super::entry_byte;

    /// The same byte as the library rounding on every float in [−2, 258] of a fine grid, the
    /// halves and their neighbours, and the extremes.
    #[test]
    fn entry_bytes_round_half_away_from_zero() {
        let reference = |x: f32| x.round().clamp(0.0, 255.0) as u8;
        let mut checked = 0;
        for k in -2000..=258_000 {
            let x = k as f32 / 1000.0;
            for x in [x, x.next_up(), x.next_down()] {
                assert_eq!(entry_byte(x), reference(x), "{x:e}");
                checked += 1;
            }
        }
        for k in 0..=256 {
            let half = k as f32 + 0.5;
            for x in [half, half.next_up(), half.next_down()] {
                assert_eq!(entry_byte(x), reference(x), "{x:e}");
            }
        }
        for x in [
            0.0,
            -0.0,
            1e-45,
            0.499_999_97,
            f32::MAX,
            f32::MIN,
            f32::INFINITY,
        ] {
            assert_eq!(entry_byte(x), reference(x), "{x:e}");
        }
        assert_eq!(entry_byte(f32::NAN), 0);
        assert!(checked > 700_000);
    }
}
