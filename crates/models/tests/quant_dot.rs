//! Row dot products: activation quantization, SIMD against scalar (bit-exact), and the integer
//! path against the f32 reference within the activation-quantization bound.
//!
//! Bounds (u = 2⁻²⁴, f32 unit roundoff), with `T = Σ_j w_j x_j` computed in f64 from the exactly
//! dequantized weights:
//!
//! - f32 path: each of 8 lanes sums ≤ ⌈cols/8⌉ products, then 3 levels of lane sums:
//!   `|a − T| ≤ (⌈cols/8⌉ + 4)·u·Σ|w_j x_j|`.
//! - activation quantization, per block with `dq = amax/127`, `d16 = f16(fl(dq))`:
//!   `x_j·fl(127/amax)` is within `2·127·u` of `x_j/dq`, rounding adds ≤ ½, so
//!   `|x_j − q_j·dq| ≤ dq·(½ + 2⁻¹⁵)` and `|x_j − q_j·d16| ≤ e_b = dq·(½ + 2⁻¹⁵) + 127·|dq − d16|`.
//!   The integer path computes exactly `Σ_b d_w q_w·x̂ (+ m_b·s16_b)`, so
//!   `|b_exact − T| ≤ Σ_b Σ_j |d_w q_wj|·e_b (+ |m_b|·|s16_b − Σ_j x_j|)` with
//!   `|s16 − Σx| ≤ 32·dq·(½ + 2⁻¹⁵ + 127u) + (2⁻¹¹ + 2⁻²³)·|d·Σq| + 2⁻²⁵` (f32 then f16
//!   rounding of `d·Σq`).
//! - integer path rounding: per block and lane, `dd = d_w·d_x` rounded once and one FMA into
//!   the lane (nb terms per lane), the minimum terms in one FMA chain, 3 levels of lane sums
//!   and a final add: `≤ (nb + 8)·u·Σ|terms|` over the lane terms `|dd·lane_l|` and `|m·s|`.
//!
//! A wrong block scale, nibble order, sign or minimum breaks these by orders of magnitude; the
//! bounds are tight enough (about 1/250 of Σ|w||x| per block) to catch that.

mod quant_common;

use half::f16;
use proptest::prelude::*;
use quant_common::{Rng, config, random_activation, random_matrix};
use tq_models::quant::{
    Isa, Q8Activation, Q8Order, Q8Row, QuantError, QuantKind, dequantize_row, dot_f32, dot_q8,
};

const U: f64 = 1.0 / (1u64 << 24) as f64;
const ORDERS: [Q8Order; 2] = [Q8Order::BlockLanes, Q8Order::LlamaCppAvx2];
const Q8_KINDS: [QuantKind; 4] = [
    QuantKind::Q4_0,
    QuantKind::Q4_1,
    QuantKind::Q5_0,
    QuantKind::Q8_0,
];

fn quantize(x: &[f32]) -> Q8Activation {
    let mut act = Q8Activation::new();
    act.quantize(x, 1, x.len()).unwrap();
    act
}

#[test]
fn activation_quantization_hand_example() {
    // amax = 127 ⇒ d = 1, id = 1: q is x rounded half to even.
    let mut x = vec![0.0f32; 32];
    let vals = [127.0, 2.5, 3.5, -2.5, 0.5, 1.5, -126.6, 0.49, -127.0];
    x[..vals.len()].copy_from_slice(&vals);
    let act = quantize(&x);
    let row = act.row(0).unwrap();
    assert_eq!(&row.quants()[..9], &[127, 2, 4, -2, 0, 2, -127, 0, -127]);
    assert!(row.quants()[9..].iter().all(|&q| q == 0));
    assert_eq!(row.scales(), &[1.0]);
    let sum: i32 = [127, 2, 4, -2, 0, 2, -127, 0, -127].iter().sum();
    assert_eq!(row.sums(), &[sum as f32]);

    // amax = 16: id = 127/16 = 7.9375 exactly; d = 16/127 rounds to f16.
    let x: Vec<f32> = (0..32).map(|j| j as f32 - 16.0).collect();
    let act = quantize(&x);
    let row = act.row(0).unwrap();
    let expected: Vec<i8> = x
        .iter()
        .map(|v| (v * 7.9375).round_ties_even() as i8)
        .collect();
    assert_eq!(row.quants(), &expected[..]);
    assert_eq!(row.quants()[0], -127);
    assert_eq!(row.quants()[17], 8); // 7.9375 → 8
    assert_eq!(row.scales()[0], f16::from_f32(16.0 / 127.0).to_f32());

    // An all-zero block: zero scale, zero bytes.
    let act = quantize(&[0.0; 64]);
    let row = act.row(0).unwrap();
    assert_eq!(row.scales(), &[0.0, 0.0]);
    assert!(row.quants().iter().all(|&q| q == 0));
}

