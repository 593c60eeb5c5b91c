//! The K formats against Q8_K activations (`dot_q8k`): every summation order computes the
//! exact integer products of each super-block, so each result is the exact dot product of
//! the dequantized weights with the dequantized activation up to f32 rounding; and the Q8_K
//! quantizer keeps every value within half a step.
//!
//! The bound is deterministic (no statistics): with `u = 2⁻²⁴`, a result combines at most
//! `3·blocks + 12` f32 roundings in the llama.cpp orders (the integer-to-float conversion of a
//! lane, the scale product and the accumulation per super-block, then the lane sums), each of
//! relative size `u` on partial sums bounded by `T = Σ_j (|d·sc·q_j| + |dmin·m|)·|x̂_j|`. The
//! block-lanes order rounds at most three times on the `d·I` part of a super-block's term
//! (`d_w·d_x`, `I` to f32, the FMA) and four on the minimum part (`dmin_w·d_x`, `M`, `mm·M`,
//! the FMA), each relative to that part, the parts' magnitudes adding up to at most `T`; then
//! at most one running-sum addition per super-block and three in the tree, each at most `u·T`:
//! within `(blocks + 7)·u·T` (and one `u·T` for the f32 dequantized activation the exact
//! sum is taken on), so `blocks + 12` bounds it too. A wrong lane, scale, minimum or offset moves the result by a whole term,
//! far outside it.

mod quant_common;

use proptest::prelude::*;
use quant_common::{Rng, config, random_activation, random_matrix};
use tq_models::quant::{
    Isa, KQuantOrder, Q8KActivation, QK_K, QuantKind, dequantize_row, dot_q8k, unpack_q4k_scales,
};

fn f16_at(b: &[u8], at: usize) -> f64 {
    f64::from(half::f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32())
}

/// `(Σ_j w_j·x̂_j, Σ_j |w_j parts|·|x̂_j|)` in f64, from the block fields (exact: every value
/// is a small integer times f16 and f32 scales).
fn exact(kind: QuantKind, row: &[u8], x: &[f64]) -> (f64, f64) {
    let (mut sum, mut mag) = (0.0, 0.0);
    let bb = kind.block_bytes();
    for (b, w) in row.chunks_exact(bb).enumerate() {
        let xs = &x[b * QK_K..(b + 1) * QK_K];
        // Dequantize through the library only to read the codes back: value = scale·code − min.
        let mut vals = vec![0.0f32; QK_K];
        dequantize_row(kind, w, &mut vals).unwrap();
        match kind {
            QuantKind::Q4K => {
                let (d, dmin) = (f16_at(w, 0), f16_at(w, 2));
                let packed: [u8; 12] = w[4..16].try_into().unwrap();
                let (sc, mn) = unpack_q4k_scales(&packed);
                for i in 0..4 {
                    for l in 0..32 {
                        let byte = w[16 + 32 * i + l];
                        for (j, q) in [(64 * i + l, byte & 0xF), (64 * i + 32 + l, byte >> 4)] {
                            let s = j / 32;
                            let (a, m) =
                                (d * f64::from(sc[s]) * f64::from(q), dmin * f64::from(mn[s]));
                            sum += (a - m) * xs[j];
                            mag += (a.abs() + m.abs()) * xs[j].abs();
                        }
                    }
                }
            }
            QuantKind::Q6K => {
                // Q6_K values dequantize exactly in f32 (d·sc·(q−32), 11 + 8 + 6 bits).
                for (j, v) in vals.iter().enumerate() {
                    sum += f64::from(*v) * xs[j];
                    mag += f64::from(v.abs()) * xs[j].abs();
                }
            }
            _ => unreachable!(),
        }
    }
    (sum, mag)
}

