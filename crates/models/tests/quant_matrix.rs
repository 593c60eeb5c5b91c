//! `QuantMatrix`: matvec against per-row dot products, matmul against repeated matvec,
//! bit-identical results across thread counts and instruction sets, embedding rows, and
//! typed errors.

mod quant_common;

use proptest::prelude::*;
use quant_common::{Rng, config, random_activation, random_matrix};
use tq_models::quant::{
    Isa, KQuantOrder, MatvecScratch, Q8Activation, Q8KActivation, Q8Order, QuantError, QuantKind,
    QuantMatrix, dequantize_row, dot_f32, dot_q8, dot_q8k,
};

const Q8_ORDERS: [Q8Order; 2] = [Q8Order::BlockLanes, Q8Order::LlamaCppAvx2];

/// The K formats' order tested together with a Q8 order: block lanes with block lanes (the
/// defaults, with matrix-product kernels), `vec_dot` with llama.cpp's (row kernels only).
fn k_order_for(order: Q8Order) -> KQuantOrder {
    match order {
        Q8Order::BlockLanes => KQuantOrder::BlockLanes,
        Q8Order::LlamaCppAvx2 => KQuantOrder::VecDot,
    }
}

/// A scratch on `isa` summing the Q8 formats in `order` (and the K formats in
/// [`k_order_for`] it).
fn scratch_in(isa: Isa, order: Q8Order) -> MatvecScratch {
    let mut scratch = MatvecScratch::with_isa(isa);
    scratch.set_q8_order(order);
    scratch.set_k_order(k_order_for(order));
    scratch
}

fn pool(threads: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|v| v.to_bits()).collect()
}

/// `y = W·x` row by row through the public row kernels (the K formats in
/// [`k_order_for`]`(order)`, neither of which depends on the batch).
fn reference_matvec(m: &QuantMatrix, x: &[f32], order: Q8Order, isa: Isa) -> Vec<f32> {
    let kind = m.kind();
    let k_format = matches!(kind, QuantKind::Q4K | QuantKind::Q6K);
    let mut act = Q8Activation::new();
    let mut act_k = Q8KActivation::new();
    if kind.has_q8_dot() {
        act.quantize(x, 1, x.len()).unwrap();
    } else if k_format {
        act_k.quantize(x, 1, x.len()).unwrap();
    }
    (0..m.rows())
        .map(|r| {
            let row = m.row(r).unwrap();
            if kind.has_q8_dot() {
                dot_q8(kind, row, &act.row(0).unwrap(), order, isa).unwrap()
            } else if k_format {
                let a = act_k.row(0).unwrap();
                dot_q8k(kind, row, &a, k_order_for(order), 0, 1, isa).unwrap()
            } else {
                dot_f32(kind, row, x).unwrap()
            }
        })
        .collect()
}

proptest! {
    #![proptest_config(config(60, 0x51AD_0002))]

    /// matvec is the row kernel on every row, on every instruction set and in both Q8
    /// orders; matmul of n rows is n matvecs (n up to three token groups of the matrix-product
    /// kernel, with a partial last group); 1 and 2 threads give the same bits.
    #[test]
    fn matvec_matmul_and_threads(
        kind_index in 0usize..8,
        rows in 1usize..=300,
        blocks in 1usize..=10,
        n in 1usize..=40,
        order_index in 0usize..2,
        seed: u64,
    ) {
        let order = Q8_ORDERS[order_index];
        let kind = QuantKind::ALL[kind_index];
        let mut rng = Rng::new(seed);
        let cols = blocks * kind.block_size().max(32);
        let m = QuantMatrix::new(kind, rows, cols, random_matrix(kind, rows, cols, &mut rng)).unwrap();
        let x = random_activation(n * cols, &mut rng);
        for isa in Isa::available() {
            let mut scratch = scratch_in(isa, order);
            prop_assert_eq!(scratch.isa(), isa);
            // matvec == per-row kernels.
            let mut y = vec![0.0f32; rows];
            m.matvec(&x[..cols], &mut y, &mut scratch).unwrap();
            prop_assert_eq!(bits(&y), bits(&reference_matvec(&m, &x[..cols], order, isa)));
            // matmul == repeated matvec, in 1- and 2-thread pools.
            let mut expected = vec![0.0f32; n * rows];
            for i in 0..n {
                m.matvec(&x[i * cols..(i + 1) * cols], &mut expected[i * rows..(i + 1) * rows], &mut scratch)
                    .unwrap();
            }
            for threads in [1, 2] {
                let mut y = vec![f32::NAN; n * rows];
                pool(threads).install(|| m.matmul(&x, n, &mut y, &mut scratch)).unwrap();
                prop_assert_eq!(bits(&y), bits(&expected), "{} threads, {}", threads, isa.name());
                let mut y1 = vec![f32::NAN; rows];
                pool(threads).install(|| m.matvec(&x[..cols], &mut y1, &mut scratch)).unwrap();
                prop_assert_eq!(bits(&y1), bits(&expected[..rows]));
            }
        }
    }
}

