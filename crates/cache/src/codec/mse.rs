//! TQ_mse(b): rotate, quantize every coordinate with the Lloyd-Max codebook of the exact
//! rotated-coordinate law, pack the codes, keep the norm as f16.

use std::sync::Arc;

use half::f16;
use serde::{Deserialize, Serialize};
use tq_lloyd_max::{CoordinateDistribution, LloydMaxCodebook};
use tq_rotation::{Rotation, RotationKind, RotationSpec};

use crate::codec::CodecError;
use crate::codec::input::{checked_norm, dot};
use crate::codec::packing::{pack_unchecked_len, unpack_unchecked_len, words_for};

/// Everything that defines a TQ_mse codec; two equal specs give bit-identical codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MseSpec {
    /// Vector (head) dimension `d`.
    pub dim: usize,
    /// Bits per coordinate, `1..=8`.
    pub bits: u8,
    /// Which random rotation Π to use.
    pub rotation: RotationKind,
    /// Seed of Π.
    pub seed: u64,
    /// Store `‖x‖ / ‖c[idx]‖` instead of `‖x‖`, so the decoded vector has exactly the input's
    /// norm (up to f16 rounding of the stored scale).
    pub norm_correction: bool,
}

impl MseSpec {
    /// A spec with the given shape, a randomized-Hadamard rotation and no norm correction.
    pub fn new(dim: usize, bits: u8, seed: u64) -> Self {
        Self {
            dim,
            bits,
            rotation: RotationKind::Hadamard,
            seed,
            norm_correction: false,
        }
    }
}

/// One vector encoded by [`TqMse`]: packed codes and the stored f16 scale.
#[derive(Clone, Debug, PartialEq)]
pub struct MseCode {
    /// `words_for(d, b)` little-endian words of packed b-bit codes.
    pub words: Vec<u32>,
    /// `‖x‖` (or `‖x‖/‖c[idx]‖` with norm correction); zero for a zero vector.
    pub norm: f16,
}

/// Reusable buffers so encoding and decoding allocate nothing per vector.
#[derive(Clone, Debug)]
pub struct CodecScratch {
    pub(crate) rotated: Vec<f32>,
    pub(crate) codes: Vec<u8>,
    pub(crate) residual: Vec<f32>,
    pub(crate) sketch: Vec<f32>,
    /// Buffers of a two-tier codec, built on first use by that codec.
    pub(crate) tiers: Option<Box<crate::two_tier::TwoTierScratch>>,
}

impl CodecScratch {
    /// Buffers for vectors of dimension `dim`.
    pub fn new(dim: usize) -> Self {
        Self {
            rotated: vec![0.0; dim],
            codes: vec![0; dim],
            residual: vec![0.0; dim],
            sketch: vec![0.0; dim],
            tiers: None,
        }
    }

    /// All four buffers are built together by [`CodecScratch::new`], so the code buffer's
    /// length stands for the dimension the scratch was made for.
    pub(crate) fn check(&self, dim: usize) -> Result<(), CodecError> {
        if self.codes.len() != dim {
            return Err(CodecError::LengthMismatch {
                what: "scratch",
                expected: dim,
                actual: self.codes.len(),
            });
        }
        Ok(())
    }
}

/// The TQ_mse(b) codec.
///
/// ```
/// use tq_cache::codec::{MseSpec, TqMse};
/// let codec = TqMse::new(MseSpec::new(64, 4, 7)).unwrap();
/// let x: Vec<f32> = (0..64).map(|i| (i as f32 * 0.37).sin()).collect();
/// let code = codec.encode(&x).unwrap();
/// let y = codec.decode(&code).unwrap();
/// let err: f32 = x.iter().zip(&y).map(|(a, b)| (a - b) * (a - b)).sum();
/// let norm2: f32 = x.iter().map(|a| a * a).sum();
/// assert!(err / norm2 < 0.05); // D_mse(4 bits) ≈ 0.009 for a typical vector
/// ```
#[derive(Clone, Debug)]
pub struct TqMse {
    spec: MseSpec,
    rotation: Rotation,
    codebook: Arc<LloydMaxCodebook>,
}

