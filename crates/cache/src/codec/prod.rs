//! TQ_prod(b): TQ_mse(b−1) plus a 1-bit QJL sketch of the residual, for unbiased inner products.
//!
//! The residual is sketched in the rotated domain, `r = Π·x − norm·c[idx]`: that is the exact
//! error of what is stored (f16 norm included) and costs no inverse rotation at encode time.
//! Because Π is orthogonal, sketching `r` with `S` is sketching `Πᵀr` with `S·Π`, which has the
//! same law as `S` for Gaussian and Haar `S`; so every QJL property carries over unchanged.

use half::f16;
use serde::{Deserialize, Serialize};
use tq_qjl::{QjlSketch, QjlSpec, SketchKind, SketchScale};
use tq_rotation::RotationKind;

use crate::codec::CodecError;
use crate::codec::input::dot;
use crate::codec::mse::{CodecScratch, MseCode, MseSpec, TqMse};

/// Everything that defines a TQ_prod codec.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProdSpec {
    /// Vector (head) dimension `d`.
    pub dim: usize,
    /// Total bits per coordinate, `2..=9`: `bits − 1` for the MSE codes and 1 for the sketch.
    pub bits: u8,
    /// Rotation of the MSE stage.
    pub rotation: RotationKind,
    /// Seed of the rotation.
    pub seed: u64,
    /// Norm correction of the MSE stage (see [`MseSpec::norm_correction`]).
    pub norm_correction: bool,
    /// The QJL matrix kind, scale, shrinkage and seed.
    pub sketch: QjlSpec,
}

impl ProdSpec {
    /// The paper-faithful form: Gaussian `S` with the paper's scale `√(π/2)/m`, shrinkage 1.
    pub fn paper(dim: usize, bits: u8, seed: u64) -> Self {
        Self::with_sketch(dim, bits, seed, SketchKind::Gaussian)
    }

    /// Haar-orthogonal `S` with the exactly unbiased finite-d scale, shrinkage 1.
    pub fn orthogonal(dim: usize, bits: u8, seed: u64) -> Self {
        Self::with_sketch(dim, bits, seed, SketchKind::Haar)
    }

    fn with_sketch(dim: usize, bits: u8, seed: u64, kind: SketchKind) -> Self {
        // The sketch gets its own seed stream so S is independent of Π.
        let sketch_seed = seed ^ 0x9E37_79B9_7F4A_7C15;
        Self {
            dim,
            bits,
            rotation: RotationKind::Hadamard,
            seed,
            norm_correction: false,
            sketch: QjlSpec::new(kind, dim, sketch_seed),
        }
    }

    /// The same spec with another sketch scale.
    pub fn scale(mut self, scale: SketchScale) -> Self {
        self.sketch.scale = scale;
        self
    }

    /// The same spec with another shrinkage α (1 is unbiased; inner products scale by α).
    pub fn shrinkage(mut self, shrinkage: f32) -> Self {
        self.sketch.shrinkage = shrinkage;
        self
    }
}

/// One vector encoded by [`TqProd`].
#[derive(Clone, Debug, PartialEq)]
pub struct ProdCode {
    /// The TQ_mse(b−1) part.
    pub mse: MseCode,
    /// Packed sign bits of `S·r`.
    pub signs: Vec<u32>,
    /// `γ = ‖r‖` as stored (f16).
    pub gamma: f16,
}

/// A query prepared once for scoring against TQ_prod keys: `Π·q` and `S·Π·q`.
#[derive(Clone, Debug, PartialEq)]
pub struct PreparedQuery {
    /// `Π·q`, scored against the MSE codes.
    pub rotated: Vec<f32>,
    /// `S·Π·q`, scored against the sign bits.
    pub projected: Vec<f32>,
}

/// The TQ_prod(b) codec.
///
/// ```
/// use tq_cache::codec::{ProdSpec, TqProd};
/// let codec = TqProd::new(ProdSpec::orthogonal(64, 4, 3)).unwrap();
/// let x: Vec<f32> = (0..64).map(|i| (i as f32 * 0.51).cos()).collect();
/// let code = codec.encode(&x).unwrap();
/// let query = codec.prepare_query(&x).unwrap();
/// let estimate = codec.inner_product(&query, &code).unwrap();
/// let exact: f32 = x.iter().map(|v| v * v).sum();
/// assert!((estimate - exact).abs() < 0.1 * exact);
/// ```
#[derive(Clone, Debug)]
pub struct TqProd {
    spec: ProdSpec,
    mse: TqMse,
    sketch: QjlSketch,
}

impl TqProd {
    /// Builds the MSE stage and the sketch.
    pub fn new(spec: ProdSpec) -> Result<Self, CodecError> {
        if !(2..=9).contains(&spec.bits) {
            return Err(CodecError::UnsupportedBits {
                bits: spec.bits,
                supported: "2..=9",
            });
        }
        if spec.sketch.dim != spec.dim {
            return Err(CodecError::InvalidConfig(
                "the QJL sketch dimension must equal the vector dimension",
            ));
        }
        let mse = TqMse::new(MseSpec {
            dim: spec.dim,
            bits: spec.bits - 1,
            rotation: spec.rotation,
            seed: spec.seed,
            norm_correction: spec.norm_correction,
        })?;
        let sketch = QjlSketch::new(spec.sketch)?;
        Ok(Self { spec, mse, sketch })
    }

    /// The spec this codec was built from.
    pub fn spec(&self) -> ProdSpec {
        self.spec
    }

