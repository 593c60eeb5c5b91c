//! [`ScoreTable`]: a query's products with every centroid, quantized to bytes.

use super::FastScanError;
use super::layout::LANE_BYTES;

/// Per rotated coordinate `j`, the 16 bytes `u_j[k] = round((q'_j c_k − o_j) / δ)` for the
/// `2^b` centroids (zero past them and on padded coordinates), with `o_j = min_k q'_j c_k` and
/// one step `δ = max_j (max_k − min_k of q'_j c_k) / 255` for all coordinates, so a score is
/// `δ · Σ_j u_j[code_j] + Σ_j o_j` up to `d · δ / 2`.
#[derive(Clone, Debug, PartialEq)]
pub struct ScoreTable {
    dim: usize,
    bits: u8,
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
        if !(1..=4).contains(&bits) {
            return Err(FastScanError::UnsupportedBits { bits });
        }
        if rotated_query.is_empty() {
            return Err(FastScanError::ZeroDim);
        }
        if centroids.len() != 1 << bits {
            return Err(FastScanError::LengthMismatch {
                what: "centroids",
                expected: 1 << bits,
                actual: centroids.len(),
            });
        }
        if !rotated_query.iter().all(|v| v.is_finite()) {
            return Err(FastScanError::NotFinite { what: "query" });
        }
        if !centroids.iter().all(|v| v.is_finite()) {
            return Err(FastScanError::NotFinite { what: "centroid" });
        }
        let dim = rotated_query.len();
        let (c_min, c_max) = centroids
            .iter()
            .fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &c| {
                (lo.min(c), hi.max(c))
            });
        // Per coordinate the products span |q'_j|·(c_max − c_min); the widest sets the step.
        let widest = rotated_query.iter().fold(0.0f32, |m, q| m.max(q.abs())) * (c_max - c_min);
        let step = if widest > 0.0 { widest / 255.0 } else { 1.0 };
        let entries = &mut self.entries;
        entries.clear();
        entries.resize(dim.next_multiple_of(4) * LANE_BYTES, 0);
        let mut offset = 0.0f64;
        for (j, &q) in rotated_query.iter().enumerate() {
            let o = q * if q >= 0.0 { c_min } else { c_max };
            offset += f64::from(o);
            for (k, &c) in centroids.iter().enumerate() {
                let u = ((q * c - o) / step).round();
                entries[j * LANE_BYTES + k] = u.clamp(0.0, 255.0) as u8;
            }
        }
        self.dim = dim;
        self.bits = bits;
        self.step = step;
        self.offset = offset as f32;
        Ok(())
    }

    /// The head dimension.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Bits per code.
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

    /// The bound on `|fast − exact|` per unit norm: `d · δ / 2` (before f32 rounding).
    pub fn error_bound(&self) -> f32 {
        self.dim as f32 * self.step / 2.0
    }

    /// The score per unit norm of an integer sum: `δ · sum + Σ_j o_j`.
    #[inline(always)]
    pub fn dequantize(&self, sum: u32) -> f32 {
        self.step * sum as f32 + self.offset
    }

    /// The byte entries, 16 per padded coordinate.
    pub(super) fn entries(&self) -> &[u8] {
        &self.entries
    }
}