impl TqMse {
    /// Builds the rotation and fetches the (cached) codebook for `Beta { dim }`.
    pub fn new(spec: MseSpec) -> Result<Self, CodecError> {
        if !(1..=8).contains(&spec.bits) {
            return Err(CodecError::UnsupportedBits {
                bits: spec.bits,
                supported: "1..=8",
            });
        }
        let rotation = Rotation::new(spec.rotation, spec.dim, spec.seed)?;
        let codebook =
            LloydMaxCodebook::cached(CoordinateDistribution::Beta { dim: spec.dim }, spec.bits)?;
        Ok(Self {
            spec,
            rotation,
            codebook,
        })
    }

    /// The spec this codec was built from.
    pub fn spec(&self) -> MseSpec {
        self.spec
    }

    /// Vector dimension.
    pub fn dim(&self) -> usize {
        self.spec.dim
    }

    /// The rotation Π.
    pub fn rotation(&self) -> &Rotation {
        &self.rotation
    }

    /// The rotation's serializable identity.
    pub fn rotation_spec(&self) -> RotationSpec {
        self.rotation.spec()
    }

    /// The Lloyd-Max codebook used for every coordinate.
    pub fn codebook(&self) -> &LloydMaxCodebook {
        &self.codebook
    }

    /// Packed `u32` words per vector.
    pub fn words_per_vector(&self) -> usize {
        words_for(self.spec.dim, self.spec.bits)
    }

    /// Bytes stored per vector: the packed words plus the f16 norm.
    pub fn bytes_per_vector(&self) -> usize {
        4 * self.words_per_vector() + 2
    }

    /// Encodes `x` into `words` and returns the stored f16 scale. Allocation-free.
    ///
    /// A vector whose norm rounds to zero in f16 is stored as all-zero codes with scale zero and
    /// decodes to a true zero vector (never rotated noise).
    pub fn encode_into(
        &self,
        x: &[f32],
        scratch: &mut CodecScratch,
        words: &mut [u32],
    ) -> Result<f16, CodecError> {
        self.encode_rotated(x, scratch, words)
    }

    /// Like [`encode_into`](Self::encode_into) but leaves `Π·x` in `scratch.rotated` and the codes
    /// in `scratch.codes` for TQ_prod, which quantizes the residual next.
    pub(crate) fn encode_rotated(
        &self,
        x: &[f32],
        scratch: &mut CodecScratch,
        words: &mut [u32],
    ) -> Result<f16, CodecError> {
        let dim = self.spec.dim;
        let norm = checked_norm(x, dim)?;
        scratch.check(dim)?;
        if words.len() != self.words_per_vector() {
            return Err(CodecError::LengthMismatch {
                what: "packed words",
                expected: self.words_per_vector(),
                actual: words.len(),
            });
        }
        if norm > f16::MAX.to_f32() {
            return Err(CodecError::NormOutOfRange { norm });
        }
        let stored_norm = f16::from_f32(norm);
        self.rotation.apply(x, &mut scratch.rotated)?;
        if stored_norm == f16::ZERO {
            words.fill(0);
            scratch.codes.fill(0);
            return Ok(f16::ZERO);
        }
        let inv = 1.0 / norm;
        for v in scratch.rotated.iter_mut() {
            *v *= inv;
        }
        self.codebook
            .quantize_slice(&scratch.rotated, &mut scratch.codes)?;
        pack_unchecked_len(&scratch.codes, self.spec.bits, words);
        // Undo the normalization so callers see Π·x itself.
        for v in scratch.rotated.iter_mut() {
            *v *= norm;
        }
        if !self.spec.norm_correction {
            return Ok(stored_norm);
        }
        let centroids = self.codebook.centroids_f32();
        let code_norm = scratch
            .codes
            .iter()
            .map(|&c| {
                let v = centroids[c as usize];
                v * v
            })
            .sum::<f32>()
            .sqrt();
        let scale = norm / code_norm;
        if !scale.is_finite() || scale > f16::MAX.to_f32() {
            return Err(CodecError::NormOutOfRange { norm: scale });
        }
        Ok(f16::from_f32(scale))
    }