/// A matrix large enough to be split into many parallel tasks: every thread count gives the
/// same bits, and every instruction set gives the scalar bits.
#[test]
fn large_matrix_is_deterministic() {
    let mut rng = Rng::new(7);
    for (kind, rows, cols) in [
        (QuantKind::Q4_1, 576, 1536),
        (QuantKind::Q8_0, 2048, 576),
        (QuantKind::Q4_0, 300, 800),
        (QuantKind::Q5_0, 257, 640),
        (QuantKind::Q5_0, 17, 32 * 140),
        // Rows longer than one unpacked segment (128 blocks) of the tile kernel.
        (QuantKind::Q4_1, 40, 32 * 300),
        (QuantKind::Q8_0, 33, 32 * 129),
        // Gemma 3's K-format shapes (attention output, a 2048-wide down projection), and rows
        // of more than eight super-blocks (the running sums by super-block index wrap).
        (QuantKind::Q4K, 640, 1024),
        (QuantKind::Q6K, 300, 2048),
        (QuantKind::Q4K, 9, 256 * 18),
        (QuantKind::Q6K, 7, 256 * 17),
    ] {
        let m =
            QuantMatrix::new(kind, rows, cols, random_matrix(kind, rows, cols, &mut rng)).unwrap();
        let n = 19;
        let x = random_activation(n * cols, &mut rng);
        for order in Q8_ORDERS {
            let mut reference = vec![0.0f32; n * rows];
            let mut scratch = scratch_in(Isa::Scalar, order);
            pool(1)
                .install(|| m.matmul(&x, n, &mut reference, &mut scratch))
                .unwrap();
            for isa in Isa::available() {
                let mut scratch = scratch_in(isa, order);
                for threads in [1, 2, 3, 8] {
                    let mut y = vec![0.0f32; n * rows];
                    pool(threads)
                        .install(|| m.matmul(&x, n, &mut y, &mut scratch))
                        .unwrap();
                    assert_eq!(
                        bits(&y),
                        bits(&reference),
                        "{kind} {order:?} {} {threads}",
                        isa.name()
                    );
                }
            }
        }
    }
}

/// A product of more activation rows than one block of the parallel transpose (16) and not a
/// multiple of it, for every format: each token row is the matvec of that row.
#[test]
fn matmul_of_many_rows_is_repeated_matvec() {
    let mut rng = Rng::new(23);
    let n = 37;
    for kind in QuantKind::ALL {
        let (rows, cols) = (45, 2 * kind.block_size().max(32));
        let m =
            QuantMatrix::new(kind, rows, cols, random_matrix(kind, rows, cols, &mut rng)).unwrap();
        let x = random_activation(n * cols, &mut rng);
        for (isa, order) in Isa::available()
            .into_iter()
            .flat_map(|i| Q8_ORDERS.map(|o| (i, o)))
        {
            let mut scratch = scratch_in(isa, order);
            let mut expected = vec![0.0f32; n * rows];
            for i in 0..n {
                let (xi, yi) = (
                    &x[i * cols..(i + 1) * cols],
                    &mut expected[i * rows..][..rows],
                );
                m.matvec(xi, yi, &mut scratch).unwrap();
            }
            for threads in [1, 2] {
                let mut y = vec![f32::NAN; n * rows];
                pool(threads)
                    .install(|| m.matmul(&x, n, &mut y, &mut scratch))
                    .unwrap();
                assert_eq!(
                    bits(&y),
                    bits(&expected),
                    "{kind} {order:?} {} {threads}",
                    isa.name()
                );
            }
        }
    }
}

