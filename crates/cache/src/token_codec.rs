//! One codec interface for every way a stream of key or value vectors can be stored.
//!
//! Each token of a stream is a fixed-size record of `u32` words plus up to two f16 scales:
//!
//! | codec | record words | f16 scales |
//! |---|---|---|
//! | `f32` | `d` (the f32 bit patterns) | 0 |
//! | `f16` | `ceil(d/2)` (two halves per word, even index in the low half) | 0 |
//! | `mse` / `debiased-mse` (b bits) | `words_for(d, b)` packed codes | 1: the norm |
//! | `prod` (b bits) | `words_for(d, b−1)` codes, then `ceil(d/32)` sign words | 2: norm, `γ` |
//! | `mse` (b bits) over a [basis](crate::basis) | `words_for(d, b)`: each group's codes from a word boundary | 1: the norm |
//! | `q8` (window copies only) | `ceil(d/4)`: the rotated vector as signed bytes, index `j` in byte `j % 4` | 1: the step `s` |
//!
//! so the bytes a token costs are `4·record_words + 2·scales`, exactly.
//!
//! `q8` is the storage of a recent window's copies when the allocation asks for 8 bits
//! (`recent_dtype = "q8"`): absmax int8 of the Hadamard-rotated vector ([`Q8Window`]).

use half::f16;
use serde::{Deserialize, Serialize};

use crate::codec::{
    CodecError, CodecScratch, DebiasedMse, MseSpec, ProdSpec, Q8Window, TqMse, TqProd,
};
use crate::two_tier::{TwoTierCodec, TwoTierScratch};

/// How one stream (the keys or the values of one KV head of one layer) is stored.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "codec", rename_all = "kebab-case")]
pub enum CodecSpec {
    /// Uncompressed f32.
    F32 {
        /// Vector dimension.
        dim: usize,
    },
    /// IEEE half precision (the usual baseline cache).
    F16 {
        /// Vector dimension.
        dim: usize,
    },
    /// TQ_mse(b).
    Mse(MseSpec),
    /// TQ_prod(b).
    Prod(ProdSpec),
    /// TQ_mse(b) codes scored through the debiased estimator.
    DebiasedMse(MseSpec),
    /// Absmax int8 with one f16 step per token: the 8-bit storage of recent-window copies
    /// (not a body codec; see the module docs).
    Q8 {
        /// Vector dimension.
        dim: usize,
    },
}

impl CodecSpec {
    /// The vector dimension the spec encodes.
    pub fn dim(&self) -> usize {
        match self {
            CodecSpec::F32 { dim } | CodecSpec::F16 { dim } | CodecSpec::Q8 { dim } => *dim,
            CodecSpec::Mse(s) | CodecSpec::DebiasedMse(s) => s.dim,
            CodecSpec::Prod(s) => s.dim,
        }
    }
}

/// A built codec with the uniform record interface described in the module docs.
#[derive(Clone, Debug)]
pub enum TokenCodec {
    /// Uncompressed f32.
    F32 {
        /// Vector dimension.
        dim: usize,
    },
    /// Half precision.
    F16 {
        /// Vector dimension.
        dim: usize,
    },
    /// TQ_mse.
    Mse(TqMse),
    /// TQ_prod (boxed: it carries a rotation, a codebook handle and a sketch).
    Prod(Box<TqProd>),
    /// Debiased TQ_mse.
    DebiasedMse(DebiasedMse),
    /// Outlier channels and the rest, each with its own codec (boxed: it holds two codecs).
    TwoTier(Box<TwoTierCodec>),
    /// TQ_mse over a fitted data-aware basis (boxed: it holds the basis and a codec per
    /// group; see [`basis`](crate::basis)).
    Basis(Box<crate::basis::BasisCodec>),
    /// Absmax int8 of the rotated vector (window copies; see [`Q8Window`]).
    Q8(Box<Q8Window>),
}

impl TokenCodec {
    /// Builds the codec a spec describes.
    ///
    /// ```
    /// use tq_cache::{CodecSpec, TokenCodec};
    /// let codec = TokenCodec::new(&CodecSpec::F16 { dim: 64 }).unwrap();
    /// assert_eq!(codec.bytes_per_token(), 128);
    /// ```
    pub fn new(spec: &CodecSpec) -> Result<Self, CodecError> {
        Ok(match *spec {
            CodecSpec::F32 { dim } => TokenCodec::F32 { dim },
            CodecSpec::F16 { dim } => TokenCodec::F16 { dim },
            CodecSpec::Mse(s) => TokenCodec::Mse(TqMse::new(s)?),
            CodecSpec::Prod(s) => TokenCodec::Prod(Box::new(TqProd::new(s)?)),
            CodecSpec::DebiasedMse(s) => TokenCodec::DebiasedMse(DebiasedMse::new(s)?),
            CodecSpec::Q8 { dim } => TokenCodec::Q8(Box::new(Q8Window::new(dim)?)),
        })
    }

