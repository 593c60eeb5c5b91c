//! Dequantization of hand-built blocks against values worked out by hand from ggml's layouts.
//!
//! Every block here is constructed byte by byte (scales as literal f16 bit patterns), and every
//! expected value is exactly representable, so the checks are exact equalities: a wrong nibble
//! order, scale index, sign or offset changes some value by at least one quantization step.

mod quant_common;

use quant_common::f16_bytes;
use tq_models::quant::{QuantError, QuantKind, dequantize_row, unpack_q4k_scales};

fn dequant(kind: QuantKind, bytes: &[u8], n: usize) -> Vec<f32> {
    let mut out = vec![f32::NAN; n];
    dequantize_row(kind, bytes, &mut out).unwrap();
    out
}

#[test]
fn geometry_matches_ggml() {
    let expected = [
        (QuantKind::F32, 0, 1, 4, "F32"),
        (QuantKind::F16, 1, 1, 2, "F16"),
        (QuantKind::Q4_0, 2, 32, 18, "Q4_0"),
        (QuantKind::Q4_1, 3, 32, 20, "Q4_1"),
        (QuantKind::Q5_0, 6, 32, 22, "Q5_0"),
        (QuantKind::Q8_0, 8, 32, 34, "Q8_0"),
        (QuantKind::Q4K, 12, 256, 144, "Q4_K"),
        (QuantKind::Q6K, 14, 256, 210, "Q6_K"),
    ];
    for (kind, id, bs, bb, name) in expected {
        assert_eq!(kind.ggml_type(), id);
        assert_eq!(QuantKind::from_ggml_type(id), Ok(kind));
        assert_eq!(kind.block_size(), bs);
        assert_eq!(kind.block_bytes(), bb);
        assert_eq!(kind.to_string(), name);
        assert_eq!(kind.row_bytes(bs * 3), Ok(bb * 3));
    }
    // Q5_1, Q8_1, Q2_K … are not implemented.
    for id in [7, 9, 10, 11, 13, 15, 99] {
        assert_eq!(
            QuantKind::from_ggml_type(id),
            Err(QuantError::UnsupportedGgmlType { id })
        );
    }
}

#[test]
fn f32_and_f16() {
    let values = [1.5f32, -0.0, 3.25e-3, -7.0e5];
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    assert_eq!(dequant(QuantKind::F32, &bytes, 4), values);

    // 1.0, −2.0, 0.5, 65504 (largest f16), 2⁻²⁴ (smallest subnormal), −0.
    let bits: [u16; 6] = [0x3C00, 0xC000, 0x3800, 0x7BFF, 0x0001, 0x8000];
    let bytes: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
    let out = dequant(QuantKind::F16, &bytes, 6);
    assert_eq!(&out[..5], &[1.0, -2.0, 0.5, 65504.0, 2f32.powi(-24)]);
    assert_eq!(out[5].to_bits(), (-0.0f32).to_bits());
}

#[test]
fn q4_0_block() {
    // d = 0.5 (f16 0x3800); byte j: low nibble j (element j), high nibble 15 − j (element 16 + j).
    let mut block = vec![0x00, 0x38];
    block.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
    let out = dequant(QuantKind::Q4_0, &block, 32);
    for j in 0..16 {
        assert_eq!(out[j], (j as f32 - 8.0) * 0.5, "element {j}");
        assert_eq!(out[16 + j], (7.0 - j as f32) * 0.5, "element {}", 16 + j);
    }
    assert_eq!(out[0], -4.0);
    assert_eq!(out[15], 3.5);
    assert_eq!(out[16], 3.5);
}

#[test]
fn q4_1_block() {
    // d = 0.25 (0x3400), m = −1.0 (0xBC00); byte j: low nibble j, high nibble (3j + 1) mod 16.
    let mut block = vec![0x00, 0x34, 0x00, 0xBC];
    block.extend((0..16u8).map(|j| j | (((3 * j + 1) % 16) << 4)));
    let out = dequant(QuantKind::Q4_1, &block, 32);
    for j in 0..16 {
        assert_eq!(out[j], j as f32 * 0.25 - 1.0, "element {j}");
        let high = ((3 * j + 1) % 16) as f32;
        assert_eq!(out[16 + j], high * 0.25 - 1.0, "element {}", 16 + j);
    }
    assert_eq!(out[0], -1.0);
    assert_eq!(out[15], 2.75);
}

