//! The Lloyd-Max codebook: construction, accessors, encoding and decoding.

use serde::{Deserialize, Serialize};

use crate::decision::{DecisionTable, f32_at_or_below};
use crate::solver::solve;
use crate::standard_law::StandardLaw;
use crate::{CoordinateDistribution, LloydMaxError};

/// Supported bit widths.
const BITS: std::ops::RangeInclusive<u8> = 1..=8;

/// An MSE-optimal scalar quantizer for one coordinate of a randomly rotated unit vector.
///
/// Holds `2^bits` sorted centroids `c_k` and the `2^bits − 1` interior thresholds
/// `t_k = (c_k + c_{k+1})/2`, solved so that every centroid is the conditional mean of its
/// cell to `10⁻¹²` standard deviations. `f32` copies serve the encode hot path.
///
/// ```
/// use tq_lloyd_max::{CoordinateDistribution, LloydMaxCodebook};
///
/// let codebook = LloydMaxCodebook::new(CoordinateDistribution::Beta { dim: 128 }, 2)?;
/// assert_eq!(codebook.levels(), 4);
/// // D_mse = d·C for the exact law at d = 128, b = 2.
/// assert!((codebook.unit_vector_distortion() - 0.116_000_07).abs() < 1e-8);
/// let code = codebook.quantize(0.05);
/// assert_eq!(code, 2);
/// assert_eq!(codebook.dequantize(code), codebook.centroids_f32()[2]);
/// # Ok::<(), tq_lloyd_max::LloydMaxError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "CodebookRecord", into = "CodebookRecord")]
pub struct LloydMaxCodebook {
    distribution: CoordinateDistribution,
    bits: u8,
    centroids: Vec<f64>,
    thresholds: Vec<f64>,
    mse_per_coordinate: f64,
    centroids_f32: Vec<f32>,
    thresholds_f32: Vec<f32>,
    decision: DecisionTable,
}

/// The serialized form: the `f64` centroids and MSE only. Thresholds and `f32` tables are
/// derived data, rebuilt (and the invariants re-checked) on deserialization, so a restored
/// codebook behaves identically provided the format round-trips `f64` exactly (serde_json
/// needs its `float_roundtrip` feature for that; binary formats do it anyway).
#[derive(Clone, Debug, Serialize, Deserialize)]
struct CodebookRecord {
    distribution: CoordinateDistribution,
    bits: u8,
    centroids: Vec<f64>,
    mse_per_coordinate: f64,
}

impl LloydMaxCodebook {
    /// Solves the `bits`-bit Lloyd-Max quantizer of `distribution` (`bits` in `1..=8`).
    ///
    /// Takes well under a millisecond for `bits <= 4` and a few milliseconds at `bits = 8`.
    pub fn new(distribution: CoordinateDistribution, bits: u8) -> Result<Self, LloydMaxError> {
        check_bits(bits)?;
        let law = StandardLaw::new(distribution)?;
        let half = solve(&law, 1 << bits)?;
        let dim = distribution.dim() as f64;
        let sqrt_dim = dim.sqrt();
        let upper: Vec<f64> = half.centroids.iter().map(|c| c / sqrt_dim).collect();
        // Mirroring makes the symmetry c_k = −c_{2^b−1−k} exact, and the middle threshold 0.
        let centroids: Vec<f64> = upper
            .iter()
            .rev()
            .map(|c| -c)
            .chain(upper.iter().copied())
            .collect();
        let thresholds = midpoints(&centroids);
        Ok(Self::from_parts(
            distribution,
            bits,
            centroids,
            thresholds,
            half.distortion / dim,
        ))
    }

    /// Builds the `f32` tables for already validated `f64` data.
    fn from_parts(
        distribution: CoordinateDistribution,
        bits: u8,
        centroids: Vec<f64>,
        thresholds: Vec<f64>,
        mse_per_coordinate: f64,
    ) -> Self {
        let centroids_f32 = centroids.iter().map(|&c| c as f32).collect();
        let thresholds_f32: Vec<f32> = thresholds.iter().map(|&t| f32_at_or_below(t)).collect();
        let decision = DecisionTable::new(bits, &thresholds_f32);
        Self {
            distribution,
            bits,
            centroids,
            thresholds,
            mse_per_coordinate,
            centroids_f32,
            thresholds_f32,
            decision,
        }
    }

    /// The law this codebook is optimal for.
    pub fn distribution(&self) -> CoordinateDistribution {
        self.distribution
    }

    /// Bits per coordinate.
    pub fn bits(&self) -> u8 {
        self.bits
    }

    /// Number of centroids, `2^bits`.
    pub fn levels(&self) -> usize {
        self.centroids.len()
    }

    /// The `2^bits` centroids, strictly increasing, symmetric about 0.
    pub fn centroids(&self) -> &[f64] {
        &self.centroids
    }

    /// The `2^bits − 1` interior thresholds, `thresholds[k] = (c_k + c_{k+1})/2` exactly.
    pub fn thresholds(&self) -> &[f64] {
        &self.thresholds
    }

