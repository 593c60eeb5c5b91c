//! The per-token inner loops of the fused kernel, written once in plain Rust.
//!
//! Each function sums in a fixed order (eight lanes, then the lanes in order), so results are
//! identical across calls and thread counts; the SIMD paths must reproduce these functions.

use half::f16;

/// `Σ a_i·b_i` over eight fixed lanes.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
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
    ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5]))
        + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]))
}

/// `y += alpha·x`.
#[inline]
pub fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi += alpha * xi;
    }
}

/// Unpacks `out.len()` b-bit codes from `words` and writes their centroids.
#[inline]
pub fn dequantize_codes(words: &[u32], bits: u8, centroids: &[f32], out: &mut [f32]) {
    let b = bits as usize;
    let mask = (1u64 << b) - 1;
    let mut acc: u64 = 0;
    let mut available = 0usize;
    let mut next = 0usize;
    for o in out.iter_mut() {
        if available < b {
            acc |= u64::from(words[next]) << available;
            next += 1;
            available += 32;
        }
        *o = centroids[(acc & mask) as usize];
        acc >>= b;
        available -= b;
    }
}

/// Unpacks `out.len()` f16 values stored two per word (even index in the low half).
#[inline]
pub fn decode_f16_pairs(words: &[u32], out: &mut [f32]) {
    for (pair, &w) in out.chunks_mut(2).zip(words) {
        pair[0] = f16::from_bits((w & 0xFFFF) as u16).to_f32();
        if let Some(hi) = pair.get_mut(1) {
            *hi = f16::from_bits((w >> 16) as u16).to_f32();
        }
    }
}

/// Reinterprets f32 bit patterns.
#[inline]
pub fn decode_f32_words(words: &[u32], out: &mut [f32]) {
    for (o, &w) in out.iter_mut().zip(words) {
        *o = f32::from_bits(w);
    }
}

/// Byte tables for `⟨v, z⟩` with `z ∈ {±1}^m` packed as bits (1 = +1): entry `[k][byte]` is
/// `Σ_{i<8} ±v[8k+i]` with the signs of `byte`'s bits, so a sketch costs `m/8` look-ups.
pub fn sign_byte_tables(v: &[f32], tables: &mut Vec<f32>) {
    let bytes = v.len().div_ceil(8);
    tables.clear();
    tables.resize(bytes * 256, 0.0);
    for k in 0..bytes {
        let chunk = &v[8 * k..(8 * k + 8).min(v.len())];
        let table = &mut tables[k * 256..(k + 1) * 256];
        for (byte, entry) in table.iter_mut().enumerate() {
            let mut sum = 0.0f32;
            for (i, &x) in chunk.iter().enumerate() {
                if byte >> i & 1 == 1 {
                    sum += x;
                } else {
                    sum -= x;
                }
            }
            *entry = sum;
        }
    }
}

/// `⟨v, z⟩` from [`sign_byte_tables`] and the packed sign words of one sketch.
#[inline]
pub fn signed_sum(tables: &[f32], signs: &[u32]) -> f32 {
    let bytes = tables.len() / 256;
    let mut sum = 0.0f32;
    for k in 0..bytes {
        let byte = (signs[k / 4] >> (8 * (k % 4))) & 0xFF;
        sum += tables[k * 256 + byte as usize];
    }
    sum
}

/// `acc += w·z` for a packed ±1 sign vector `z`.
#[inline]
pub fn accumulate_signs(w: f32, signs: &[u32], acc: &mut [f32]) {
    for (i, a) in acc.iter_mut().enumerate() {
        let bit = (signs[i / 32] >> (i % 32)) & 1;
        *a += if bit == 1 { w } else { -w };
    }
}