#[test]
fn activation_errors() {
    let mut act = Q8Activation::new();
    assert!(matches!(
        act.quantize(&[0.0; 40], 1, 40),
        Err(QuantError::NotBlockMultiple { cols: 40, .. })
    ));
    assert!(matches!(
        act.quantize(&[0.0; 64], 3, 32),
        Err(QuantError::ShapeMismatch {
            expected: 96,
            actual: 64,
            ..
        })
    ));
    let mut x = vec![1.0f32; 64];
    x[37] = f32::INFINITY;
    assert_eq!(
        act.quantize(&x, 2, 32),
        Err(QuantError::NonFiniteActivation {
            index: 37,
            value: f32::INFINITY
        })
    );
    x[37] = f32::NAN;
    assert!(matches!(
        act.quantize(&x, 2, 32),
        Err(QuantError::NonFiniteActivation { index: 37, .. })
    ));
    act.quantize(&[1.0; 64], 2, 32).unwrap();
    assert!(matches!(
        act.row(2),
        Err(QuantError::RowOutOfRange { index: 2, rows: 2 })
    ));
}

#[test]
fn dot_errors() {
    let act = quantize(&[1.0; 64]);
    let row = act.row(0).unwrap();
    assert_eq!(
        dot_q8(
            QuantKind::Q4K,
            &[0; 144],
            &row,
            Q8Order::default(),
            Isa::Scalar
        ),
        Err(QuantError::NoQ8Dot {
            kind: QuantKind::Q4K
        })
    );
    assert!(matches!(
        dot_q8(
            QuantKind::Q4_1,
            &[0; 39],
            &row,
            Q8Order::default(),
            Isa::best()
        ),
        Err(QuantError::ByteLength {
            expected: 40,
            actual: 39,
            ..
        })
    ));
    assert!(matches!(
        dot_f32(QuantKind::Q8_0, &[0; 34], &[0.0; 64]),
        Err(QuantError::ByteLength {
            expected: 68,
            actual: 34,
            ..
        })
    ));
    assert!(matches!(
        dot_f32(QuantKind::Q4K, &[0; 144], &[0.0; 32]),
        Err(QuantError::NotBlockMultiple { .. })
    ));
}

/// `Σ w_j x_j` in f64 from the exactly dequantized row, and `Σ |w_j x_j|`.
fn exact_dot(kind: QuantKind, row: &[u8], x: &[f32]) -> (f64, f64) {
    let mut w = vec![0.0f32; x.len()];
    dequantize_row(kind, row, &mut w).unwrap();
    w.iter().zip(x).fold((0.0, 0.0), |(s, a), (&w, &x)| {
        let p = w as f64 * x as f64;
        (s + p, a + p.abs())
    })
}

/// `Σ_l |Σ_{j ∈ lane l} q_w,j·q_x,j|` (lane l = values 4l..4l+4).
fn lane_abs(qw: &[f64], qx: &[i8]) -> f64 {
    (0..8)
        .map(|l| {
            (4 * l..4 * l + 4)
                .map(|j| qw[j] * qx[j] as f64)
                .sum::<f64>()
                .abs()
        })
        .sum()
}