#[test]
fn q5_0_block() {
    // d = 0.5 (0x3800); byte j: low nibble j (element j), high nibble 15 − j (element 16 + j);
    // qh = 0xA5A5_0F0F: the fifth bit of element e is bit e, so elements 0–3, 8–11, 16, 18,
    // 21, 23, 24, 26, 29, 31 get +16.
    let qh: u32 = 0xA5A5_0F0F;
    let mut block = vec![0x00, 0x38];
    block.extend(qh.to_le_bytes());
    block.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
    assert_eq!(block.len(), 22);
    let out = dequant(QuantKind::Q5_0, &block, 32);
    for (e, &v) in out.iter().enumerate() {
        let nibble = if e < 16 { e } else { 31 - e } as i32;
        let fifth = ((qh >> e) & 1) as i32;
        let expected = (nibble + 16 * fifth - 16) as f32 * 0.5;
        assert_eq!(v, expected, "element {e}");
    }
    // Element 0: q = 0 + 16 → 0; element 4: q = 4 → −6; element 16 (nibble 15, bit set):
    // q = 31 → 7.5; element 17 (nibble 14, bit clear): q = 14 → −1.
    assert_eq!(out[0], 0.0);
    assert_eq!(out[4], -6.0);
    assert_eq!(out[16], 7.5);
    assert_eq!(out[17], -1.0);
    // All bits clear and all nibbles 0: the minimum, −16·d.
    let mut low = vec![0x00, 0x38];
    low.extend([0u8; 20]);
    assert!(
        dequant(QuantKind::Q5_0, &low, 32)
            .iter()
            .all(|&v| v == -8.0)
    );
    // All bits set and all nibbles 15: the maximum, 15·d.
    let mut high = vec![0x00, 0x38];
    high.extend([0xFFu8; 20]);
    assert!(
        dequant(QuantKind::Q5_0, &high, 32)
            .iter()
            .all(|&v| v == 7.5)
    );
}

#[test]
fn q8_0_block() {
    // d = 0.125 (0x3000); the extremes −128 and 127 included.
    let qs: Vec<i8> = (0..32)
        .map(|j: i32| (j * 8 - 128).clamp(-128, 127) as i8)
        .collect();
    let mut block = vec![0x00, 0x30];
    block.extend(qs.iter().map(|&q| q as u8));
    let out = dequant(QuantKind::Q8_0, &block, 32);
    for j in 0..32 {
        assert_eq!(out[j], qs[j] as f32 * 0.125, "element {j}");
    }
    assert_eq!(out[0], -16.0);
    assert_eq!(out[31], 15.0); // q = 120
    // A negative scale flips signs.
    block[0..2].copy_from_slice(&f16_bytes(-0.125));
    assert_eq!(dequant(QuantKind::Q8_0, &block, 32)[0], 16.0);
}

/// Sub-block scales `[1, 2, 3, 4, 33, 34, 35, 63]` and mins `[0, 5, 10, 15, 20, 40, 48, 62]`
/// packed by hand:
///
/// - bytes 0–3: `sc[j] | (sc[j+4] >> 4) << 6` = `1|2<<6, 2|2<<6, 3|2<<6, 4|3<<6`
///   = `0x81 0x82 0x83 0xC4`;
/// - bytes 4–7: `m[j] | (m[j+4] >> 4) << 6` = `0|1<<6, 5|2<<6, 10|3<<6, 15|3<<6`
///   = `0x40 0x85 0xCA 0xCF`;
/// - bytes 8–11: `(sc[j+4] & 15) | (m[j+4] & 15) << 4` = `1|4<<4, 2|8<<4, 3|0<<4, 15|14<<4`
///   = `0x41 0x82 0x03 0xEF`.
const Q4K_PACKED: [u8; 12] = [
    0x81, 0x82, 0x83, 0xC4, 0x40, 0x85, 0xCA, 0xCF, 0x41, 0x82, 0x03, 0xEF,
];
const Q4K_SCALES: [u8; 8] = [1, 2, 3, 4, 33, 34, 35, 63];
const Q4K_MINS: [u8; 8] = [0, 5, 10, 15, 20, 40, 48, 62];

#[test]
fn q4k_scale_unpacking() {
    assert_eq!(unpack_q4k_scales(&Q4K_PACKED), (Q4K_SCALES, Q4K_MINS));
    // All-ones bytes: every scale and min is 63.
    assert_eq!(unpack_q4k_scales(&[0xFF; 12]), ([63; 8], [63; 8]));
    // Only the top bits of byte 0 set: sub-block 4's scale gets bits 4–5, nothing else moves.
    let mut top = [0u8; 12];
    top[0] = 0xC0;
    let (sc, m) = unpack_q4k_scales(&top);
    assert_eq!(sc, [0, 0, 0, 0, 48, 0, 0, 0]);
    assert_eq!(m, [0; 8]);
}

#[test]
fn q4k_block() {
    // d = 0.5, dmin = 0.25; qs[32i + l]: low nibble l mod 16 (sub-block 2i, position l),
    // high nibble 15 − (l mod 16) (sub-block 2i + 1, position l).
    let mut block = Vec::new();
    block.extend(f16_bytes(0.5));
    block.extend(f16_bytes(0.25));
    block.extend(Q4K_PACKED);
    for _ in 0..4 {
        block.extend((0..32u8).map(|l| (l % 16) | ((15 - l % 16) << 4)));
    }
    assert_eq!(block.len(), 144);
    let out = dequant(QuantKind::Q4K, &block, 256);
    for (e, &v) in out.iter().enumerate() {
        let s = e / 32; // sub-block
        let l = (e % 32) as u8;
        let q = if s % 2 == 0 { l % 16 } else { 15 - l % 16 };
        let expected = 0.5 * Q4K_SCALES[s] as f32 * q as f32 - 0.25 * Q4K_MINS[s] as f32;
        assert_eq!(v, expected, "element {e}");
    }
    // Spot values: element 0 = 0.5·1·0 − 0 = 0; element 32 = 0.5·2·15 − 0.25·5 = 13.75;
    // element 255 = 0.5·63·0 − 0.25·62 = −15.5.
    assert_eq!(out[0], 0.0);
    assert_eq!(out[32], 13.75);
    assert_eq!(out[255], -15.5);
}