proptest! {
    #![proptest_config(config(96, 0x4b51_616e))]

    #[test]
    fn every_order_is_the_exact_dot_up_to_rounding(
        seed in any::<u64>(),
        blocks in 1usize..6,
        q6 in any::<bool>(),
        batch_rows in 1usize..12,
        grouped in any::<bool>(),
    ) {
        let kind = if q6 { QuantKind::Q6K } else { QuantKind::Q4K };
        let mut rng = Rng::new(seed);
        let cols = blocks * QK_K;
        let row = random_matrix(kind, 1, cols, &mut rng);
        let x = random_activation(cols, &mut rng);
        let mut act = Q8KActivation::new();
        act.quantize_grouped(&x, 1, cols, usize::from(grouped)).unwrap();
        let a = act.row(0).unwrap();
        let mut xd = vec![0.0f32; cols];
        a.dequantize(&mut xd).unwrap();
        let xd: Vec<f64> = xd.into_iter().map(f64::from).collect();
        let (want, mag) = exact(kind, &row, &xd);
        for order in [KQuantOrder::BlockLanes, KQuantOrder::VecDot, KQuantOrder::LlamaCppX86] {
            let per_block = if order == KQuantOrder::BlockLanes { 1 } else { 3 };
            let bound = (per_block * blocks + 12) as f64 * 2f64.powi(-24) * mag
                + f64::from(f32::MIN_POSITIVE);
            for batch_row in 0..batch_rows {
                let got = dot_q8k(kind, &row, &a, order, batch_row, batch_rows, Isa::Scalar).unwrap();
                prop_assert!(
                    (f64::from(got) - want).abs() <= bound,
                    "{kind:?} {order:?} row {batch_row}/{batch_rows}: {got} vs {want} (bound {bound})"
                );
                // The SIMD kernels are the scalar kernels' operations in the same order.
                for isa in Isa::available() {
                    let simd = dot_q8k(kind, &row, &a, order, batch_row, batch_rows, isa).unwrap();
                    prop_assert_eq!(
                        simd.to_bits(), got.to_bits(),
                        "{:?} {:?} on {:?}: {} vs scalar {}", kind, order, isa, simd, got
                    );
                }
            }
        }
    }

    #[test]
    fn q8k_quantization_is_within_half_a_step(seed in any::<u64>(), blocks in 1usize..4) {
        let mut rng = Rng::new(seed);
        let x = random_activation(blocks * QK_K, &mut rng);
        for grouped in [0, 1] {
            let mut act = Q8KActivation::new();
            act.quantize_grouped(&x, 1, x.len(), grouped).unwrap();
            let a = act.row(0).unwrap();
            for (b, xs) in x.chunks(QK_K).enumerate() {
                let d = a.scales()[b];
                let q = &a.quants()[b * QK_K..(b + 1) * QK_K];
                for (j, (&v, &q)) in xs.iter().zip(q).enumerate() {
                    prop_assert!((-127..=127).contains(&q));
                    let err = (f64::from(d) * f64::from(q) - f64::from(v)).abs();
                    prop_assert!(err <= f64::from(d.abs()) * (0.5 + 1e-6), "block {b} value {j}");
                }
                for (i, &s) in a.sums()[b * 16..(b + 1) * 16].iter().enumerate() {
                    prop_assert_eq!(i32::from(s), q[16 * i..16 * i + 16].iter().map(|&v| i32::from(v)).sum::<i32>());
                }
            }
        }
    }
}

/// The two quantizers differ only when `+amax` and `−amax` both occur: the reference one takes
/// the sign of the first, the grouped one (llama.cpp's `quantize_mat_q8_K_4x8`) the positive.
#[test]
fn grouped_quantizer_prefers_the_positive_maximum() {
    let mut x = vec![0.25f32; QK_K];
    x[3] = -2.0;
    x[9] = 2.0;
    let mut act = Q8KActivation::new();
    act.quantize_grouped(&x, 1, QK_K, 0).unwrap();
    let plain = act.row(0).unwrap();
    assert_eq!((plain.quants()[3], plain.quants()[9]), (-127, 127));
    let mut grouped = Q8KActivation::new();
    grouped.quantize_grouped(&x, 1, QK_K, 1).unwrap();
    let g = grouped.row(0).unwrap();
    assert_eq!((g.quants()[3], g.quants()[9]), (127, -127));
    assert_eq!(g.scales()[0], -plain.scales()[0]);
    // Without the tie both agree.
    x[3] = -1.0;
    act.quantize_grouped(&x, 1, QK_K, 0).unwrap();
    grouped.quantize_grouped(&x, 1, QK_K, 1).unwrap();
    assert_eq!(
        act.row(0).unwrap().quants(),
        grouped.row(0).unwrap().quants()
    );
}