    /// The spec this codec was built from (`None` for a two-tier codec, whose tiers each have
    /// one and whose channel split is data).
    pub fn spec(&self) -> Option<CodecSpec> {
        Some(match self {
            TokenCodec::F32 { dim } => CodecSpec::F32 { dim: *dim },
            TokenCodec::F16 { dim } => CodecSpec::F16 { dim: *dim },
            TokenCodec::Q8(c) => CodecSpec::Q8 { dim: c.dim() },
            TokenCodec::Mse(c) => CodecSpec::Mse(c.spec()),
            TokenCodec::Prod(c) => CodecSpec::Prod(c.spec()),
            TokenCodec::DebiasedMse(c) => CodecSpec::DebiasedMse(c.codec().spec()),
            TokenCodec::TwoTier(_) | TokenCodec::Basis(_) => return None,
        })
    }

    /// Vector dimension.
    pub fn dim(&self) -> usize {
        match self {
            TokenCodec::F32 { dim } | TokenCodec::F16 { dim } => *dim,
            TokenCodec::Q8(c) => c.dim(),
            TokenCodec::Mse(c) => c.dim(),
            TokenCodec::DebiasedMse(c) => c.codec().dim(),
            TokenCodec::Prod(c) => c.spec().dim,
            TokenCodec::TwoTier(c) => c.head_dim(),
            TokenCodec::Basis(c) => c.dim(),
        }
    }

    /// `u32` words per token record.
    pub fn record_words(&self) -> usize {
        match self {
            TokenCodec::F32 { dim } => *dim,
            TokenCodec::F16 { dim } => dim.div_ceil(2),
            TokenCodec::Q8(c) => c.record_words(),
            TokenCodec::Mse(c) => c.words_per_vector(),
            TokenCodec::DebiasedMse(c) => c.codec().words_per_vector(),
            TokenCodec::Prod(c) => c.mse().words_per_vector() + c.sign_words_per_vector(),
            TokenCodec::TwoTier(c) => c.record_words(),
            TokenCodec::Basis(c) => c.record_words(),
        }
    }

    /// f16 scales per token (norms and residual norms).
    pub fn scales_per_token(&self) -> usize {
        match self {
            TokenCodec::F32 { .. } | TokenCodec::F16 { .. } => 0,
            TokenCodec::Mse(_)
            | TokenCodec::DebiasedMse(_)
            | TokenCodec::Basis(_)
            | TokenCodec::Q8(_) => 1,
            TokenCodec::Prod(_) => 2,
            TokenCodec::TwoTier(c) => c.scales_per_token(),
        }
    }

    /// Bytes one token costs: `4·record_words + 2·scales_per_token`.
    pub fn bytes_per_token(&self) -> usize {
        4 * self.record_words() + 2 * self.scales_per_token()
    }

    /// Stored bits per coordinate, everything included (`8·bytes_per_token / d`).
    pub fn bits_per_value(&self) -> f64 {
        8.0 * self.bytes_per_token() as f64 / self.dim() as f64
    }

    /// Encodes `x` into one record and its scales. Allocation-free.
    pub fn encode_into(
        &self,
        x: &[f32],
        scratch: &mut CodecScratch,
        record: &mut [u32],
        scales: &mut [f16],
    ) -> Result<(), CodecError> {
        self.check_record(record, scales)?;
        match self {
            TokenCodec::F32 { dim } => {
                check_finite(x, *dim)?;
                for (w, v) in record.iter_mut().zip(x) {
                    *w = v.to_bits();
                }
            }
            TokenCodec::F16 { dim } => {
                check_finite(x, *dim)?;
                if let Some(&too_big) = x.iter().find(|v| v.abs() > f16::MAX.to_f32()) {
                    return Err(CodecError::NormOutOfRange { norm: too_big });
                }
                for (w, pair) in record.iter_mut().zip(x.chunks(2)) {
                    let lo = f16::from_f32(pair[0]).to_bits();
                    let hi = pair.get(1).map_or(0, |v| f16::from_f32(*v).to_bits());
                    *w = u32::from(lo) | (u32::from(hi) << 16);
                }
            }
            TokenCodec::Q8(c) => {
                check_finite(x, c.dim())?;
                scratch.rotated.resize(c.dim(), 0.0);
                scales[0] = c.encode_into(x, &mut scratch.rotated, record)?;
            }
            TokenCodec::Mse(c) => scales[0] = c.encode_into(x, scratch, record)?,
            TokenCodec::DebiasedMse(c) => scales[0] = c.codec().encode_into(x, scratch, record)?,
            TokenCodec::Prod(c) => {
                let (words, signs) = record.split_at_mut(c.mse().words_per_vector());
                let (norm, gamma) = c.encode_into(x, scratch, words, signs)?;
                scales[0] = norm;
                scales[1] = gamma;
            }
            TokenCodec::TwoTier(c) => {
                let tiers = two_tier_scratch(scratch, c);
                c.encode_into(x, tiers, record, scales)?;
            }
            TokenCodec::Basis(c) => scales[0] = c.encode_into(x, scratch, record)?,
        }
        Ok(())
    }

