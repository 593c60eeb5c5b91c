//! Dense f32 weight matrices with deterministic random initialization.
//!
//! The hybrid architectures are exercised without a download: their weights are drawn from a
//! seeded ChaCha20 stream, uniform with variance `1/fan_in` so that every projection keeps
//! activations of order one (the point is the state plumbing, not what the model says).

use rand::Rng;
use rand_chacha::ChaCha20Rng;

use crate::llama::ModelError;

/// A row-major `[rows, cols]` matrix: `y = W·x` maps `cols` inputs to `rows` outputs.
#[derive(Clone, Debug, PartialEq)]
pub struct Dense {
    rows: usize,
    cols: usize,
    data: Vec<f32>,
}

impl Dense {
    /// Entries uniform on `[−√(3/cols), √(3/cols)]` (variance `1/cols`), drawn in row order.
    pub fn random(rows: usize, cols: usize, rng: &mut ChaCha20Rng) -> Self {
        Self::uniform(rows, cols, (3.0 / cols.max(1) as f32).sqrt(), rng)
    }

    /// Entries uniform on `[−bound, bound]`, drawn in row order.
    pub fn uniform(rows: usize, cols: usize, bound: f32, rng: &mut ChaCha20Rng) -> Self {
        let data = (0..rows * cols)
            .map(|_| rng.random_range(-1.0f32..=1.0) * bound)
            .collect();
        Self { rows, cols, data }
    }

    /// Output dimension.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input dimension.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Row `r` (the weights of output `r`).
    pub fn row(&self, r: usize) -> &[f32] {
        &self.data[r * self.cols..(r + 1) * self.cols]
    }

    /// All entries, row-major.
    pub fn data(&self) -> &[f32] {
        &self.data
    }

    /// `out[i] = W·x[i]` for `n` rows of `x` (`[n, cols]` → `[n, rows]`).
    ///
    /// Every output is one dot product summed in index order, so a token's result does not
    /// depend on how many tokens share the call: chunked prefill reproduces one pass bit for bit.
    pub fn matmul(&self, x: &[f32], n: usize, out: &mut [f32]) -> Result<(), ModelError> {
        if x.len() != n * self.cols || out.len() != n * self.rows {
            return Err(ModelError::InvalidCall(format!(
                "a [{}, {}] matrix got {} inputs and {} outputs for {n} rows",
                self.rows,
                self.cols,
                x.len(),
                out.len()
            )));
        }
        for (xi, oi) in x
            .chunks_exact(self.cols)
            .zip(out.chunks_exact_mut(self.rows))
        {
            for (o, w) in oi.iter_mut().zip(self.data.chunks_exact(self.cols)) {
                *o = w.iter().zip(xi).map(|(a, b)| a * b).sum();
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;

    #[test]
    fn matmul_is_row_independent_and_checks_shapes() {
        let mut rng = ChaCha20Rng::seed_from_u64(1);
        let w = Dense::random(3, 4, &mut rng);
        let x: Vec<f32> = (0..8).map(|i| i as f32 * 0.25 - 1.0).collect();
        let mut both = vec![0.0; 6];
        w.matmul(&x, 2, &mut both).unwrap();
        let mut second = vec![0.0; 3];
        w.matmul(&x[4..], 1, &mut second).unwrap();
        assert_eq!(&both[3..], &second[..]);
        let expected: f32 = w.row(1).iter().zip(&x[..4]).map(|(a, b)| a * b).sum();
        assert_eq!(both[1], expected);
        assert!(w.matmul(&x, 1, &mut second).is_err());
        // Variance 1/cols: every entry within the uniform bound.
        let bound = (3.0f32 / 4.0).sqrt();
        assert!((0..3).all(|r| w.row(r).iter().all(|v| v.abs() <= bound)));
    }
}
