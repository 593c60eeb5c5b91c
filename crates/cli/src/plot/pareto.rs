//! The Pareto front of (cost, figure) points: fewer bits is better, and the figure is better
//! either lower (KL divergence) or higher (needle score, speed).

/// Which direction of the figure is better.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Better {
    /// Smaller is better (KL divergence, perplexity).
    Lower,
    /// Larger is better (needle score, tokens per second).
    Higher,
}

/// `a` at least as good as `b` in the figure.
fn at_least(a: f64, b: f64, better: Better) -> bool {
    match better {
        Better::Lower => a <= b,
        Better::Higher => a >= b,
    }
}

/// Indices of the points no other point dominates, ordered by cost. A point `(x, y)` is
/// dominated when another costs no more, is no worse, and is strictly better in one of the
/// two. Points with a non-finite coordinate never enter the front (and dominate nothing).
pub fn pareto_front(points: &[(f64, f64)], better: Better) -> Vec<usize> {
    let finite = |&(x, y): &(f64, f64)| x.is_finite() && y.is_finite();
    let mut front: Vec<usize> = (0..points.len())
        .filter(|&i| finite(&points[i]))
        .filter(|&i| {
            let (x, y) = points[i];
            !points.iter().any(|p| {
                finite(p)
                    && p.0 <= x
                    && at_least(p.1, y, better)
                    && (p.0 < x || !at_least(y, p.1, better))
            })
        })
        .collect();
    front.sort_by(|&a, &b| points[a].0.total_cmp(&points[b].0));
    front
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

    use super::*;

    #[test]
    fn a_small_case() {
        // (bits, KL): the 3-bit point is cheapest, the 16-bit one best, the 5-bit one is beaten
        // by the 4-bit one on both counts.
        let points = [(16.0, 0.0), (5.0, 0.2), (4.0, 0.1), (3.0, 0.5)];
        assert_eq!(pareto_front(&points, Better::Lower), vec![3, 2, 0]);
        // Higher is better: (4, 0.1) is now beaten by (3, 0.5) and (5, 0.2) by (3, 0.5).
        assert_eq!(pareto_front(&points, Better::Higher), vec![3]);
        // Ties: identical points both stay; NaN never enters.
        let tied = [(4.0, 1.0), (4.0, 1.0), (f64::NAN, 0.0)];
        assert_eq!(pareto_front(&tied, Better::Higher), vec![0, 1]);
    }

    #[test]
    fn the_front_is_exactly_the_undominated_points() {
        let mut runner = TestRunner::new_with_rng(
            Config {
                cases: 256,
                ..Config::default()
            },
            TestRng::from_seed(RngAlgorithm::ChaCha, &[3; 32]),
        );
        let points = prop::collection::vec((0u8..8, 0u8..8), 0..20);
        runner
            .run(&points, |raw| {
                let points: Vec<(f64, f64)> = raw
                    .iter()
                    .map(|&(x, y)| (f64::from(x), f64::from(y)))
                    .collect();
                let front = pareto_front(&points, Better::Lower);
                for (i, &(x, y)) in points.iter().enumerate() {
                    let dominated = points
                        .iter()
                        .any(|&(a, b)| a <= x && b <= y && (a < x || b < y));
                    prop_assert_eq!(front.contains(&i), !dominated);
                }
                // Along the front, cost rises and the figure improves strictly.
                for w in front.windows(2) {
                    let (a, b) = (points[w[0]], points[w[1]]);
                    prop_assert!(a.0 <= b.0);
                    prop_assert!(a.0 == b.0 || b.1 < a.1);
                }
                Ok(())
            })
            .unwrap();
    }
}