    /// Decodes one record into `out` (original domain). Allocation-free.
    ///
    /// For debiased MSE this is the plain TQ_mse reconstruction: the debiasing factor applies
    /// to inner products, not to the stored vector.
    pub fn decode_into(
        &self,
        record: &[u32],
        scales: &[f16],
        scratch: &mut CodecScratch,
        out: &mut [f32],
    ) -> Result<(), CodecError> {
        self.check_record(record, scales)?;
        if out.len() != self.dim() {
            return Err(CodecError::LengthMismatch {
                what: "decoded vector",
                expected: self.dim(),
                actual: out.len(),
            });
        }
        match self {
            TokenCodec::F32 { .. } => {
                for (o, w) in out.iter_mut().zip(record) {
                    *o = f32::from_bits(*w);
                }
            }
            TokenCodec::F16 { .. } => {
                for (i, o) in out.iter_mut().enumerate() {
                    let w = record[i / 2];
                    let half = if i % 2 == 0 { w & 0xFFFF } else { w >> 16 };
                    *o = f16::from_bits(half as u16).to_f32();
                }
            }
            TokenCodec::Q8(c) => {
                scratch.rotated.resize(c.dim(), 0.0);
                c.decode_into(record, scales[0], &mut scratch.rotated, out);
            }
            TokenCodec::Mse(c) => c.decode_into(record, scales[0], scratch, out)?,
            TokenCodec::DebiasedMse(c) => c.codec().decode_into(record, scales[0], scratch, out)?,
            TokenCodec::Prod(c) => {
                let (words, signs) = record.split_at(c.mse().words_per_vector());
                c.decode_into(words, scales[0], signs, scales[1], scratch, out)?;
            }
            TokenCodec::TwoTier(c) => {
                let tiers = two_tier_scratch(scratch, c);
                c.decode_into(record, scales, tiers, out)?;
            }
            TokenCodec::Basis(c) => c.decode_into(record, scales[0], scratch, out)?,
        }
        Ok(())
    }

    /// The factor inner products against this stream are multiplied by: `1/(1 − D_mse)` for
    /// debiased MSE, 1 otherwise.
    pub fn score_correction(&self) -> f32 {
        match self {
            TokenCodec::DebiasedMse(c) => c.correction(),
            _ => 1.0,
        }
    }

    fn check_record(&self, record: &[u32], scales: &[f16]) -> Result<(), CodecError> {
        if record.len() != self.record_words() {
            return Err(CodecError::LengthMismatch {
                what: "token record",
                expected: self.record_words(),
                actual: record.len(),
            });
        }
        if scales.len() != self.scales_per_token() {
            return Err(CodecError::LengthMismatch {
                what: "token scales",
                expected: self.scales_per_token(),
                actual: scales.len(),
            });
        }
        Ok(())
    }
}

fn check_finite(x: &[f32], dim: usize) -> Result<(), CodecError> {
    if x.len() != dim {
        return Err(CodecError::LengthMismatch {
            what: "input vector",
            expected: dim,
            actual: x.len(),
        });
    }
    match x.iter().enumerate().find(|(_, v)| !v.is_finite()) {
        Some((index, &value)) => Err(CodecError::NonFinite { index, value }),
        None => Ok(()),
    }
}

/// The two-tier buffers inside `scratch`, (re)built when missing or sized for another split
/// (the keys and values of one head may split differently).
fn two_tier_scratch<'a>(
    scratch: &'a mut CodecScratch,
    codec: &TwoTierCodec,
) -> &'a mut TwoTierScratch {
    let tiers = scratch
        .tiers
        .get_or_insert_with(|| Box::new(TwoTierScratch::new(codec)));
    if !tiers.fits(codec) {
        **tiers = TwoTierScratch::new(codec);
    }
    tiers
}