    /// The centroids rounded to nearest `f32` (what [`dequantize`](Self::dequantize) returns).
    pub fn centroids_f32(&self) -> &[f32] {
        &self.centroids_f32
    }

    /// The thresholds rounded *down* to `f32`: for every `f32` `x`,
    /// `x > thresholds_f32()[k]` exactly when `f64::from(x) > thresholds()[k]`.
    pub fn thresholds_f32(&self) -> &[f32] {
        &self.thresholds_f32
    }

    /// `C = E[(X − Q(X))²]` under [`distribution`](Self::distribution).
    pub fn mse_per_coordinate(&self) -> f64 {
        self.mse_per_coordinate
    }

    /// `D_mse = dim · C`: the expected squared error of a whole unit vector (for `Gaussian`,
    /// the per-coordinate MSE of `N(0, 1)`).
    pub fn unit_vector_distortion(&self) -> f64 {
        self.distribution.dim() as f64 * self.mse_per_coordinate
    }

    /// The code of `x`: the index of its nearest centroid, computed as the number of
    /// thresholds `t` with `x > t` (a value exactly on a threshold goes to the lower cell).
    /// NaN maps to code 0; `±∞` map to the outermost codes.
    #[inline]
    pub fn quantize(&self, x: f32) -> u8 {
        self.decision.code(x)
    }

    /// [`quantize`](Self::quantize) for every element of `xs`, written to `codes`.
    ///
    /// # Errors
    /// [`LloydMaxError::LengthMismatch`] if the slices differ in length.
    pub fn quantize_slice(&self, xs: &[f32], codes: &mut [u8]) -> Result<(), LloydMaxError> {
        if xs.len() != codes.len() {
            return Err(LloydMaxError::LengthMismatch {
                expected: xs.len(),
                actual: codes.len(),
            });
        }
        self.decision.encode(xs, codes);
        Ok(())
    }

    /// The code of an `f64` value under the `f64` thresholds (same rule as
    /// [`quantize`](Self::quantize), which agrees with it on every `f32` input).
    pub fn quantize_f64(&self, x: f64) -> u8 {
        // At most 2^8 − 1 thresholds lie below x.
        self.thresholds.partition_point(|&t| t < x) as u8
    }

    /// The `f32` centroid of `code`. Codes `>= levels()` are clamped to the top centroid
    /// (they cannot come from [`quantize`](Self::quantize)).
    #[inline]
    pub fn dequantize(&self, code: u8) -> f32 {
        let top = self.centroids_f32.len() - 1;
        self.centroids_f32[usize::from(code).min(top)]
    }

    /// The mean of `(x − c[Q(x)])²` over `samples`, in `f64` (NaN for an empty slice).
    pub fn empirical_distortion(&self, samples: &[f64]) -> f64 {
        let total: f64 = samples
            .iter()
            .map(|&x| {
                let error = x - self.centroids[usize::from(self.quantize_f64(x))];
                error * error
            })
            .sum();
        total / samples.len() as f64
    }
}

fn check_bits(bits: u8) -> Result<(), LloydMaxError> {
    if BITS.contains(&bits) {
        Ok(())
    } else {
        Err(LloydMaxError::UnsupportedBits { bits })
    }
}

fn midpoints(centroids: &[f64]) -> Vec<f64> {
    centroids.windows(2).map(|w| (w[0] + w[1]) / 2.0).collect()
}

impl From<LloydMaxCodebook> for CodebookRecord {
    fn from(codebook: LloydMaxCodebook) -> Self {
        Self {
            distribution: codebook.distribution,
            bits: codebook.bits,
            centroids: codebook.centroids,
            mse_per_coordinate: codebook.mse_per_coordinate,
        }
    }
}

impl TryFrom<CodebookRecord> for LloydMaxCodebook {
    type Error = LloydMaxError;

    /// Re-checks what the encode path relies on (sizes, finite strictly increasing
    /// centroids); it does not re-solve the codebook.
    fn try_from(record: CodebookRecord) -> Result<Self, LloydMaxError> {
        record.distribution.validate()?;
        check_bits(record.bits)?;
        let invalid = |reason: &str| {
            Err(LloydMaxError::InvalidCodebook {
                reason: reason.to_owned(),
            })
        };
        let levels = 1usize << record.bits;
        if record.centroids.len() != levels {
            return invalid("expected 2^bits centroids");
        }
        if !record.centroids.iter().all(|c| c.is_finite()) {
            return invalid("centroids must be finite");
        }
        if !record.centroids.windows(2).all(|w| w[0] < w[1]) {
            return invalid("centroids must be strictly increasing");
        }
        if !(record.mse_per_coordinate.is_finite() && record.mse_per_coordinate >= 0.0) {
            return invalid("mse_per_coordinate must be finite and non-negative");
        }
        let thresholds = midpoints(&record.centroids);
        Ok(Self::from_parts(
            record.distribution,
            record.bits,
            record.centroids,
            thresholds,
            record.mse_per_coordinate,
        ))
    }
}