    /// Encodes one vector into an owned [`MseCode`].
    pub fn encode(&self, x: &[f32]) -> Result<MseCode, CodecError> {
        let mut scratch = CodecScratch::new(self.spec.dim);
        let mut words = vec![0u32; self.words_per_vector()];
        let norm = self.encode_into(x, &mut scratch, &mut words)?;
        Ok(MseCode { words, norm })
    }

    /// Writes the decoded vector in the rotated domain, `norm · c[idx]`, into `out`.
    ///
    /// Attention accumulates values in this domain and rotates back once per output.
    pub fn decode_rotated_into(
        &self,
        words: &[u32],
        norm: f16,
        scratch: &mut CodecScratch,
        out: &mut [f32],
    ) -> Result<(), CodecError> {
        let dim = self.spec.dim;
        scratch.check(dim)?;
        if words.len() != self.words_per_vector() || out.len() != dim {
            return Err(CodecError::LengthMismatch {
                what: "decode buffers",
                expected: self.words_per_vector() + dim,
                actual: words.len() + out.len(),
            });
        }
        unpack_unchecked_len(words, self.spec.bits, &mut scratch.codes);
        let centroids = self.codebook.centroids_f32();
        let n = norm.to_f32();
        for (o, &c) in out.iter_mut().zip(&scratch.codes) {
            *o = n * centroids[c as usize];
        }
        Ok(())
    }

    /// Decodes into `out` (original domain): `x̃ = Πᵀ·(norm · c[idx])`. Allocation-free.
    pub fn decode_into(
        &self,
        words: &[u32],
        norm: f16,
        scratch: &mut CodecScratch,
        out: &mut [f32],
    ) -> Result<(), CodecError> {
        let mut rotated = std::mem::take(&mut scratch.residual);
        let result = self
            .decode_rotated_into(words, norm, scratch, &mut rotated)
            .and_then(|()| Ok(self.rotation.apply_inverse(&rotated, out)?));
        scratch.residual = rotated;
        result
    }

    /// Decodes an owned [`MseCode`].
    pub fn decode(&self, code: &MseCode) -> Result<Vec<f32>, CodecError> {
        let mut scratch = CodecScratch::new(self.spec.dim);
        let mut out = vec![0.0; self.spec.dim];
        self.decode_into(&code.words, code.norm, &mut scratch, &mut out)?;
        Ok(out)
    }

    /// Rotates a query once: `Π·q` (the only per-query cost of scoring against compressed keys).
    pub fn rotate_query(&self, query: &[f32], out: &mut [f32]) -> Result<(), CodecError> {
        Ok(self.rotation.apply(query, out)?)
    }

    /// `⟨q, x̃⟩ = norm · ⟨Π·q, c[idx]⟩` from the rotated query, without decoding `x̃`.
    pub fn inner_product(
        &self,
        rotated_query: &[f32],
        code: &MseCode,
        scratch: &mut CodecScratch,
    ) -> Result<f32, CodecError> {
        if rotated_query.len() != self.spec.dim {
            return Err(CodecError::LengthMismatch {
                what: "rotated query",
                expected: self.spec.dim,
                actual: rotated_query.len(),
            });
        }
        let mut rotated = std::mem::take(&mut scratch.residual);
        let result = self.decode_rotated_into(&code.words, code.norm, scratch, &mut rotated);
        let value = dot(rotated_query, &rotated);
        scratch.residual = rotated;
        result.map(|()| value)
    }
}