/// A block of an integer format as `(d_w, q_w as f64, m)` (`m = 0` without a minimum).
fn block_ints(kind: QuantKind, block: &[u8]) -> (f64, Vec<f64>, f64) {
    let dw = f16::from_le_bytes([block[0], block[1]]).to_f64();
    let nibble = |start: usize, j: usize| {
        let byte = block[start + j % 16];
        (if j < 16 { byte & 0xF } else { byte >> 4 }) as f64
    };
    match kind {
        QuantKind::Q8_0 => (
            dw,
            block[2..34].iter().map(|&q| q as i8 as f64).collect(),
            0.0,
        ),
        QuantKind::Q4_0 => (dw, (0..32).map(|j| nibble(2, j) - 8.0).collect(), 0.0),
        QuantKind::Q5_0 => {
            // ggml-common.h: qh (bytes 2..6) holds the fifth bit of element j in bit j.
            let qh = u32::from_le_bytes([block[2], block[3], block[4], block[5]]);
            let q = (0..32).map(|j| nibble(6, j) + 16.0 * ((qh >> j) & 1) as f64 - 16.0);
            (dw, q.collect(), 0.0)
        }
        _ => (
            dw,
            (0..32).map(|j| nibble(4, j)).collect(),
            f16::from_le_bytes([block[2], block[3]]).to_f64(),
        ),
    }
}

/// The a-priori bound on `|dot_q8 − T|` (module docs), from the row bytes and the activation.
fn q8_bound(kind: QuantKind, row: &[u8], x: &[f32], act: &Q8Activation) -> f64 {
    let a = act.row(0).unwrap();
    let bb = kind.block_bytes();
    let nb = x.len() / 32;
    let (mut quant, mut terms) = (0.0f64, 0.0f64);
    for b in 0..nb {
        let block = &row[b * bb..(b + 1) * bb];
        let xs = &x[32 * b..32 * (b + 1)];
        let qx = &a.quants()[32 * b..32 * (b + 1)];
        let (dw, qw, m) = block_ints(kind, block);
        let amax = xs.iter().fold(0.0f64, |m, v| m.max(v.abs() as f64));
        let dq = amax / 127.0;
        let d16 = a.scales()[b] as f64;
        let e = dq * (0.5 + 2f64.powi(-15)) + 127.0 * (dq - d16).abs();
        quant += qw.iter().map(|q| (dw * q).abs()).sum::<f64>() * e;
        terms += (dw * d16).abs() * lane_abs(&qw, qx);
        if kind == QuantKind::Q4_1 {
            let sum_q: f64 = qx.iter().map(|&q| q as f64).sum();
            let s_err = 32.0 * dq * (0.5 + 2f64.powi(-15) + 127.0 * U)
                + (2f64.powi(-11) + 2f64.powi(-23)) * (dq * sum_q).abs()
                + 2f64.powi(-25);
            quant += m.abs() * s_err;
            terms += (m * a.sums()[b] as f64).abs();
        }
    }
    let rounding = (nb as f64 + 8.0) * U * terms;
    quant + rounding + 1e-30
}

fn isas() -> Vec<Isa> {
    Isa::available()
}

