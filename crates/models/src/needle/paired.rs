//! Two allocations over the same needle cells: the cells each finds and the other misses, and
//! whether that split is more than chance.
//!
//! A grid's cells are paired — the same prompt answered through two caches — so the
//! comparison that uses the pairing is McNemar's test: only the discordant cells (one hit, one
//! miss) carry information, and if neither cache were the better one each of them would fall
//! either way with probability ½. On the 20 cells of one grid a one-cell difference is then
//! no evidence either way (p = 1); several key seeds (`tq needle --key-seeds`) give the test
//! cells to work with.

use serde::Serialize;

use super::NeedleRow;

/// How an allocation's cells compare with a baseline's on the same prompts.
///
/// ```
/// use tq_models::needle::PairedHits;
///
/// // 12 cells both found, 1 only the baseline, 0 only the allocation, 7 neither.
/// let outcomes = [(true, true); 12]
///     .into_iter()
///     .chain([(false, true)])
///     .chain([(false, false); 7]);
/// let paired = PairedHits::from_outcomes(outcomes);
/// assert_eq!((paired.hits(), paired.baseline_hits()), (12, 13));
/// assert_eq!(paired.p_value(), 1.0); // one discordant cell: no evidence either way
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PairedHits {
    /// Cells compared.
    pub cells: usize,
    /// Cells both found.
    pub both: usize,
    /// Cells only the allocation found.
    pub only_this: usize,
    /// Cells only the baseline found.
    pub only_baseline: usize,
}

impl PairedHits {
    /// Counts `(allocation hit, baseline hit)` outcomes, one per cell.
    pub fn from_outcomes(outcomes: impl IntoIterator<Item = (bool, bool)>) -> Self {
        let mut paired = Self::default();
        for (this, baseline) in outcomes {
            paired.cells += 1;
            match (this, baseline) {
                (true, true) => paired.both += 1,
                (true, false) => paired.only_this += 1,
                (false, true) => paired.only_baseline += 1,
                (false, false) => {}
            }
        }
        paired
    }

    /// Cells the allocation found.
    pub fn hits(&self) -> usize {
        self.both + self.only_this
    }

    /// Cells the baseline found.
    pub fn baseline_hits(&self) -> usize {
        self.both + self.only_baseline
    }

    /// The exact two-sided p-value of McNemar's test: the probability, were each discordant
    /// cell equally likely to fall either way, of a split at least as uneven as this one
    /// (`2·P[X ≤ min]` for `X ~ Binomial(discordant, ½)`, at most 1).
    pub fn p_value(&self) -> f64 {
        let n = self.only_this + self.only_baseline;
        let low = self.only_this.min(self.only_baseline);
        // The binomial probabilities by their ratio `P(i+1)/P(i) = (n−i)/(i+1)`, in logs so
        // that `2^−n` does not underflow for long grids.
        let mut log_p = -(n as f64) * std::f64::consts::LN_2;
        let mut tail = 0.0;
        for i in 0..=low {
            tail += log_p.exp();
            log_p += ((n - i) as f64).ln() - ((i + 1) as f64).ln();
        }
        (2.0 * tail).min(1.0)
    }
}

