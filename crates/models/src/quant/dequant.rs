//! Dequantization: blocks to f32, bit-exact with ggml's reference `dequantize_row_*`.
//!
//! Every value is computed with the same f32 operations in the same order as ggml's C
//! (`ggml-quants.c`), with no fused multiply-add, so a row dequantizes to the same bits.

use half::f16;

use super::error::QuantError;
use super::kind::QuantKind;

/// Reads the little-endian f16 at `bytes[at..at + 2]` as f32 (exact).
#[inline]
pub(crate) fn f16_at(bytes: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([bytes[at], bytes[at + 1]])).to_f32()
}

/// Unpacks the eight 6-bit scales and eight 6-bit mins of a Q4_K super-block from its 12
/// packed bytes (ggml's `get_scale_min_k4` for `j = 0..8`).
///
/// Sub-blocks 0–3 take the low 6 bits of bytes `j` (scale) and `j + 4` (min). Sub-blocks 4–7
/// take their low 4 bits from byte `j + 4` (scale: low nibble, min: high nibble) and their
/// high 2 bits from the top bits of bytes `j − 4` (scale) and `j` (min).
pub fn unpack_q4k_scales(packed: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    let mut scales = [0u8; 8];
    let mut mins = [0u8; 8];
    for j in 0..4 {
        scales[j] = packed[j] & 63;
        mins[j] = packed[j + 4] & 63;
    }
    for j in 4..8 {
        scales[j] = (packed[j + 4] & 0xF) | ((packed[j - 4] >> 6) << 4);
        mins[j] = (packed[j + 4] >> 4) | ((packed[j] >> 6) << 4);
    }
    (scales, mins)
}

/// Dequantizes one row of `out.len()` values stored in `kind`.
///
/// `bytes` must hold exactly the row (`kind.row_bytes(out.len())` bytes), and `out.len()`
/// must be a multiple of the block size; otherwise a typed error, and `out` is untouched.
///
/// The K formats, per super-block of 256 values:
/// - `Q4_K` (144 bytes: f16 `d`, f16 `dmin`, `scales[12]`, `qs[128]`): sub-block `s`
///   (32 values) has a 6-bit scale `sc` and min `m` ([`unpack_q4k_scales`]); value
///   `(d·sc)·q − dmin·m`. The 64 values `64i..64i+64` come from `qs[32i..32i+32]`: low nibbles
///   are sub-block `2i`, high nibbles sub-block `2i + 1`.
/// - `Q6_K` (210 bytes: `ql[128]`, `qh[64]`, i8 `scales[16]`, f16 `d`): each half of 128
///   values uses 64 `ql` bytes, 32 `qh` bytes and 8 scales; for `l < 32` the four values
///   `l, l+32, l+64, l+96` of the half take the low nibble of `ql[l]`, of `ql[l+32]`, the high
///   nibble of `ql[l]`, of `ql[l+32]`, each with 2 more high bits from `qh[l]` (bits 0–1, 2–3,
///   4–5, 6–7); `q ∈ 0..64` and value `(d·sc)·(q − 32)` with scale `scales[l/16 + 2k]` for the
///   k-th of the four.
pub fn dequantize_row(kind: QuantKind, bytes: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    let expected = kind.row_bytes(out.len())?;
    if bytes.len() != expected {
        return Err(QuantError::ByteLength {
            what: "dequantize_row input",
            expected,
            actual: bytes.len(),
        });
    }
    dequantize_unchecked(kind, bytes, out);
    Ok(())
}

