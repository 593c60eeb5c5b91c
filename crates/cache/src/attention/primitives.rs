//! The per-token inner loops of the fused kernel, written once in plain Rust.
//!
//! Each function sums in a fixed order (eight lanes, then the lanes in order), so results are
//! identical across calls and thread counts. These are the scalar reference of the vector
//! paths in [`simd`](super::simd), which are tested against them: most vector paths sum in
//! another order, so they agree within the f32 rounding bound, not bit for bit; plain records
//! score in [`lane8_dot`]'s order on every path, bit for bit.

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

/// `Σ a_i·b_i` in the order plain (f16/f32) records are scored on **every** instruction set,
/// so an uncompressed cache gives the same attention bits on every machine:
///
/// - eight lanes, lane `l` summing `a_j·b_j` for `j ≡ l (mod 8)` below `8·⌊n/8⌋` with one fused
///   multiply-add per term, in increasing `j`;
/// - the lanes reduced as `((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7))` (AVX2's
///   horizontal adds);
/// - the `n mod 8` trailing products added one at a time, each multiplied then added.
///
/// Why one order matters: the models quantize activations to 8 bits, and a last-bit change of
/// an attention score flips some of those roundings; over a whole text that moved SmolLM2's f16
/// perplexity by 0.17% between AVX2 and AVX-512 (session 32), as much as the reference engine's
/// own kernels differ. Eight lanes is the width scalar, NEON (two registers) and AVX2 share;
/// AVX-512 keeps its width by carrying two tokens per register.
///
/// ```
/// use tq_cache::attention::primitives::lane8_dot;
/// let a: Vec<f32> = (0..10).map(|i| i as f32).collect();
/// assert_eq!(lane8_dot(&a, &a), 285.0);
/// ```
#[inline]
pub fn lane8_dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let full = n / 8 * 8;
    let mut lanes = [0.0f32; 8];
    for (x, y) in a[..full].chunks_exact(8).zip(b[..full].chunks_exact(8)) {
        for l in 0..8 {
            lanes[l] = x[l].mul_add(y[l], lanes[l]);
        }
    }
    lane8_finish(&lanes, a, b)
}

/// The end of [`lane8_dot`] once its eight lanes are summed (by whichever instruction set): the
/// lanes reduced in AVX2's horizontal-add tree, then the `n mod 8` trailing products of `a` and
/// `b` added one at a time. One definition, so the vector paths that hold their lanes in
/// registers (NEON's two) end exactly as the scalar loop does.
#[inline]
pub(crate) fn lane8_finish(lanes: &[f32; 8], a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let mut s = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3]))
        + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
    for j in n / 8 * 8..n {
        s += a[j] * b[j];
    }
    s
}

/// `y += alpha·x`.
#[inline]
pub fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
    // One rounding per element, as the vector paths' fused multiply-adds.
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi = alpha.mul_add(*xi, *yi);
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

/// `⟨w, z⟩` for a packed ±1 sign vector `z` (bit `i` set = `+1`), over eight fixed lanes.
#[inline]
pub fn signed_dot(w: &[f32], signs: &[u32]) -> f32 {
    let mut lanes = [0.0f32; 8];
    for (i, &x) in w.iter().enumerate() {
        let bit = (signs[i / 32] >> (i % 32)) & 1;
        lanes[i % 8] += if bit == 1 { x } else { -x };
    }
    ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5]))
        + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]))
}

/// `acc += w·z` for a packed ±1 sign vector `z`.
#[inline]
pub fn accumulate_signs(w: f32, signs: &[u32], acc: &mut [f32]) {
    for (i, a) in acc.iter_mut().enumerate() {
        let bit = (signs[i / 32] >> (i % 32)) & 1;
        *a += if bit == 1 { w } else { -w };
    }
}

/// Converts f16 values to f32.
#[inline]
pub fn f16_to_f32(halves: &[f16], out: &mut [f32]) {
    for (o, h) in out.iter_mut().zip(halves) {
        *o = h.to_f32();
    }
}

/// An 8-bit window copy as f32 bit patterns: `out[j] = (s · c_j).to_bits()`, `c_j` the signed
/// byte `j` of `record` (little-endian words) — exact products.
#[inline]
pub fn q8_to_f32_bits(record: &[u32], step: f32, out: &mut [u32]) {
    q8_to_f32_bits_from(record, step, out, 0);
}