proptest! {
    #![proptest_config(config(300, 0x51AD_0001))]

    /// Every available instruction set returns the scalar kernel's bits, for every integer
    /// format, on row lengths covering whole and partial groups of eight blocks.
    #[test]
    fn simd_matches_scalar_bit_for_bit(kind_index in 0usize..4, blocks in 1usize..=41, seed: u64) {
        let kind = Q8_KINDS[kind_index];
        let mut rng = Rng::new(seed);
        let cols = 32 * blocks;
        let row = random_matrix(kind, 1, cols, &mut rng);
        let x = random_activation(cols, &mut rng);
        let act = quantize(&x);
        let a = act.row(0).unwrap();
        for order in ORDERS {
            let scalar = dot_q8(kind, &row, &a, order, Isa::Scalar).unwrap();
            for isa in isas() {
                let v = dot_q8(kind, &row, &a, order, isa).unwrap();
                prop_assert_eq!(v.to_bits(), scalar.to_bits(), "{} {:?} on {}: {} vs {}", kind, order, isa.name(), v, scalar);
            }
        }
    }

    /// Extreme weight bytes (every nibble 0 or 15, every Q5_0 fifth bit 0 or 1, every Q8 byte
    /// −128 or 127) and extreme
    /// activations (all ±amax) stay exact: no i16 saturation in any kernel.
    #[test]
    fn simd_extremes_match_scalar(kind_index in 0usize..4, blocks in 1usize..=17, seed: u64) {
        let kind = Q8_KINDS[kind_index];
        let mut rng = Rng::new(seed);
        let cols = 32 * blocks;
        let mut row = random_matrix(kind, 1, cols, &mut rng);
        let bb = kind.block_bytes();
        let start = if kind == QuantKind::Q4_1 { 4 } else { 2 };
        for block in row.chunks_mut(bb) {
            for byte in &mut block[start..] {
                *byte = match (kind, rng.byte() & 1) {
                    (QuantKind::Q8_0, 0) => 0x80,
                    (QuantKind::Q8_0, _) => 0x7F,
                    (_, 0) => 0x00,
                    _ => 0xFF,
                };
            }
        }
        let x: Vec<f32> = (0..cols).map(|_| if rng.byte() & 1 == 0 { 3.0 } else { -3.0 }).collect();
        let act = quantize(&x);
        let a = act.row(0).unwrap();
        prop_assert!(a.quants().iter().all(|q| q.abs() == 127));
        for order in ORDERS {
            let scalar = dot_q8(kind, &row, &a, order, Isa::Scalar).unwrap();
            // The integer sums are exact, so the scalar result also matches an f64 evaluation
            // of Σ d_w·d_x·isum (+ m·s) within the integer path's rounding bound (module docs).
            let (exact_int, abs) = exact_dot_quantized(kind, &row, &a);
            let rounding = (blocks as f64 + 8.0) * U * abs + 1e-30;
            prop_assert!((scalar as f64 - exact_int).abs() <= rounding);
            for isa in isas() {
                let v = dot_q8(kind, &row, &a, order, isa).unwrap();
                prop_assert_eq!(v.to_bits(), scalar.to_bits(), "{} {:?} on {}", kind, order, isa.name());
            }
        }
    }

    /// The integer path and the f32 path both stay within their derived bounds of the exact
    /// f64 dot product, hence within their sum of each other.
    #[test]
    fn q8_path_within_quantization_bound(kind_index in 0usize..4, blocks in 1usize..=48, seed: u64) {
        let kind = Q8_KINDS[kind_index];
        let mut rng = Rng::new(seed);
        let cols = 32 * blocks;
        let row = random_matrix(kind, 1, cols, &mut rng);
        let x = random_activation(cols, &mut rng);
        let act = quantize(&x);
        let (t, abs) = exact_dot(kind, &row, &x);
        let a = dot_f32(kind, &row, &x).unwrap() as f64;
        let bound_a = (cols.div_ceil(8) as f64 + 4.0) * U * abs + 1e-30;
        let bound_b = q8_bound(kind, &row, &x, &act);
        prop_assert!((a - t).abs() <= bound_a, "f32 path {} vs {} (bound {})", a, t, bound_a);
        for order in ORDERS {
            let b = dot_q8(kind, &row, &act.row(0).unwrap(), order, Isa::Scalar).unwrap() as f64;
            prop_assert!((b - t).abs() <= bound_b, "q8 path {:?} {} vs {} (bound {})", order, b, t, bound_b);
            prop_assert!((a - b).abs() <= bound_a + bound_b);
        }
        // The bound is informative: a fraction of Σ|w x| even with outlier blocks.
        prop_assert!(bound_b <= 0.25 * abs + 1e-6, "bound {} vs Σ|wx| {}", bound_b, abs);
    }

    /// The f32 path of every format is its dequantized row dotted with x, within rounding.
    #[test]
    fn f32_path_matches_dequantized_dot(kind_index in 0usize..8, blocks in 1usize..=6, seed: u64) {
        let kind = QuantKind::ALL[kind_index];
        let mut rng = Rng::new(seed);
        let cols = blocks * kind.block_size().max(32);
        let row = random_matrix(kind, 1, cols, &mut rng);
        let x = random_activation(cols, &mut rng);
        let (t, abs) = exact_dot(kind, &row, &x);
        let a = dot_f32(kind, &row, &x).unwrap() as f64;
        let bound = (cols.div_ceil(8) as f64 + 4.0) * U * abs + 1e-30;
        prop_assert!((a - t).abs() <= bound, "{}: {} vs {} (bound {})", kind, a, t, bound);
    }

    /// The quantizer follows its definition on random input: q = round_half_even(x·127/amax),
    /// d16 = f16(amax/127), s16 = f16(d·Σq).
    #[test]
    fn quantizer_follows_definition(blocks in 1usize..=8, seed: u64) {
        let mut rng = Rng::new(seed);
        let x = random_activation(32 * blocks, &mut rng);
        let act = quantize(&x);
        let a = act.row(0).unwrap();
        for b in 0..blocks {
            let xs = &x[32 * b..32 * (b + 1)];
            let amax = xs.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let d = amax / 127.0;
            let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
            let q: Vec<i8> = xs.iter().map(|v| (v * id).round_ties_even() as i8).collect();
            prop_assert_eq!(&a.quants()[32 * b..32 * (b + 1)], &q[..]);
            let sum: i32 = q.iter().map(|&q| q as i32).sum();
            prop_assert_eq!(a.scales()[b], f16::from_f32(d).to_f32());
            prop_assert_eq!(a.sums()[b], f16::from_f32(d * sum as f32).to_f32());
        }
    }
}

