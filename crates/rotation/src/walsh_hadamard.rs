//! The in-place fast Walsh–Hadamard transform, for f32 (the hot path) and f64 (the dense
//! reference matrix).

use std::ops::{Add, Mul, Sub};

/// The arithmetic the transform and the sign multiplications need.
pub(crate) trait Scalar:
    Copy + Add<Output = Self> + Sub<Output = Self> + Mul<Output = Self> + Send + Sync
{
    /// Converts an f64 constant (a sign or a normalization) to this type.
    fn from_f64(value: f64) -> Self;
}

impl Scalar for f32 {
    #[inline(always)]
    fn from_f64(value: f64) -> Self {
        value as f32
    }
}

impl Scalar for f64 {
    #[inline(always)]
    fn from_f64(value: f64) -> Self {
        value
    }
}

/// One butterfly level: for every block of `2h`, `(a, b) ↦ (a + b, a − b)` between its halves.
#[inline(always)]
fn butterflies<T: Scalar>(x: &mut [T], h: usize) {
    for block in x.chunks_exact_mut(2 * h) {
        let (low, high) = block.split_at_mut(h);
        for (a, b) in low.iter_mut().zip(high.iter_mut()) {
            let (sum, difference) = (*a + *b, *a - *b);
            *a = sum;
            *b = difference;
        }
    }
}

/// The first three levels (h = 1, 2, 4) on one block of eight, written out so the compiler
/// sees straight-line code it can keep in registers instead of three short loops.
#[inline(always)]
fn hadamard8<T: Scalar>(v: &mut [T]) {
    let [a0, a1, a2, a3, a4, a5, a6, a7] = [v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]];
    let (b0, b1, b2, b3) = (a0 + a1, a0 - a1, a2 + a3, a2 - a3);
    let (b4, b5, b6, b7) = (a4 + a5, a4 - a5, a6 + a7, a6 - a7);
    let (c0, c1, c2, c3) = (b0 + b2, b1 + b3, b0 - b2, b1 - b3);
    let (c4, c5, c6, c7) = (b4 + b6, b5 + b7, b4 - b6, b5 - b7);
    v[0] = c0 + c4;
    v[1] = c1 + c5;
    v[2] = c2 + c6;
    v[3] = c3 + c7;
    v[4] = c0 - c4;
    v[5] = c1 - c5;
    v[6] = c2 - c6;
    v[7] = c3 - c7;
}

/// Two butterfly levels (`h` and `2h`) in one sweep: for every block of `4h`, the quarters
/// `(a, b, c, d)` become `(a+b+c+d, a−b+c−d, a+b−c−d, a−b−c+d)`. Half the loads and stores
/// of two single levels, which is what bounds the transform.
#[inline(always)]
fn butterflies2<T: Scalar>(x: &mut [T], h: usize) {
    for block in x.chunks_exact_mut(4 * h) {
        let (ab, cd) = block.split_at_mut(2 * h);
        let (a, b) = ab.split_at_mut(h);
        let (c, d) = cd.split_at_mut(h);
        for i in 0..h {
            let (s, t, u, v) = (a[i] + b[i], a[i] - b[i], c[i] + d[i], c[i] - d[i]);
            a[i] = s + u;
            b[i] = t + v;
            c[i] = s - u;
            d[i] = t - v;
        }
    }
}

/// The unnormalized Walsh–Hadamard transform `x ↦ H·x` in place (`H` has ±1 entries, in
/// Sylvester order); `x.len()` must be a power of two. Applying it twice multiplies by
/// `x.len()`.
pub(crate) fn fwht<T: Scalar>(x: &mut [T]) {
    let n = x.len();
    let mut h = 1;
    if n >= 8 {
        for block in x.chunks_exact_mut(8) {
            hadamard8(block);
        }
        h = 8;
    }
    while 4 * h <= n {
        butterflies2(x, h);
        h *= 4;
    }
    if h < n {
        butterflies(x, h);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sylvester's Hadamard entry: `H_ij = (−1)^popcount(i & j)`.
    fn sylvester(i: usize, j: usize) -> f64 {
        if (i & j).count_ones().is_multiple_of(2) {
            1.0
        } else {
            -1.0
        }
    }

    /// The fast transform must equal the definition on every basis vector, for every size
    /// from the trivial one through the sizes that use the unrolled first levels.
    #[test]
    fn fast_transform_equals_sylvester_matrix() {
        for log in 0..=7 {
            let n = 1usize << log;
            for i in 0..n {
                let mut e = vec![0.0f64; n];
                e[i] = 1.0;
                fwht(&mut e);
                for (j, value) in e.iter().enumerate() {
                    assert_eq!(*value, sylvester(j, i), "n={n} column={i} row={j}");
                }
            }
        }
    }
}