/// [`q8_to_f32_bits`] for codes `from..` only (a vector path's tail): four at a time, a loop
/// of fixed-width steps the compiler vectorizes, then the partial last word.
#[inline]
pub fn q8_to_f32_bits_from(record: &[u32], step: f32, out: &mut [u32], from: usize) {
    debug_assert!(from.is_multiple_of(4));
    let out = &mut out[from..];
    let record = &record[from / 4..];
    let whole = out.len() / 4;
    let mut quads = out.chunks_exact_mut(4);
    for (quad, word) in (&mut quads).zip(record) {
        for (o, c) in quad.iter_mut().zip(word.to_le_bytes()) {
            *o = (f32::from(c as i8) * step).to_bits();
        }
    }
    let tail = quads.into_remainder();
    if let Some(word) = record.get(whole) {
        for (o, c) in tail.iter_mut().zip(word.to_le_bytes()) {
            *o = (f32::from(c as i8) * step).to_bits();
        }
    }
}

/// The largest value (`-∞` for an empty slice).
#[inline]
pub fn max(values: &[f32]) -> f32 {
    values.iter().copied().fold(f32::NEG_INFINITY, f32::max)
}

/// Replaces every value `x` by `exp(x − shift)` ([`exp_poly`], the vector paths' algorithm,
/// so every instruction set gives the same bits) and returns their sum over eight fixed
/// lanes: value `i` goes to lane `i mod 8`, in order.
#[inline]
pub fn exp_shifted_sum(values: &mut [f32], shift: f32) -> f32 {
    let mut lanes = [0.0f32; 8];
    for (i, v) in values.iter_mut().enumerate() {
        *v = exp_poly(*v - shift);
        lanes[i % 8] += *v;
    }
    ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5]))
        + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]))
}

/// Lower bound of the polynomial `exp`'s domain: below it the result is flushed to 0
/// (`exp(−87.336) ≈ 1.18e-38`, the smallest normal f32).
pub const EXP_LOW: f32 = -87.336_55;
/// Upper clamp of the polynomial `exp`'s argument.
pub const EXP_HIGH: f32 = 88.0;
/// `log2(e)`.
pub const EXP_LOG2E: f32 = std::f32::consts::LOG2_E;
/// `ln 2` split in two (Cody–Waite): the high part has few bits so `n·EXP_LN2_HI` is exact.
pub const EXP_LN2_HI: f32 = 0.693_359_4;
/// The low part of `ln 2` (negative).
pub const EXP_LN2_LO: f32 = -2.121_944_4e-4;
/// Polynomial coefficients (Cephes `expf`), highest degree first.
pub const EXP_POLY: [f32; 6] = [
    1.987_569_1e-4,
    1.398_2e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    1.666_666_5e-1,
    0.5,
];

/// `exp(x)` by the vector paths' algorithm in scalar form: `n = round(x·log2 e)`,
/// `r = x − n·ln 2` (two FMA steps), `exp(r) ≈ 1 + r + r²·P(r)`, times `2^n` through the
/// exponent bits; 0 below [`EXP_LOW`], argument clamped at [`EXP_HIGH`]. NaN is not handled.
pub fn exp_poly(x: f32) -> f32 {
    if x < EXP_LOW {
        return 0.0;
    }
    let x = x.min(EXP_HIGH);
    let n = (x * EXP_LOG2E).round_ties_even();
    let r = (-n).mul_add(EXP_LN2_HI, x);
    let r = (-n).mul_add(EXP_LN2_LO, r);
    let mut p = EXP_POLY[0];
    for &c in &EXP_POLY[1..] {
        p = p.mul_add(r, c);
    }
    let y = p.mul_add(r * r, r + 1.0);
    let scale = f32::from_bits((((n as i32) + 127) as u32) << 23);
    y * scale
}

/// f16 bits to f32 with integer operations only: shift exponent and mantissa into place and
/// multiply by `2^112` (which also normalizes subnormals exactly), then restore infinities and
/// NaNs and the sign.
pub fn f16_bits_to_f32(bits: u16) -> f32 {
    let h = u32::from(bits);
    let magnitude = (h & 0x7FFF) << 13;
    let mut value = (f32::from_bits(magnitude) * f32::from_bits(0x7780_0000)).to_bits();
    if h & 0x7C00 == 0x7C00 {
        value = magnitude | 0x7F80_0000;
    }
    f32::from_bits(value | ((h & 0x8000) << 16))
}