#[test]
fn products_sharing_an_input_equal_separate_products() {
    // Every format, in an order that switches activation forms (Q8 blocks, Q8_K super-blocks,
    // f32) and back, each product bit-identical to its own `matmul`; in every K-format order
    // (the block-lanes one regroups the Q8_K rows for its matrix products, and Q4_K then Q6_K
    // share them; the llama.cpp one quantizes a batch's rows in groups of four: n = 6 leaves
    // a remainder) and with one activation row.
    let mut rng = Rng::new(29);
    let cols = 256;
    let kinds = [
        QuantKind::Q4_1,
        QuantKind::Q8_0,
        QuantKind::Q4K,
        QuantKind::Q6K,
        QuantKind::Q4_0,
        QuantKind::F16,
        QuantKind::Q5_0,
        QuantKind::Q4K,
        QuantKind::F32,
    ];
    let matrices: Vec<QuantMatrix> = kinds
        .iter()
        .enumerate()
        .map(|(i, &kind)| {
            let rows = 5 + 3 * i;
            QuantMatrix::new(kind, rows, cols, random_matrix(kind, rows, cols, &mut rng)).unwrap()
        })
        .collect();
    for (order, q8_order) in [
        (KQuantOrder::BlockLanes, Q8Order::BlockLanes),
        (KQuantOrder::VecDot, Q8Order::BlockLanes),
        (KQuantOrder::LlamaCppX86, Q8Order::LlamaCppAvx2),
    ] {
        for n in [1, 6, 21] {
            let x = random_activation(n * cols, &mut rng);
            let mut scratch = MatvecScratch::new();
            scratch.set_k_order(order);
            scratch.set_q8_order(q8_order);
            let expected: Vec<Vec<f32>> = matrices
                .iter()
                .map(|m| {
                    let mut y = vec![0.0f32; n * m.rows()];
                    m.matmul(&x, n, &mut y, &mut scratch).unwrap();
                    y
                })
                .collect();
            let mut outputs: Vec<Vec<f32>> = matrices
                .iter()
                .map(|m| vec![f32::NAN; n * m.rows()])
                .collect();
            let mut products: Vec<(&QuantMatrix, &mut [f32])> = matrices
                .iter()
                .zip(outputs.iter_mut())
                .map(|(m, y)| (m, &mut y[..]))
                .collect();
            // A fresh scratch, so nothing the separate products left in it can stand in for
            // an activation `matmul_each` failed to quantize.
            let mut fresh = MatvecScratch::new();
            fresh.set_k_order(order);
            fresh.set_q8_order(q8_order);
            QuantMatrix::matmul_each(&x, n, &mut products, &mut fresh).unwrap();
            for ((kind, got), want) in kinds.iter().zip(&outputs).zip(&expected) {
                assert_eq!(bits(got), bits(want), "{kind} {order:?} n={n}");
            }
        }
    }
    // A shape mismatch is the same typed error as from `matmul`.
    let x = random_activation(cols + 1, &mut rng);
    let mut y = vec![0.0f32; matrices[0].rows()];
    let err = QuantMatrix::matmul_each(
        &x,
        1,
        &mut [(&matrices[0], &mut y[..])],
        &mut MatvecScratch::new(),
    );
    assert!(
        matches!(err, Err(QuantError::ShapeMismatch { .. })),
        "{err:?}"
    );
}