#[test]
fn formats_without_a_q8k_product_are_refused() {
    let act = {
        let mut a = Q8KActivation::new();
        a.quantize(&[1.0; QK_K], 1, QK_K).unwrap();
        a
    };
    let row = vec![0u8; QuantKind::Q8_0.row_bytes(QK_K).unwrap()];
    assert!(
        dot_q8k(
            QuantKind::Q8_0,
            &row,
            &act.row(0).unwrap(),
            KQuantOrder::VecDot,
            0,
            1,
            Isa::Scalar
        )
        .is_err()
    );
}

/// The block-lanes order written out from the documented block layouts, not through the
/// library's kernels: per super-block the exact integers `I` and `M`, one f32 term, eight
/// running sums by super-block index, the fixed tree.
fn block_lanes(kind: QuantKind, row: &[u8], a: &tq_models::quant::Q8KRow<'_>) -> f32 {
    let mut acc = [0.0f32; 8];
    for (b, w) in row.chunks_exact(kind.block_bytes()).enumerate() {
        let y = &a.quants()[b * QK_K..(b + 1) * QK_K];
        let dx = a.scales()[b];
        let f16 = |at: usize| half::f16::from_le_bytes([w[at], w[at + 1]]).to_f32();
        let t = match kind {
            QuantKind::Q4K => {
                let packed: [u8; 12] = w[4..16].try_into().unwrap();
                let (sc, mn) = unpack_q4k_scales(&packed);
                let (mut i, mut m) = (0i64, 0i64);
                for (j, &yj) in y.iter().enumerate() {
                    let byte = w[16 + 32 * (j / 64) + j % 32];
                    let q = if (j / 32) % 2 == 0 {
                        byte & 0xF
                    } else {
                        byte >> 4
                    };
                    i += i64::from(sc[j / 32]) * i64::from(q) * i64::from(yj);
                    m += i64::from(mn[j / 32]) * i64::from(yj);
                }
                let (dd, mm) = (f16(0) * dx, f16(2) * dx);
                dd.mul_add(i as f32, -(mm * m as f32))
            }
            QuantKind::Q6K => {
                let mut i = 0i64;
                for (j, &yj) in y.iter().enumerate() {
                    let (half, k, l) = (j / 128, (j % 128) / 32, j % 32);
                    let ql = w[64 * half + 32 * (k % 2) + l];
                    let low = if k < 2 { ql & 0xF } else { ql >> 4 };
                    let high = (w[128 + 32 * half + l] >> (2 * k)) & 3;
                    let q = i64::from(low | (high << 4)) - 32;
                    let sc = i64::from(w[192 + 8 * half + l / 16 + 2 * k] as i8);
                    i += sc * q * i64::from(yj);
                }
                (f16(208) * dx) * i as f32
            }
            _ => unreachable!(),
        };
        acc[b % 8] += t;
    }
    ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]))
}

proptest! {
    #![proptest_config(config(96, 0x4b51_616f))]

    /// The default K order is the one its documentation states, bit for bit, on every
    /// instruction set (up to 18 super-blocks: the running sums wrap twice).
    #[test]
    fn block_lanes_order_is_as_documented(seed in any::<u64>(), blocks in 1usize..=18, q6 in any::<bool>()) {
        let kind = if q6 { QuantKind::Q6K } else { QuantKind::Q4K };
        let mut rng = Rng::new(seed);
        let cols = blocks * QK_K;
        let row = random_matrix(kind, 1, cols, &mut rng);
        let x = random_activation(cols, &mut rng);
        let mut act = Q8KActivation::new();
        act.quantize(&x, 1, cols).unwrap();
        let a = act.row(0).unwrap();
        let expected = block_lanes(kind, &row, &a);
        for isa in Isa::available() {
            let got = dot_q8k(kind, &row, &a, KQuantOrder::BlockLanes, 0, 1, isa).unwrap();
            prop_assert_eq!(got.to_bits(), expected.to_bits(), "{:?} on {:?}", kind, isa);
        }
    }
}