/// `alloc`'s rows paired with `baseline`'s on the same (context, depth, key seed) cells;
/// cells only one of them ran are left out.
///
/// ```
/// use tq_models::needle::paired_hits;
/// # let rows = [];
/// let paired = paired_hits(&rows, "rec4.25", "f16");
/// assert_eq!(paired.cells, 0);
/// ```
pub fn paired_hits(rows: &[NeedleRow], alloc: &str, baseline: &str) -> PairedHits {
    let same_cell = |a: &NeedleRow, b: &NeedleRow| {
        a.context == b.context && a.depth == b.depth && a.key_seed == b.key_seed
    };
    PairedHits::from_outcomes(rows.iter().filter(|r| r.alloc == alloc).filter_map(|row| {
        rows.iter()
            .find(|b| b.alloc == baseline && same_cell(row, b))
            .map(|b| (row.hit(), b.hit()))
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paired(only_this: usize, only_baseline: usize) -> PairedHits {
        PairedHits {
            cells: only_this + only_baseline,
            both: 0,
            only_this,
            only_baseline,
        }
    }

    #[test]
    fn p_values_are_the_exact_binomial_tails() {
        // The sums run in logs: equal to the exact fractions to a few roundings.
        let close = |p: f64, exact: f64| (p - exact).abs() <= 1e-12 * exact;
        // 2·(C(10,0) + C(10,1))/2^10 and 2·(1 + 8 + 28)/2^8, by hand.
        assert!(close(paired(1, 9).p_value(), 22.0 / 1024.0));
        assert!(close(paired(6, 2).p_value(), 74.0 / 256.0));
        // Symmetric in the two sides; no discordant cell, or an even split, is p = 1.
        assert_eq!(paired(9, 1).p_value(), paired(1, 9).p_value());
        assert_eq!(paired(0, 0).p_value(), 1.0);
        assert_eq!(paired(5, 5).p_value(), 1.0);
        // A one-sided split of n cells is 2^(1−n); long grids do not underflow.
        assert!(close(paired(0, 20).p_value(), 2f64.powi(-19)));
        let long = paired(300, 500).p_value();
        assert!(long > 0.0 && long < 1e-10, "{long}");
    }

    /// `2·Σ_{i ≤ low} C(n, i) / 2^n` in exact integers (n ≤ 120 fits u128).
    fn exact(only_this: usize, only_baseline: usize) -> f64 {
        let n = (only_this + only_baseline) as u128;
        let low = only_this.min(only_baseline) as u128;
        let (mut c, mut sum) = (1u128, 0u128);
        for i in 0..=low {
            sum += c;
            c = c * (n - i) / (i + 1);
        }
        (2.0 * sum as f64 / 2f64.powi(n as i32)).min(1.0)
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig {
            cases: 500,
            rng_seed: proptest::test_runner::RngSeed::Fixed(41),
            ..Default::default()
        })]

        /// The p-value summed in logs is the exact binomial tail to a few roundings, for
        /// every split of up to 120 discordant cells.
        #[test]
        fn p_values_match_exact_integer_tails(a in 0usize..=60, b in 0usize..=60) {
            let p = paired(a, b).p_value();
            let e = exact(a, b);
            proptest::prop_assert!((p - e).abs() <= 1e-11 * e, "{a}/{b}: {p} vs {e}");
        }
    }

    fn row(alloc: &str, context: usize, key_seed: u64, hit: bool) -> NeedleRow {
        NeedleRow {
            alloc: alloc.into(),
            context,
            depth: 0.5,
            key_seed,
            facts_found: usize::from(hit),
            facts_total: 1,
            score: f64::from(u8::from(hit)),
            score_case_insensitive: f64::from(u8::from(hit)),
            answer: String::new(),
            expected: vec!["12345".into()],
            prompt_tokens: context,
            needle_token: 0,
            cache_bytes_per_token: 0,
            prefill_tokens_per_s: 0.0,
            decode_tokens_per_s: 0.0,
            needle_attention: None,
            exact_needle: None,
            exact_kept: None,
            needle_window_ranks: None,
            heavy_hitters: None,
        }
    }

    #[test]
    fn rows_pair_on_context_depth_and_key_seed() {
        let rows = [
            row("f16", 1024, 7, true),
            row("q", 1024, 7, false),
            row("f16", 1024, 1, false),
            row("q", 1024, 1, true),
            row("f16", 2048, 7, true),
            row("q", 2048, 7, true),
            // A cell the baseline did not run is left out.
            row("q", 4096, 7, true),
        ];
        let paired = paired_hits(&rows, "q", "f16");
        assert_eq!(
            paired,
            PairedHits {
                cells: 3,
                both: 1,
                only_this: 1,
                only_baseline: 1
            }
        );
        assert_eq!(paired_hits(&rows, "f16", "q").only_this, 1);
    }
}