    /// The MSE stage.
    pub fn mse(&self) -> &TqMse {
        &self.mse
    }

    /// The QJL sketch.
    pub fn sketch(&self) -> &QjlSketch {
        &self.sketch
    }

    /// Packed sign words per vector.
    pub fn sign_words_per_vector(&self) -> usize {
        self.sketch.words()
    }

    /// Bytes stored per vector: MSE words, f16 norm, sign words, f16 `γ`.
    pub fn bytes_per_vector(&self) -> usize {
        self.mse.bytes_per_vector() + 4 * self.sign_words_per_vector() + 2
    }

    /// Encodes `x` into the MSE words and sign words; returns `(norm, γ)`. Allocation-free.
    pub fn encode_into(
        &self,
        x: &[f32],
        scratch: &mut CodecScratch,
        mse_words: &mut [u32],
        signs: &mut [u32],
    ) -> Result<(f16, f16), CodecError> {
        if signs.len() != self.sign_words_per_vector() {
            return Err(CodecError::LengthMismatch {
                what: "sign words",
                expected: self.sign_words_per_vector(),
                actual: signs.len(),
            });
        }
        let norm = self.mse.encode_rotated(x, scratch, mse_words)?;
        let n = norm.to_f32();
        let centroids = self.mse.codebook().centroids_f32();
        // A zero vector has norm 0, so its residual is all of Π·x (itself zero or below f16).
        for ((r, &x_rot), &c) in scratch
            .residual
            .iter_mut()
            .zip(&scratch.rotated)
            .zip(&scratch.codes)
        {
            *r = x_rot - n * centroids[c as usize];
        }
        let gamma = self
            .sketch
            .encode(&scratch.residual, &mut scratch.sketch, signs)?;
        if gamma > f16::MAX.to_f32() {
            return Err(CodecError::NormOutOfRange { norm: gamma });
        }
        Ok((norm, f16::from_f32(gamma)))
    }

    /// Encodes one vector into an owned [`ProdCode`].
    pub fn encode(&self, x: &[f32]) -> Result<ProdCode, CodecError> {
        let mut scratch = CodecScratch::new(self.spec.dim);
        let mut words = vec![0u32; self.mse.words_per_vector()];
        let mut signs = vec![0u32; self.sign_words_per_vector()];
        let (norm, gamma) = self.encode_into(x, &mut scratch, &mut words, &mut signs)?;
        Ok(ProdCode {
            mse: MseCode { words, norm },
            signs,
            gamma,
        })
    }

    /// Decodes into `out` (original domain): `Πᵀ·(norm·c[idx] + α·γ·s·Sᵀz)`. Allocation-free.
    pub fn decode_into(
        &self,
        mse_words: &[u32],
        norm: f16,
        signs: &[u32],
        gamma: f16,
        scratch: &mut CodecScratch,
        out: &mut [f32],
    ) -> Result<(), CodecError> {
        let mut rotated = std::mem::take(&mut scratch.rotated);
        let mut correction = std::mem::take(&mut scratch.residual);
        let result = self
            .mse
            .decode_rotated_into(mse_words, norm, scratch, &mut rotated)
            .and_then(|()| {
                self.sketch.reconstruct(
                    signs,
                    gamma.to_f32(),
                    &mut scratch.sketch,
                    &mut correction,
                )?;
                for (r, c) in rotated.iter_mut().zip(&correction) {
                    *r += c;
                }
                Ok(self.mse.rotation().apply_inverse(&rotated, out)?)
            });
        scratch.rotated = rotated;
        scratch.residual = correction;
        result
    }

    /// Decodes an owned [`ProdCode`].
    pub fn decode(&self, code: &ProdCode) -> Result<Vec<f32>, CodecError> {
        let mut scratch = CodecScratch::new(self.spec.dim);
        let mut out = vec![0.0; self.spec.dim];
        self.decode_into(
            &code.mse.words,
            code.mse.norm,
            &code.signs,
            code.gamma,
            &mut scratch,
            &mut out,
        )?;
        Ok(out)
    }

    /// Prepares a query: `Π·q` and `S·Π·q`, once per query and head.
    pub fn prepare_query(&self, query: &[f32]) -> Result<PreparedQuery, CodecError> {
        let dim = self.spec.dim;
        let mut rotated = vec![0.0; dim];
        self.mse.rotate_query(query, &mut rotated)?;
        let mut projected = vec![0.0; dim];
        self.sketch.project(&rotated, &mut projected)?;
        Ok(PreparedQuery { rotated, projected })
    }

    /// The unbiased estimate `⟨q, x̂⟩ = norm·⟨Πq, c[idx]⟩ + α·γ·s·⟨SΠq, z⟩`, without decoding.
    pub fn inner_product(&self, query: &PreparedQuery, code: &ProdCode) -> Result<f32, CodecError> {
        let dim = self.spec.dim;
        if query.rotated.len() != dim || query.projected.len() != dim {
            return Err(CodecError::LengthMismatch {
                what: "prepared query",
                expected: dim,
                actual: query.rotated.len().min(query.projected.len()),
            });
        }
        let mut scratch = CodecScratch::new(dim);
        let mut rotated = vec![0.0; dim];
        self.mse
            .decode_rotated_into(&code.mse.words, code.mse.norm, &mut scratch, &mut rotated)?;
        let mse_part = dot(&query.rotated, &rotated);
        let qjl_part =
            self.sketch
                .estimate_inner_product(&query.projected, &code.signs, code.gamma.to_f32());
        Ok(mse_part + qjl_part)
    }
}
