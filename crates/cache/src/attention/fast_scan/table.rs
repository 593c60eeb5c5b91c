//! [`ScoreTable`]: a query's products with every centroid, quantized to bytes.

use super::FastScanError;
use super::layout::{LANE_BYTES, codes_per_lane, lanes_for};

/// Per nibble lane `l` of the layout ([`FastScanBlocks`](super::FastScanBlocks): `m` codes per
/// nibble, `m = 4 / b` for b = 1, 2, else one), the 16 bytes
/// `u_l[n] = round(Σ_i (q'_i c[n_i] − o_i) / δ)` over the lane's coordinates `i`, `n_i` the
/// code in bits `b·i ..` of nibble `n` (for m = 1, entries past the `2^b` centroids are zero),
/// with `o_i = min_k q'_i c_k` and one step `δ = max_l (Σ_i |q'_i|·(c_max − c_min)) / 255` for
/// all lanes. A score is then `δ · Σ_l u_l[nibble_l] + Σ_i o_i` up to `L · δ / 2`, `L` the
/// lanes that hold coordinates ([`error_bound`](Self::error_bound)).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ScoreTable {
    dim: usize,
    bits: u8,
    /// Lanes that hold coordinates (the error bound's `L`).
    used_lanes: usize,
    entries: Vec<u8>,
    step: f32,
    offset: f32,
}

impl ScoreTable {
    /// The table of `rotated_query` (`Π·q`, length `d`) against `centroids` (the codebook,
    /// `2^bits` values).
    pub fn new(rotated_query: &[f32], centroids: &[f32], bits: u8) -> Result<Self, FastScanError> {
        let mut table = Self {
            dim: 0,
            bits,
            used_lanes: 0,
            entries: Vec::new(),
            step: 1.0,
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
        let lanes = lanes_for(rotated_query.len(), bits);
        let part = TablePart {
            query: rotated_query,
            centroids,
            bits,
            lanes,
        };
        self.rebuild_parts(&[part], lanes)?;
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
        // lane of any part sets the step.
        let widest = parts
            .iter()
            .map(|p| {
                let (c_min, c_max) = p.range();
                p.query
                    .chunks(codes_per_lane(p.bits))
                    .map(|lane| lane.iter().map(|q| q.abs()).sum::<f32>())
                    .fold(0.0f32, f32::max)
                    * (c_max - c_min)
            })
            .fold(0.0f32, f32::max);
        let step = if widest > 0.0 { widest / 255.0 } else { 1.0 };
        let entries = &mut self.entries;
        entries.clear();
        entries.resize(lanes * LANE_BYTES, 0);
        let mut offset = 0.0f64;
        let mut used = 0;
        let mut first = 0;
        for part in parts {
            let (c_min, c_max) = part.range();
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
            first += part.lanes;
        }
        self.dim = dim;
        self.bits = 0;
        self.used_lanes = used;
        self.step = step;
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

    /// The shared step `δ`.
    pub fn step(&self) -> f32 {
        self.step
    }

    /// `Σ_j o_j`.
    pub fn offset(&self) -> f32 {
        self.offset
    }

    /// The bound on `|fast − exact|` per unit norm: `L · δ / 2`, `L` the lanes that hold
    /// coordinates (`⌈d / m⌉` for one part; before f32 rounding).
    pub fn error_bound(&self) -> f32 {
        self.used_lanes as f32 * self.step / 2.0
    }

    /// The score per unit norm of an integer sum: `δ · sum + Σ_j o_j`.
    #[inline(always)]
    pub fn dequantize(&self, sum: u32) -> f32 {
        // A sum is at most 255 per lane, far below 2^31, where the signed conversion (one
        // instruction, and one vector instruction for eight) gives the same f32.
        debug_assert!(sum < 1 << 31);
        self.step * (sum as i32) as f32 + self.offset
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

    /// The byte entries, 16 per lane (padded lanes zero).
    pub(super) fn entries(&self) -> &[u8] {
        &self.entries
    }
}

/// One coded part of a record, for [`ScoreTable::rebuild_parts`].
#[derive(Clone, Copy, Debug)]
pub struct TablePart<'a> {
    /// The part's rotated query (with any scale folded in), one value per coordinate.
    pub query: &'a [f32],
    /// The part's codebook, `2^bits` values.
    pub centroids: &'a [f32],
    /// Bits per code, 1 to 4.
    pub bits: u8,
    /// Lanes the part takes in a record: at least `⌈query.len() / m⌉` (`m` codes per nibble);
    /// more where its packed words end in padding.
    pub lanes: usize,
}

impl TablePart<'_> {
    fn check(&self) -> Result<(), FastScanError> {
        if !(1..=4).contains(&self.bits) {
            return Err(FastScanError::UnsupportedBits { bits: self.bits });
        }
        if self.centroids.len() != 1 << self.bits {
            return Err(FastScanError::LengthMismatch {
                what: "centroids",
                expected: 1 << self.bits,
                actual: self.centroids.len(),
            });
        }
        let needed = self.query.len().div_ceil(codes_per_lane(self.bits));
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
