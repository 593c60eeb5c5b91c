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
/// Coordinates stored as bit planes (codes of 3 or 5 to 8 bits, in the cache's order) are
/// scored by a product of two integers instead of a table: the entry of code `k` at
/// coordinate `j` is `Q_j · E_k`, with the part's centroids on a 12-bit signed grid shared by
/// every query, `E_k = round(2048 · c_k / max|c|)`, and the query on a grid of the sum's unit,
/// `Q_j = round(q'_j · (max|c| / 2048 / sum_step))` (16-bit). `q'_j c_k` is rank one in
/// `(j, k)`, so the kernels look each token's `E` up once per coordinate for every query head
/// of a KV head and multiply-add pairs of coordinates (`vpmaddwd`), where a table per head
/// needs `2^b` entries per coordinate looked up per head. These coordinates are the widest
/// (a fitted basis gives its most bits to the components of most variance), so their error
/// must stay far below a nibble lane's: `|q'_j c_k / sum_step − Q_j E_k| ≤ (2048 + |Q_j|) / 2`
/// units of `sum_step = δ / unit`, `unit` ([`lane_unit`](Self::lane_unit), a power of two the
/// nibble lanes' bytes count) the largest that keeps every `Q_j` within 16 bits and every sum
/// within 31 bits (`2^17` on `rec4.25`'s records, where a wide coordinate's error is about a
/// twentieth of a nibble lane's `δ/2`). A table with such coordinates counts its sum in those units, still one
/// exact integer (signed: products of either sign, kept as two's complement in the `u32`
/// sums, [`dequantize`](Self::dequantize)).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ScoreTable {
    dim: usize,
    bits: u8,
    /// Lanes that hold coordinates (the error bound's `L`), and the bit-plane coordinates'
    /// part of the bound in units of `sum_step`: `Σ_j (2048 + |Q_j|) / 2`.
    used_lanes: usize,
    wide_error_units: f64,
    entries: Vec<u8>,
    /// The parts stored as bit planes (3 or 5 to 8 bits), whose codes no nibble lane holds
    /// whole: where their planes lie, their integer queries and their centroids.
    wide: Vec<WidePart>,
    /// Per wide coordinate `j` (each part's run padded with zeros to a multiple of 4), its
    /// integer query `Q_j`.
    wide_query: Vec<i16>,
    /// Per wide part, its centroids `E_k` (16-bit) as two byte tables, the low bytes then the
    /// high bytes, `centroid_len()` each.
    wide_centroids: Vec<u8>,
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
/// ([`planes_from`]) and, in a [`ScoreTable`], where its integer queries and centroids start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct WidePart {
    pub(crate) bits: u8,
    pub(crate) dim: usize,
    pub(crate) spans: PlaneSpans,
    /// Where its coordinates' integer queries start in the table's `wide_query` (a multiple
    /// of 4: the kernels take both pairs of every group of four coordinates, padding
    /// included, so a record's pairs are consecutive).
    pub(crate) query_at: usize,
    /// Where its centroids' low bytes start in the table's `wide_centroids` (the high bytes
    /// `centroid_len()` further).
    pub(crate) centroids_at: usize,
    /// Per plane `p` and position `i` of a nibble (`m = 4 / width` codes each), what nibble
    /// `n` gives that code: `luts[p][i][n] = ((n >> width·i) mod 2^width) << shift` (the
    /// vector kernels' byte shuffles).
    pub(crate) luts: [[[u8; 16]; 4]; 3],
}

