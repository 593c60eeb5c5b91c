//! 8-bit window copies: absmax int8 of the Hadamard-rotated vector, one f16 step per token.
//!
//! A recent window is read by every query that follows, so its copies must be nearly exact:
//! the window exists because the codes of recent tokens cost too much. Keys are not spread
//! evenly over their coordinates (RoPE planes carry most of the energy), and absmax int8 in the
//! stored coordinates measured that: on SmolLM2 a 56-token 8-bit window cost 0.0011 of KL
//! divergence more than f16 copies. A fixed randomized Hadamard rotation first spreads every
//! coordinate's energy over all of them (the peak-to-RMS ratio of a rotated vector is that of
//! a Gaussian sample, about 2.5 at d = 64), which divides the error of a given step by the
//! square of the ratio it removes.
//!
//! Record: `ceil(d/4)` words, coordinate `j` of the rotated vector as a signed byte in byte
//! `j % 4` of word `j / 4`; one f16 step `s = max|Πx|/127`. Every rotated coordinate is within
//! `s/2` of `s·q_j` (up to the f16 rounding of `s`), so the decoded vector is within
//! `‖·‖₂ ≤ √d·s/2` of the input: `Π` is orthogonal.

use half::f16;
use tq_rotation::{Rotation, RotationKind};

use super::CodecError;

/// The seed of the window rotation ("TQ-WIN-8" in ASCII): fixed, so a saved cache's copies
/// decode the same way everywhere.
pub const Q8_ROTATION_SEED: u64 = 0x5451_2D57_494E_2D38;

/// The 8-bit window codec of dimension `d` (see the module docs).
#[derive(Clone, Debug)]
pub struct Q8Window {
    rotation: Rotation,
}

impl Q8Window {
    /// The codec for vectors of dimension `dim`.
    ///
    /// ```
    /// use tq_cache::codec::Q8Window;
    /// let codec = Q8Window::new(64).unwrap();
    /// let x: Vec<f32> = (0..64).map(|j| (j as f32 * 0.37).sin()).collect();
    /// let (mut record, mut rotated, mut back) = (vec![0u32; 16], vec![0.0; 64], vec![0.0; 64]);
    /// let step = codec.encode_into(&x, &mut rotated, &mut record).unwrap();
    /// codec.decode_into(&record, step, &mut rotated, &mut back);
    /// let error: f32 = x.iter().zip(&back).map(|(a, b)| (a - b) * (a - b)).sum::<f32>().sqrt();
    /// assert!(error <= 8.0 * step.to_f32() / 2.0 * 1.01);
    /// ```
    pub fn new(dim: usize) -> Result<Self, CodecError> {
        Ok(Self {
            rotation: Rotation::new(RotationKind::Hadamard, dim, Q8_ROTATION_SEED)?,
        })
    }

    /// Vector dimension.
    pub fn dim(&self) -> usize {
        self.rotation.dim()
    }

    /// The window rotation `Π` (a randomized Hadamard transform, seed [`Q8_ROTATION_SEED`]):
    /// what a kernel that scores copies elsewhere (the GPU) rotates its queries with.
    pub fn rotation(&self) -> &Rotation {
        &self.rotation
    }

    /// `u32` words per record.
    pub fn record_words(&self) -> usize {
        self.dim().div_ceil(4)
    }

    /// Encodes `x` (finite, length `d`) into `record` (`record_words` words) through the
    /// `rotated` buffer (length `d`); returns the step.
    pub fn encode_into(
        &self,
        x: &[f32],
        rotated: &mut [f32],
        record: &mut [u32],
    ) -> Result<f16, CodecError> {
        self.rotation.apply(x, rotated)?;
        // The copy is the only one of its token: it must decode to a vector every body codec
        // stores (a norm within the f16 range), or the token would be refused W tokens later,
        // when its codes are written. The decoded norm exceeds the input's by at most
        // √d·s·(1/2 + 127·2⁻¹¹) with s ≤ 1.001·‖x‖/127.
        let norm = super::checked_norm(rotated, self.dim())?;
        let growth = 1.0 + (self.dim() as f32).sqrt() * 0.5621 * 1.001 / 127.0;
        if norm * growth > f16::MAX.to_f32() {
            return Err(CodecError::NormOutOfRange { norm });
        }
        let absmax = rotated.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let step = f16::from_f32(absmax / 127.0);
        if step.is_infinite() {
            return Err(CodecError::NormOutOfRange { norm: absmax });
        }
        // A step that rounds below absmax/127 would map the largest coordinate past 127: the
        // clamp keeps it a valid code.
        let inverse = if step.to_f32() > 0.0 {
            1.0 / step.to_f32()
        } else {
            0.0
        };
        record.fill(0);
        for (j, v) in rotated.iter().enumerate() {
            let q = (v * inverse).round().clamp(-127.0, 127.0) as i8;
            record[j / 4] |= u32::from(q as u8) << (8 * (j % 4));
        }
        Ok(step)
    }

    /// `out = Π·x`: the coordinates the codes live in. A query rotated once scores copies
    /// without decoding them: `q·Πᵀ(s·c) = s·(Πq)·c`.
    pub fn rotate(&self, x: &[f32], out: &mut [f32]) -> Result<(), CodecError> {
        Ok(self.rotation.apply(x, out)?)
    }

    /// `out = Πᵀ·x`: a weighted sum of codes, accumulated in the rotated coordinates, back in
    /// the stored ones (one transform per output, not one per copy).
    pub fn rotate_back(&self, x: &[f32], out: &mut [f32]) -> Result<(), CodecError> {
        Ok(self.rotation.apply_inverse(x, out)?)
    }

    /// Code `j` of a record (a signed byte).
    #[inline]
    pub fn code(record: &[u32], j: usize) -> i8 {
        (record[j / 4] >> (8 * (j % 4))) as u8 as i8
    }

    /// Decodes `record` and its `step` into `out` (length `d`) through the `rotated` buffer:
    /// `out = Πᵀ·(s·q)`, with `s·q` exact in f32. Every kernel that reads these copies reads
    /// them through this function, so they all read the same values.
    pub fn decode_into(&self, record: &[u32], step: f16, rotated: &mut [f32], out: &mut [f32]) {
        let step = step.to_f32();
        for (j, r) in rotated.iter_mut().enumerate() {
            *r = f32::from(Self::code(record, j)) * step;
        }
        self.rotation
            .apply_inverse(rotated, out)
            .expect("window buffers have the codec's dimension");
    }
}
