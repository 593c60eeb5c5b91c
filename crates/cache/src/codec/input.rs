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

/// Dot product with the same fixed eight-lane order as [`checked_norm`]; on a CPU with AVX2
/// the same body compiled for it (one 8-lane register where the baseline takes two: a basis
/// projects every query through `rank` of these per head and step), the same bits.
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 was detected at run time just above.
        return unsafe { dot_avx2(a, b) };
    }
    dot_body(a, b)
}

/// [`dot_body`] compiled for AVX2.
///
/// # Safety
/// AVX2 must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    dot_body(a, b)
}

/// The dot product's loop: plain multiplications and additions (never fused) in eight fixed
/// lanes, so every compilation of it gives the same bits.
#[inline(always)]
fn dot_body(a: &[f32], b: &[f32]) -> f32 {
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

#[cfg(test)]
mod tests {
    /// The AVX2 copy gives the baseline's bits, lengths 0 to 200 (whole chunks of 8 and
    /// remainders), values over many magnitudes (so a reordered or fused sum would differ).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_avx2_dot_gives_the_baseline_bits() {
        if !std::arch::is_x86_feature_detected!("avx2") {
            return;
        }
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let mantissa = (state % 2_000_001) as f32 / 1_000_000.0 - 1.0;
            mantissa * 2f32.powi((state >> 40) as i32 % 24 - 12)
        };
        for len in 0..=200 {
            for _ in 0..20 {
                let a: Vec<f32> = (0..len).map(|_| next()).collect();
                let b: Vec<f32> = (0..len).map(|_| next()).collect();
                // SAFETY: AVX2 was detected above.
                let fast = unsafe { super::dot_avx2(&a, &b) };
                assert_eq!(
                    fast.to_bits(),
                    super::dot_body(&a, &b).to_bits(),
                    "len {len}"
                );
            }
        }
    }
}