impl WidePart {
    /// The part of `dim` codes of `bits` bits whose planes start at lane `first_lane` (`None`
    /// for a width that is not 1 to 8); its queries and centroids at 0.
    pub(crate) fn new(bits: u8, dim: usize, first_lane: usize) -> Option<Self> {
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
            query_at: 0,
            centroids_at: 0,
            luts,
        })
    }

    /// Bytes of each of its two centroid tables: `2^b`, at least 16 (the AVX2 kernel's
    /// shuffles read 16 at a time).
    pub(crate) fn centroid_len(&self) -> usize {
        (1usize << self.bits).max(16)
    }

    /// Its integer queries' slots in `wide_query`: `dim` rounded up to a multiple of 4.
    pub(crate) fn query_len(&self) -> usize {
        self.dim.next_multiple_of(4)
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
            wide_error_units: 0.0,
            entries: Vec::new(),
            wide: Vec::new(),
            wide_query: Vec::new(),
            wide_centroids: Vec::new(),
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
        // nibble lane sets the step.
        let widest_lane = parts
            .iter()
            .filter(|p| !wide(p.bits))
            .map(|p| {
                let (c_min, c_max) = p.range();
                p.query
                    .chunks(codes_per_lane(p.bits))
                    .map(|lane| lane.iter().map(|q| q.abs()).sum::<f32>())
                    .fold(0.0f32, f32::max)
                    * (c_max - c_min)
            })
            .fold(0.0f32, f32::max);
        // A coordinate stored as bit planes reaches |q'_j|·max|c|; `δ` is raised where that
        // passes 257 nibble lanes' worth (so that at unit 1 every `Q_j` stays within 32 and
        // the sums far within 31 bits).
        let widest_wide = parts
            .iter()
            .filter(|p| wide(p.bits))
            .map(|p| p.query.iter().fold(0.0f32, |m, q| m.max(q.abs())) * p.abs_max())
            .fold(0.0f32, f32::max);
        let widest = widest_lane.max(widest_wide / 257.0);
        let step = if widest > 0.0 { widest / 255.0 } else { 1.0 };
        let entries = &mut self.entries;
        entries.clear();
        entries.resize(lanes * LANE_BYTES, 0);
        let mut offset = 0.0f64;
        let mut used = 0;
        let mut first = 0;
        self.wide.clear();
        self.wide_query.clear();
        self.wide_centroids.clear();
        self.nibble_runs.clear();
        for part in parts {
            if part.query.is_empty() {
                // A part another table scores (two tiers): its lanes hold no entries and no
                // kernel reads them.
                first += part.lanes;
                continue;
            }
            let (c_min, c_max) = part.range();
            if wide(part.bits) {
                let mut planes = WidePart::new(part.bits, part.query.len(), first)
                    .ok_or(FastScanError::UnsupportedBits { bits: part.bits })?;
                planes.query_at = self.wide_query.len();
                planes.centroids_at = self.wide_centroids.len();
                self.wide_query
                    .resize(planes.query_at + planes.query_len(), 0);
                let len = planes.centroid_len();
                self.wide_centroids.resize(planes.centroids_at + 2 * len, 0);
                let c_abs = part.abs_max();
                for (k, &c) in part.centroids.iter().enumerate() {
                    let e = if c_abs > 0.0 {
                        round_i16(c * 2048.0 / c_abs)
                    } else {
                        0
                    };
                    let [low, high] = e.to_le_bytes();
                    self.wide_centroids[planes.centroids_at + k] = low;
                    self.wide_centroids[planes.centroids_at + len + k] = high;
                }
                self.wide.push(planes);
                first += part.lanes;
                continue;
            }
            let per = codes_per_lane(part.bits);
            if let Ok(centroids) = <&[f32; 16]>::try_from(part.centroids) {
                // One 4-bit code per lane, the bulk of a basis table: `fill_lanes`'s bytes, in
                // a form the compiler turns into vector instructions.
                for (l, &q) in part.query.iter().enumerate() {
                    let o = q * if q >= 0.0 { c_min } else { c_max };
                    offset += f64::from(o);
                    let at = (first + l) * LANE_BYTES;
                    let lane: &mut [u8; 16] = (&mut entries[at..at + LANE_BYTES])
                        .try_into()
                        .expect("16 bytes a lane");
                    single_code_entries(q, o, centroids, step, lane);
                }
            } else {
                fill_lanes(entries, part, (c_min, c_max), first, step, &mut offset);
            }
            used += part.query.len().div_ceil(per);
            let run = first / 4 * 4..(first + part.lanes).next_multiple_of(4).min(lanes);
            match self.nibble_runs.last_mut() {
                Some(last) if last.end >= run.start => last.end = last.end.max(run.end),
                _ => self.nibble_runs.push(run),
            }
            first += part.lanes;
        }
        let (unit, wide_error_units) = self.quantize_wide_queries(parts, &wide, step, used);
        self.dim = dim;
        self.bits = 0;
        self.used_lanes = used;
        self.wide_error_units = wide_error_units;
        self.step = step;
        self.unit = unit;
        self.sum_step = step / unit as f32;
        self.offset = offset as f32;
        Ok(())
    }

    /// The wide parts' integer queries `Q_j = round(q'_j · (max|c| / 2048 / sum_step))` in
    /// `wide_query`, and the unit they count in: the largest power of two (at most `2^24`;
    /// 1 without wide parts) that keeps every `|Q_j| ≤ 32767` (the kernels' 16-bit
    /// multiplies) and every sum within 31 bits, `255 · used · unit + 2048 · Σ_j |Q_j| ≤
    /// 2^31 − 1` (a nibble lane adds at most 255 bytes of `unit`, a wide coordinate at most
    /// `2048 · |Q_j|` either way). Returns it with `Σ_j (2048 + |Q_j|) / 2`, the wide
    /// coordinates' error bound in units.
    fn quantize_wide_queries(
        &mut self,
        parts: &[TablePart<'_>],
        wide: &dyn Fn(u8) -> bool,
        step: f32,
        used: usize,
    ) -> (u32, f64) {
        if self.wide.is_empty() {
            return (1, 0.0);
        }
        let wide_parts = || {
            parts
                .iter()
                .filter(|p| !p.query.is_empty() && wide(p.bits))
                .zip(&self.wide)
        };
        // The unit from the bounds in f64 (a margin of one per `Q_j` for its rounding), then
        // checked on the integers themselves and halved in the rare case rounding passes it.
        let (mut largest, mut total, mut count) = (0.0f64, 0.0f64, 0.0f64);
        for (part, _) in wide_parts() {
            let c_abs = f64::from(part.abs_max());
            for &q in part.query {
                let v = f64::from(q.abs()) * c_abs / 2048.0 / f64::from(step);
                largest = largest.max(v);
                total += v;
                count += 1.0;
            }
        }
        let limit = f64::from(i32::MAX);
        let by_query = 32766.0 / largest.max(f64::MIN_POSITIVE);
        let by_sum = (limit - 2048.0 * count) / (255.0 * used as f64 + 2048.0 * total).max(1.0);
        let fit = by_query.min(by_sum).clamp(1.0, f64::from(1u32 << 24));
        let mut unit = 1u32 << fit.log2().floor() as u32;
        loop {
            let sum_step = step / unit as f32;
            let (mut abs_sum, mut fits) = (0u64, true);
            for (part, planes) in wide_parts() {
                let scale = part.abs_max() / 2048.0 / sum_step;
                for (j, &q) in part.query.iter().enumerate() {
                    let x = q * scale;
                    fits &= x.abs() < 32767.5;
                    let v = round_i16(x);
                    abs_sum += u64::from(v.unsigned_abs());
                    self.wide_query[planes.query_at + j] = v;
                }
            }
            fits &= 255 * used as u64 * u64::from(unit) + 2048 * abs_sum <= i32::MAX as u64;
            if fits || unit == 1 {
                return (unit, (2048.0 * count + abs_sum as f64) / 2.0);
            }
            unit /= 2;
        }
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

    /// Units of a sum that a nibble lane's byte entry counts: 1, or in a table with
    /// coordinates stored as bit planes the power of two (at most `2^24`) whose units their
    /// products `Q_j · E_k` count: the largest that keeps every `|Q_j| ≤ 32767` and every sum
    /// within 31 bits.
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
    /// coordinates (`⌈d / m⌉` for one part), plus `Σ_j (2048 + |Q_j|) / 2 · sum_step` over
    /// the coordinates stored as bit planes (before f32 rounding).
    pub fn error_bound(&self) -> f32 {
        (self.used_lanes as f64 * f64::from(self.step) / 2.0
            + self.wide_error_units * f64::from(self.sum_step)) as f32
    }

    /// The score per unit norm of an integer sum: `sum_step · sum + Σ_j o_j`, the sum read
    /// as a signed 32-bit integer (the products of coordinates stored as bit planes have
    /// either sign; the kernels add them with wrap-around, exact as the total fits 31 bits).
    #[inline(always)]
    pub fn dequantize(&self, sum: u32) -> f32 {
        // The signed conversion is one instruction, and one vector instruction for eight.
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

    /// Their integer queries `Q_j` ([`WidePart::query_at`] is where each part's start).
    pub(crate) fn wide_query(&self) -> &[i16] {
        &self.wide_query
    }

    /// Their centroids `E_k` as byte tables ([`WidePart::centroids_at`]; the x86 kernel's
    /// shuffles read them, the other targets run the loop over [`wide_centroid`](Self::wide_centroid)).
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn wide_centroids(&self) -> &[u8] {
        &self.wide_centroids
    }

    /// `E_k` of `part` (one of [`wide`](Self::wide)).
    pub(crate) fn wide_centroid(&self, part: &WidePart, k: usize) -> i16 {
        let (at, len) = (part.centroids_at, part.centroid_len());
        i16::from_le_bytes([
            self.wide_centroids[at + k],
            self.wide_centroids[at + len + k],
        ])
    }
}

/// The byte entries of a nibble part's lanes from lane `first` (the general form: several
/// codes per nibble, or fewer than 16 codes; `(c_min, c_max)` its codebook's range), adding
/// its coordinates' offsets to `offset`.
fn fill_lanes(
    entries: &mut [u8],
    part: &TablePart<'_>,
    (c_min, c_max): (f32, f32),
    first: usize,
    step: f32,
    offset: &mut f64,
) {
    let (bits, per) = (part.bits, codes_per_lane(part.bits));
    let mask = (1usize << bits) - 1;
    for (l, lane) in part.query.chunks(per).enumerate() {
        // `products[i][k] = q'_i c_k − o_i ≥ 0`, `o_i` the smallest product of
        // coordinate i.
        let mut products = [[0.0f32; 16]; 4];
        for (p, &q) in products.iter_mut().zip(lane) {
            let o = q * if q >= 0.0 { c_min } else { c_max };
            *offset += f64::from(o);
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
}

/// The 16 bytes of a lane holding one 4-bit code, `entry_byte((q'·c_k − o) / step)` — what
/// [`fill_lanes`] computes for it (its sum `0 + p` is `p` but for the sign of a zero, which
/// the byte drops) — with `max`/`min` for the clamp (the same for every number, and 0 for a
/// NaN as the cast gives), so the loop compiles to vector instructions.
#[inline]
#[allow(clippy::manual_clamp)] // `clamp` keeps a NaN, whose check stops the vectorizing.
fn single_code_entries(q: f32, o: f32, centroids: &[f32; 16], step: f32, out: &mut [u8; 16]) {
    for (e, &c) in out.iter_mut().zip(centroids) {
        let x = ((q * c - o) / step).max(0.0).min(255.0);
        let whole = x as i32;
        *e = (whole + i32::from(x - whole as f32 >= 0.5)) as u8;
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

    /// `max_k |c_k|`.
    fn abs_max(&self) -> f32 {
        self.centroids.iter().fold(0.0f32, |m, c| m.max(c.abs()))
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

/// `x.round().clamp(-32767.0, 32767.0) as i16` (`round`: half away from zero) without the
/// library call, as [`entry_byte`] computes it.
#[inline]
fn round_i16(x: f32) -> i16 {
    let a = x.abs().min(32767.0);
    let whole = a as i32;
    let r = whole + i32::from(a - whole as f32 >= 0.5);
    (if x < 0.0 { -r } else { r }) as i16
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
    use super::{entry_byte, round_i16, single_code_entries};

    /// A lane of one 4-bit code gets the bytes of the general loop: `entry_byte` of the sum
    /// `0 + (q·c_k − o)` over the step, on random queries, codebooks and steps (zero and
    /// negative products, both signs of `q`, entries past 255 clamped).
    #[test]
    fn single_code_lanes_match_the_general_loop() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut unit = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % 200_001) as f32 / 100_000.0 - 1.0
        };
        for case in 0..20_000 {
            let centroids: [f32; 16] = std::array::from_fn(|_| 3.0 * unit());
            let q = 5.0 * unit();
            let (c_min, c_max) = centroids
                .iter()
                .fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), &c| {
                    (a.min(c), b.max(c))
                });
            let o = q * if q >= 0.0 { c_min } else { c_max };
            let step = (q.abs() * (c_max - c_min)).max(1e-3) / (200.0 + 100.0 * unit());
            let mut got = [0u8; 16];
            single_code_entries(q, o, &centroids, step, &mut got);
            let expected: Vec<u8> = centroids
                .iter()
                .map(|&c| entry_byte((0.0f32 + (q * c - o)) / step))
                .collect();
            assert_eq!(got.as_slice(), expected.as_slice(), "case {case}");
        }
    }

    /// The same integer as the library rounding (half away from zero, clamped to ±32767) on
    /// a fine grid over the range and past it, the halves and their neighbours.
    #[test]
    fn wide_queries_round_half_away_from_zero() {
        let reference = |x: f32| x.clamp(-32767.0, 32767.0).round() as i16;
        for k in -33_000_000..=33_000_000 {
            if k % 997 != 0 {
                continue;
            }
            let x = k as f32 / 1000.0;
            for x in [x, x.next_up(), x.next_down()] {
                assert_eq!(round_i16(x), reference(x), "{x:e}");
            }
        }
        for k in -32_768..=32_767 {
            let half = k as f32 + 0.5;
            for x in [half, half.next_up(), half.next_down()] {
                assert_eq!(round_i16(x), reference(x), "{x:e}");
            }
        }
        for x in [
            0.0,
            -0.0,
            1e-45,
            -0.5,
            0.5,
            f32::MAX,
            f32::MIN,
            f32::INFINITY,
        ] {
            assert_eq!(round_i16(x), reference(x), "{x:e}");
        }
    }

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