/// `Σ_b d_w·d16·isum (+ m·s16)` in f64 from the quantized activation (the integer path's value
/// in exact arithmetic), and the sum of the absolute terms.
fn exact_dot_quantized(kind: QuantKind, row: &[u8], a: &Q8Row<'_>) -> (f64, f64) {
    let bb = kind.block_bytes();
    let (mut total, mut abs) = (0.0, 0.0);
    for b in 0..a.blocks() {
        let (dw, qw, m) = block_ints(kind, &row[b * bb..(b + 1) * bb]);
        let qx = &a.quants()[32 * b..32 * (b + 1)];
        let isum: f64 = qw.iter().zip(qx).map(|(w, &x)| w * x as f64).sum();
        let dd = dw * a.scales()[b] as f64;
        let tm = m * a.sums()[b] as f64;
        total += dd * isum + tm;
        abs += dd.abs() * lane_abs(&qw, qx) + tm.abs();
    }
    (total, abs)
}

/// llama.cpp's x86 AVX2 `ggml_vec_dot_q8_0_q8_0` / `_q4_0_q8_0` / `_q5_0_q8_0` / `_q4_1_q8_1`
/// (`ggml/src/ggml-cpu/arch/x86/quants.c`; Q5_0's loop is Q4_0's with the fifth bits OR-ed into
/// the unpacked bytes), transcribed
/// lane by lane in scalar f32: per block `d = d_x·d_y`, `acc = fmadd(d, lanes, acc)` (lane `l`
/// = the `vpmaddwd` sum of products `4l..4l+4`), for Q4_1 `summs += m·s` (contracted to an FMA
/// by GCC's default `-ffp-contract=fast`), then `hsum_float_8(acc) (+ summs)`.
fn llama_cpp_avx2(kind: QuantKind, row: &[u8], a: &Q8Row<'_>) -> f32 {
    let bb = kind.block_bytes();
    let mut acc = [0.0f32; 8];
    let mut summs = 0.0f32;
    for b in 0..a.blocks() {
        let block = &row[b * bb..(b + 1) * bb];
        let (_, qw, _) = block_ints(kind, block);
        let dw = f16::from_le_bytes([block[0], block[1]]).to_f32();
        let qx = &a.quants()[32 * b..32 * (b + 1)];
        let d = dw * a.scales()[b];
        for (l, acc) in acc.iter_mut().enumerate() {
            let p: i32 = (4 * l..4 * l + 4)
                .map(|j| qw[j] as i32 * qx[j] as i32)
                .sum();
            *acc = d.mul_add(p as f32, *acc);
        }
        if kind == QuantKind::Q4_1 {
            let m = f16::from_le_bytes([block[2], block[3]]).to_f32();
            summs = m.mul_add(a.sums()[b], summs);
        }
    }
    // hsum_float_8: high half + low half, then + movehl, then lane 0 + lane 1.
    let r4 = [
        acc[4] + acc[0],
        acc[5] + acc[1],
        acc[6] + acc[2],
        acc[7] + acc[3],
    ];
    let r2 = [r4[0] + r4[2], r4[1] + r4[3]];
    let h = r2[0] + r2[1];
    if kind == QuantKind::Q4_1 {
        h + summs
    } else {
        h
    }
}