#[test]
fn embedding_rows_are_dequantized_rows() {
    let mut rng = Rng::new(11);
    for kind in QuantKind::ALL {
        let cols = kind.block_size().max(32) * 2;
        let rows = 5;
        let bytes = random_matrix(kind, rows, cols, &mut rng);
        let m = QuantMatrix::new(kind, rows, cols, &bytes[..]).unwrap();
        for r in 0..rows {
            let mut got = vec![0.0f32; cols];
            m.embedding_row(r, &mut got).unwrap();
            let mut expected = vec![0.0f32; cols];
            let rb = kind.row_bytes(cols).unwrap();
            dequantize_row(kind, &bytes[r * rb..(r + 1) * rb], &mut expected).unwrap();
            assert_eq!(bits(&got), bits(&expected), "{kind} row {r}");
        }
        assert_eq!(
            m.embedding_row(rows, &mut vec![0.0; cols]),
            Err(QuantError::RowOutOfRange { index: rows, rows })
        );
        assert!(matches!(
            m.embedding_row(0, &mut vec![0.0; cols + 1]),
            Err(QuantError::ShapeMismatch { .. })
        ));
    }
}

#[test]
fn construction_errors() {
    assert_eq!(
        QuantMatrix::new(QuantKind::Q4_1, 2, 64, vec![0u8; 79]).unwrap_err(),
        QuantError::ByteLength {
            what: "matrix",
            expected: 80,
            actual: 79
        }
    );
    assert!(matches!(
        QuantMatrix::new(QuantKind::Q8_0, 2, 48, vec![0u8; 68]),
        Err(QuantError::NotBlockMultiple {
            cols: 48,
            block: 32,
            ..
        })
    ));
    assert!(matches!(
        QuantMatrix::new(QuantKind::Q8_0, usize::MAX / 2, 64, Vec::new()),
        Err(QuantError::SizeOverflow { .. })
    ));
    let m = QuantMatrix::new(QuantKind::Q8_0, 3, 64, vec![0u8; 204]).unwrap();
    assert_eq!((m.rows(), m.cols(), m.row_bytes()), (3, 64, 68));
    assert_eq!(m.storage().len(), 204);
}

#[test]
fn product_errors() {
    let mut rng = Rng::new(3);
    let m = QuantMatrix::new(
        QuantKind::Q4_1,
        4,
        64,
        random_matrix(QuantKind::Q4_1, 4, 64, &mut rng),
    )
    .unwrap();
    let mut scratch = MatvecScratch::new();
    let mut y = vec![0.0f32; 4];
    assert_eq!(
        m.matvec(&[0.0; 63], &mut y, &mut scratch),
        Err(QuantError::ShapeMismatch {
            what: "matmul input",
            expected: 64,
            actual: 63
        })
    );
    assert_eq!(
        m.matvec(&[0.0; 64], &mut [0.0; 5], &mut scratch),
        Err(QuantError::ShapeMismatch {
            what: "matmul output",
            expected: 4,
            actual: 5
        })
    );
    assert!(matches!(
        m.matmul(&[0.0; 128], 3, &mut [0.0; 12], &mut scratch),
        Err(QuantError::ShapeMismatch { expected: 192, .. })
    ));
    let mut x = vec![0.5f32; 64];
    x[9] = f32::NAN;
    assert!(matches!(
        m.matvec(&x, &mut y, &mut scratch),
        Err(QuantError::NonFiniteActivation { index: 9, .. })
    ));
    // The f32 path rejects non-finite activations the same way.
    let f = QuantMatrix::new(QuantKind::F16, 2, 64, vec![0u8; 256]).unwrap();
    x[9] = f32::NEG_INFINITY;
    assert!(matches!(
        f.matvec(&x, &mut [0.0; 2], &mut scratch),
        Err(QuantError::NonFiniteActivation { index: 9, .. })
    ));
    // Empty products are fine.
    assert_eq!(m.matmul(&[], 0, &mut [], &mut scratch), Ok(()));
}