#[test]
fn q6k_block() {
    // d = 0.5; scales s[k] = (k + 1)·(−1)^k; element e has 6-bit value q(e) = (e·7) mod 64,
    // packed as ggml's quantizer does: in each half of 128, for l < 32 the four values
    // l, l+32, l+64, l+96 go to ql[l] low, ql[l+32] low, ql[l] high, ql[l+32] high, with their
    // top 2 bits in qh[l] bits 0–1, 2–3, 4–5, 6–7.
    let q = |e: usize| ((e * 7) % 64) as u8;
    let scales: Vec<i8> = (0..16)
        .map(|k: i32| ((k + 1) * if k % 2 == 0 { 1 } else { -1 }) as i8)
        .collect();
    let mut ql = [0u8; 128];
    let mut qh = [0u8; 64];
    for half in 0..2 {
        for l in 0..32 {
            let v = |k: usize| q(128 * half + l + 32 * k);
            ql[64 * half + l] = (v(0) & 0xF) | ((v(2) & 0xF) << 4);
            ql[64 * half + l + 32] = (v(1) & 0xF) | ((v(3) & 0xF) << 4);
            qh[32 * half + l] =
                (v(0) >> 4) | ((v(1) >> 4) << 2) | ((v(2) >> 4) << 4) | ((v(3) >> 4) << 6);
        }
    }
    let mut block = Vec::new();
    block.extend(ql);
    block.extend(qh);
    block.extend(scales.iter().map(|&s| s as u8));
    block.extend(f16_bytes(0.5));
    assert_eq!(block.len(), 210);
    let out = dequant(QuantKind::Q6K, &block, 256);
    for (e, &v) in out.iter().enumerate() {
        // Scale index: sixteen values per scale, in element order.
        let expected = 0.5 * scales[e / 16] as f32 * (q(e) as f32 - 32.0);
        assert_eq!(v, expected, "element {e}");
    }
    // Element 0: 0.5·1·(0 − 32) = −16; element 16 (scale −2, q = 112 mod 64 = 48): −16;
    // element 255 (scale −16, q = 1785 mod 64 = 57): 0.5·(−16)·25 = −200.
    assert_eq!(out[0], -16.0);
    assert_eq!(out[16], -16.0);
    assert_eq!(out[255], -200.0);
}

#[test]
fn multi_block_rows_decode_block_by_block() {
    // Two Q8_0 blocks with different scales: the second block uses its own scale.
    let mut row = vec![0x00, 0x3C]; // d = 1
    row.extend([1u8; 32]);
    row.extend([0x00, 0x40]); // d = 2
    row.extend([3u8; 32]);
    let out = dequant(QuantKind::Q8_0, &row, 64);
    assert!(out[..32].iter().all(|&v| v == 1.0));
    assert!(out[32..].iter().all(|&v| v == 6.0));
}

#[test]
fn bad_lengths_are_errors() {
    let mut out = vec![7.0f32; 32];
    assert_eq!(
        dequantize_row(QuantKind::Q4_1, &[0u8; 19], &mut out),
        Err(QuantError::ByteLength {
            what: "dequantize_row input",
            expected: 20,
            actual: 19
        })
    );
    assert_eq!(
        dequantize_row(QuantKind::Q5_0, &[0u8; 23], &mut out),
        Err(QuantError::ByteLength {
            what: "dequantize_row input",
            expected: 22,
            actual: 23
        })
    );
    assert_eq!(
        dequantize_row(QuantKind::Q8_0, &[0u8; 36], &mut out),
        Err(QuantError::ByteLength {
            what: "dequantize_row input",
            expected: 34,
            actual: 36
        })
    );
    let mut odd = vec![0.0f32; 33];
    assert_eq!(
        dequantize_row(QuantKind::Q4_0, &[0u8; 18], &mut odd),
        Err(QuantError::NotBlockMultiple {
            kind: QuantKind::Q4_0,
            cols: 33,
            block: 32
        })
    );
    let mut short = vec![0.0f32; 128];
    assert!(matches!(
        dequantize_row(QuantKind::Q6K, &[0u8; 210], &mut short),
        Err(QuantError::NotBlockMultiple { block: 256, .. })
    ));
    // Nothing was written on error.
    assert!(out.iter().all(|&v| v == 7.0));
    // Empty rows are fine.
    assert_eq!(dequantize_row(QuantKind::Q4K, &[], &mut []), Ok(()));
}