proptest! {
    #![proptest_config(config(200, 0x51AD_0003))]

    /// The integer path reproduces llama.cpp's AVX2 dot products bit for bit (given the same
    /// quantized activation), on every instruction set.
    #[test]
    fn matches_llama_cpp_avx2_order(kind_index in 0usize..4, blocks in 1usize..=48, seed: u64) {
        let kind = Q8_KINDS[kind_index];
        let mut rng = Rng::new(seed);
        let cols = 32 * blocks;
        let row = random_matrix(kind, 1, cols, &mut rng);
        let x = random_activation(cols, &mut rng);
        let act = quantize(&x);
        let a = act.row(0).unwrap();
        let expected = llama_cpp_avx2(kind, &row, &a);
        for isa in isas() {
            let v = dot_q8(kind, &row, &a, Q8Order::LlamaCppAvx2, isa).unwrap();
            prop_assert_eq!(v.to_bits(), expected.to_bits(), "{} on {}", kind, isa.name());
        }
    }
}

/// The block-lanes order as its documentation states it, in scalar f32: per block the exact
/// integer sum `isum`, `dd = d_x·d_y`, the term `dd·isum` (Q4_1: `fma(dd, isum, m·s)`), added
/// to running sum `b mod 8`; then `((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7))`.
fn block_lanes(kind: QuantKind, row: &[u8], a: &Q8Row<'_>) -> f32 {
    let bb = kind.block_bytes();
    let mut acc = [0.0f32; 8];
    for b in 0..a.blocks() {
        let block = &row[b * bb..(b + 1) * bb];
        let (_, qw, _) = block_ints(kind, block);
        let dw = f16::from_le_bytes([block[0], block[1]]).to_f32();
        let qx = &a.quants()[32 * b..32 * (b + 1)];
        let isum: i32 = (0..32).map(|j| qw[j] as i32 * qx[j] as i32).sum();
        let dd = dw * a.scales()[b];
        let t = if kind == QuantKind::Q4_1 {
            let m = f16::from_le_bytes([block[2], block[3]]).to_f32();
            dd.mul_add(isum as f32, m * a.sums()[b])
        } else {
            dd * isum as f32
        };
        acc[b % 8] += t;
    }
    ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]))
}

proptest! {
    #![proptest_config(config(200, 0x51AD_0004))]

    /// The default order is the one its documentation states, bit for bit, on every
    /// instruction set (so the order itself, not just agreement between kernels, is pinned).
    #[test]
    fn block_lanes_order_is_as_documented(kind_index in 0usize..4, blocks in 1usize..=48, seed: u64) {
        let kind = Q8_KINDS[kind_index];
        let mut rng = Rng::new(seed);
        let cols = 32 * blocks;
        let row = random_matrix(kind, 1, cols, &mut rng);
        let x = random_activation(cols, &mut rng);
        let act = quantize(&x);
        let a = act.row(0).unwrap();
        let expected = block_lanes(kind, &row, &a);
        for isa in isas() {
            let v = dot_q8(kind, &row, &a, Q8Order::BlockLanes, isa).unwrap();
            prop_assert_eq!(v.to_bits(), expected.to_bits(), "{} on {}", kind, isa.name());
        }
    }
}