/// A storage whose `AsRef` does not return a slice of the promised length is an error at call
/// time, not an out-of-bounds read.
#[test]
fn shrinking_storage_is_an_error() {
    use std::cell::Cell;
    struct Shrinking {
        bytes: Vec<u8>,
        calls: Cell<usize>,
    }
    impl AsRef<[u8]> for Shrinking {
        fn as_ref(&self) -> &[u8] {
            self.calls.set(self.calls.get() + 1);
            if self.calls.get() > 1 {
                &self.bytes[..10]
            } else {
                &self.bytes
            }
        }
    }
    let m = QuantMatrix::new(
        QuantKind::Q8_0,
        2,
        32,
        Shrinking {
            bytes: vec![0; 68],
            calls: Cell::new(0),
        },
    )
    .unwrap();
    assert!(matches!(
        m.row(0),
        Err(QuantError::ByteLength {
            expected: 68,
            actual: 10,
            ..
        })
    ));
}

/// Extreme weight bytes (every nibble 0 or 15, every Q5_0 fifth bit 0 or 1, every Q8 byte −128
/// or 127; the K formats' codes likewise, Q4_K's 6-bit scales and minimums 0 or 63, Q6_K's
/// scales −128 or 127) against extreme activations (all ±amax, so every quantized value is
/// ±127): the matrix-product kernels' 16-bit pair sums (AVX2) and 32-bit sums (VNNI) stay
/// exact, so a product of many tokens still equals the token-by-token products, in both
/// orders.
#[test]
fn extreme_products_do_not_saturate() {
    let mut rng = Rng::new(31);
    let (rows, n) = (9, 19);
    for kind in [
        QuantKind::Q4_0,
        QuantKind::Q4_1,
        QuantKind::Q5_0,
        QuantKind::Q8_0,
        QuantKind::Q4K,
        QuantKind::Q6K,
    ] {
        let cols = if kind.block_size() == 256 {
            256 * 3
        } else {
            32 * 11
        };
        let mut bytes = random_matrix(kind, rows, cols, &mut rng);
        // The code bytes (and the K formats' sub-block scales) at their extremes; the f16
        // scales stay random.
        let (codes, signed) = match kind {
            QuantKind::Q4_1 => (4..20, false),
            QuantKind::Q8_0 => (2..34, true),
            QuantKind::Q4K => (4..144, false),
            QuantKind::Q6K => (0..208, false),
            _ => (2..kind.block_bytes(), false),
        };
        for block in bytes.chunks_mut(kind.block_bytes()) {
            for (at, byte) in block
                .iter_mut()
                .enumerate()
                .filter(|(at, _)| codes.contains(at))
            {
                // Q6_K's i8 sub-block scales at −128 and 127.
                let signed = signed || (kind == QuantKind::Q6K && at >= 192);
                *byte = match (signed, rng.byte() & 1) {
                    (true, 0) => 0x80,
                    (true, _) => 0x7F,
                    (false, 0) => 0x00,
                    _ => 0xFF,
                };
            }
        }
        let m = QuantMatrix::new(kind, rows, cols, bytes).unwrap();
        let x: Vec<f32> = (0..n * cols)
            .map(|_| if rng.byte() & 1 == 0 { 3.0 } else { -3.0 })
            .collect();
        for (isa, order) in Isa::available()
            .into_iter()
            .flat_map(|i| Q8_ORDERS.map(|o| (i, o)))
        {
            let mut scratch = scratch_in(isa, order);
            let mut expected = vec![0.0f32; n * rows];
            for i in 0..n {
                let (xi, yi) = (&x[i * cols..][..cols], &mut expected[i * rows..][..rows]);
                m.matvec(xi, yi, &mut scratch).unwrap();
            }
            let reference = reference_matvec(&m, &x[..cols], order, Isa::Scalar);
            assert_eq!(
                bits(&expected[..rows]),
                bits(&reference),
                "{kind} {order:?}"
            );
            let mut y = vec![f32::NAN; n * rows];
            m.matmul(&x, n, &mut y, &mut scratch).unwrap();
            assert_eq!(bits(&y), bits(&expected), "{kind} {order:?} {}", isa.name());
        }
    }
}
