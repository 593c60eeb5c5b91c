//! The Thomas algorithm for the tridiagonal Newton systems of the Lloyd-Max solver.

/// A tridiagonal matrix stored by diagonals, `n × n`.
#[derive(Clone, Debug)]
pub(crate) struct Tridiagonal {
    /// `lower[i] = A[i][i-1]`; `lower[0]` is unused.
    pub(crate) lower: Vec<f64>,
    /// `diag[i] = A[i][i]`.
    pub(crate) diag: Vec<f64>,
    /// `upper[i] = A[i][i+1]`; `upper[n-1]` is unused.
    pub(crate) upper: Vec<f64>,
}

impl Tridiagonal {
    /// An all-zero `n × n` matrix.
    pub(crate) fn zeros(n: usize) -> Self {
        Self {
            lower: vec![0.0; n],
            diag: vec![0.0; n],
            upper: vec![0.0; n],
        }
    }

    /// Solves `A x = rhs` in place (`rhs` becomes `x`) without pivoting.
    ///
    /// Returns `None` when a pivot vanishes or the result is not finite; the caller then
    /// falls back to a Lloyd step, so a singular Jacobian is never fatal.
    pub(crate) fn solve_in_place(&self, rhs: &mut [f64]) -> Option<()> {
        let n = self.diag.len();
        debug_assert_eq!(rhs.len(), n);
        // Forward sweep: eliminate the sub-diagonal; `scaled_upper[i]` is the modified upper.
        let mut scaled_upper = vec![0.0; n];
        let mut pivot = self.diag[0];
        for i in 0..n {
            if i > 0 {
                pivot = self.diag[i] - self.lower[i] * scaled_upper[i - 1];
                rhs[i] -= self.lower[i] * rhs[i - 1];
            }
            if pivot == 0.0 || !pivot.is_finite() {
                return None;
            }
            scaled_upper[i] = self.upper[i] / pivot;
            rhs[i] /= pivot;
        }
        for i in (0..n.saturating_sub(1)).rev() {
            rhs[i] -= scaled_upper[i] * rhs[i + 1];
        }
        rhs.iter().all(|v| v.is_finite()).then_some(())
    }
}

#[cfg(test)]
mod tests {
    use super::Tridiagonal;

    #[test]
    fn solves_a_known_system() {
        // A = [[4,1,0],[2,5,1],[0,3,6]], x = [1,-2,3] → b = A x.
        let a = Tridiagonal {
            lower: vec![0.0, 2.0, 3.0],
            diag: vec![4.0, 5.0, 6.0],
            upper: vec![1.0, 1.0, 0.0],
        };
        let mut b = vec![4.0 - 2.0, 2.0 - 10.0 + 3.0, -6.0 + 18.0];
        a.solve_in_place(&mut b).expect("non-singular");
        for (got, want) in b.iter().zip([1.0, -2.0, 3.0]) {
            assert!((got - want).abs() < 1e-14, "{got} vs {want}");
        }
    }

    #[test]
    fn reports_a_zero_pivot() {
        let a = Tridiagonal {
            lower: vec![0.0, 1.0],
            diag: vec![0.0, 1.0],
            upper: vec![1.0, 0.0],
        };
        assert!(a.solve_in_place(&mut [1.0, 1.0]).is_none());
    }
}
