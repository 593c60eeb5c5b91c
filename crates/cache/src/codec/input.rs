//! Validation of vectors handed to a codec, and the norm every codec needs.

use crate::codec::CodecError;

/// Checks length and finiteness and returns the Euclidean norm.
///
/// The sum runs over eight fixed lanes so it vectorizes and gives the same bits on every call,
/// whatever the thread count of the caller.
pub(crate) fn checked_norm(x: &[f32], dim: usize) -> Result<f32, CodecError> {
    if x.len() != dim {
        return Err(CodecError::LengthMismatch {
            what: "input vector",
            expected: dim,
            actual: x.len(),
        });
    }
    let mut lanes = [0.0f32; 8];
    let mut chunks = x.chunks_exact(8);
    for chunk in &mut chunks {
        for (lane, &v) in lanes.iter_mut().zip(chunk) {
            *lane += v * v;
        }
    }
    for (lane, &v) in lanes.iter_mut().zip(chunks.remainder()) {
        *lane += v * v;
    }
    let sum = lanes.iter().sum::<f32>();
    if !sum.is_finite() {
        // Only now pay for the scan that names the culprit; a finite sum means finite inputs
        // unless squares overflowed, which the scan also reports.
        if let Some((index, &value)) = x.iter().enumerate().find(|(_, v)| !v.is_finite()) {
            return Err(CodecError::NonFinite { index, value });
        }
        return Err(CodecError::NormOutOfRange {
            norm: f32::INFINITY,
        });
    }
    Ok(sum.sqrt())
}

/// Dot product with the same fixed eight-lane order as [`checked_norm`].
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 8];
    let mut ca = a.chunks_exact(8);
    let mut cb = b.chunks_exact(8);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for i in 0..8 {
            lanes[i] += x[i] * y[i];
        }
    }
    for (lane, (&x, &y)) in lanes
        .iter_mut()
        .zip(ca.remainder().iter().zip(cb.remainder()))
    {
        *lane += x * y;
    }
    lanes.iter().sum()
}
