//! Dense f32 matrix–vector products with a fixed summation order.
//!
//! The matrix is stored column-major, and output coordinates are computed in blocks: for each
//! input index `i` in order, `block += x_i · column_i[block]`. A block of 32 outputs is eight
//! 128-bit (or four 256-bit) registers of independent running sums, and each step loads one
//! contiguous slice of the column and one broadcast `x_i`, so the loop vectorizes without
//! shuffles. Every output is the plain left-to-right sum `Σ_i m_ji·x_i`, whatever the block
//! it falls in, so results never depend on blocking or threads.

/// Outputs per block in the main loop.
const WIDE: usize = 32;
/// Outputs per block for what is left after the wide blocks.
const NARROW: usize = 8;

/// `output[start..start + W] = Σ_i input_i · columns[i·rows + start ..][..W]`, in order of `i`.
#[inline(always)]
fn block<const W: usize>(
    columns: &[f32],
    rows: usize,
    start: usize,
    input: &[f32],
    out: &mut [f32],
) {
    let mut acc = [0.0f32; W];
    for (column, &x) in columns.chunks_exact(rows).zip(input) {
        let column = &column[start..start + W];
        for k in 0..W {
            acc[k] += column[k] * x;
        }
    }
    out.copy_from_slice(&acc);
}

/// `output = M · input`, with `M` of shape (output.len(), input.len()) stored column-major in
/// `columns` (so column `i` is `columns[i·rows..(i + 1)·rows]`).
pub(crate) fn matvec(columns: &[f32], input: &[f32], output: &mut [f32]) {
    let rows = output.len();
    let mut start = 0;
    let mut wide = output.chunks_exact_mut(WIDE);
    for out in &mut wide {
        block::<WIDE>(columns, rows, start, input, out);
        start += WIDE;
    }
    let mut narrow = wide.into_remainder().chunks_exact_mut(NARROW);
    for out in &mut narrow {
        block::<NARROW>(columns, rows, start, input, out);
        start += NARROW;
    }
    for out in narrow.into_remainder().chunks_exact_mut(1) {
        block::<1>(columns, rows, start, input, out);
        start += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every output must be the in-order sum `Σ_i m_ji·x_i`, bit for bit, whichever block
    /// width covers it; sizes around multiples of 8 and 32 exercise every kind of block.
    #[test]
    fn every_output_is_the_in_order_sum_bit_for_bit() {
        for d in [1usize, 3, 7, 8, 9, 31, 32, 33, 40, 41, 64, 100] {
            // Deterministic, irregular values so that summation order matters.
            let value = |i: usize| ((i * 7919 % 1013) as f32 - 506.0) / 97.0;
            let columns: Vec<f32> = (0..d * d).map(value).collect();
            let x: Vec<f32> = (0..d).map(|i| value(i * 31 + 5)).collect();
            let mut out = vec![0.0f32; d];
            matvec(&columns, &x, &mut out);
            for (j, &got) in out.iter().enumerate() {
                let mut expected = 0.0f32;
                for (i, &xi) in x.iter().enumerate() {
                    expected += columns[i * d + j] * xi;
                }
                assert_eq!(got.to_bits(), expected.to_bits(), "d={d} row={j}");
            }
        }
    }
}