/// [`dequantize_row`] after the length checks (the caller guarantees them).
pub(crate) fn dequantize_unchecked(kind: QuantKind, bytes: &[u8], out: &mut [f32]) {
    let bb = kind.block_bytes();
    let bs = kind.block_size();
    let blocks = bytes.chunks_exact(bb).zip(out.chunks_exact_mut(bs));
    match kind {
        QuantKind::F32 => {
            for (b, o) in blocks {
                o[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        QuantKind::F16 => {
            for (b, o) in blocks {
                o[0] = f16_at(b, 0);
            }
        }
        QuantKind::Q4_0 => blocks.for_each(|(b, o)| block_q4_0(b, o)),
        QuantKind::Q4_1 => blocks.for_each(|(b, o)| block_q4_1(b, o)),
        QuantKind::Q5_0 => blocks.for_each(|(b, o)| block_q5_0(b, o)),
        QuantKind::Q8_0 => blocks.for_each(|(b, o)| block_q8_0(b, o)),
        QuantKind::Q4K => blocks.for_each(|(b, o)| block_q4k(b, o)),
        QuantKind::Q6K => blocks.for_each(|(b, o)| block_q6k(b, o)),
    }
}

/// One Q4_0 block (18 bytes) to 32 values: `(q − 8)·d`.
fn block_q4_0(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    for (j, &q) in b[2..18].iter().enumerate() {
        out[j] = ((q & 0xF) as i32 - 8) as f32 * d;
        out[j + 16] = ((q >> 4) as i32 - 8) as f32 * d;
    }
}

/// One Q4_1 block (20 bytes) to 32 values: `q·d + m` (multiply, then add).
fn block_q4_1(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    for (j, &q) in b[4..20].iter().enumerate() {
        out[j] = (q & 0xF) as f32 * d + m;
        out[j + 16] = (q >> 4) as f32 * d + m;
    }
}

/// The 32 five-bit values `q ∈ 0..32` of a Q5_0 block (22 bytes): element `j < 16` is the low
/// nibble of `qs[j]` with bit `j` of `qh` on top, element `j + 16` the high nibble with bit
/// `j + 16` (ggml's `((qh >> j) << 4) & 0x10` and `(qh >> (j + 12)) & 0x10`).
#[inline]
pub(crate) fn q5_0_values(b: &[u8]) -> [u8; 32] {
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    let mut q = [0u8; 32];
    for (j, &byte) in b[6..22].iter().enumerate() {
        q[j] = (byte & 0xF) | ((((qh >> j) << 4) & 0x10) as u8);
        q[j + 16] = (byte >> 4) | (((qh >> (j + 12)) & 0x10) as u8);
    }
    q
}

/// One Q5_0 block (22 bytes) to 32 values: `(q − 16)·d`.
fn block_q5_0(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    for (o, &q) in out.iter_mut().zip(&q5_0_values(b)) {
        *o = (q as i32 - 16) as f32 * d;
    }
}

/// One Q8_0 block (34 bytes) to 32 values: `q·d`.
fn block_q8_0(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    for (o, &q) in out.iter_mut().zip(&b[2..34]) {
        *o = q as i8 as f32 * d;
    }
}

/// One Q4_K super-block (144 bytes) to 256 values.
fn block_q4k(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let mut packed = [0u8; 12];
    packed.copy_from_slice(&b[4..16]);
    let (scales, mins) = unpack_q4k_scales(&packed);
    for i in 0..4 {
        let qs = &b[16 + 32 * i..16 + 32 * (i + 1)];
        let d1 = d * scales[2 * i] as f32;
        let m1 = dmin * mins[2 * i] as f32;
        let d2 = d * scales[2 * i + 1] as f32;
        let m2 = dmin * mins[2 * i + 1] as f32;
        let o = &mut out[64 * i..64 * (i + 1)];
        for (l, &q) in qs.iter().enumerate() {
            o[l] = d1 * (q & 0xF) as f32 - m1;
            o[l + 32] = d2 * (q >> 4) as f32 - m2;
        }
    }
}

/// One Q6_K super-block (210 bytes) to 256 values.
fn block_q6k(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 208);
    for half in 0..2 {
        let ql = &b[64 * half..64 * half + 64];
        let qh = &b[128 + 32 * half..128 + 32 * half + 32];
        let sc = &b[192 + 8 * half..192 + 8 * half + 8];
        let o = &mut out[128 * half..128 * (half + 1)];
        for l in 0..32 {
            let is = l / 16;
            let h = qh[l];
            let q1 = ((ql[l] & 0xF) | ((h & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0xF) | (((h >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((h >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((h >> 6) & 3) << 4)) as i32 - 32;
            o[l] = d * sc[is] as i8 as f32 * q1 as f32;
            o[l + 32] = d * sc[is + 2] as i8 as f32 * q2 as f32;
            o[l + 64] = d * sc[is + 4] as i8 as f32 * q3 as f32;
            o[l + 96] = d * sc[is + 6] as i8 as f32 * q4 as f32;
        }
    }
}
