//! Scoring an answer: which facts it contains, matched exactly and without regard to case (the
//! evaluation seed reports both; a model that writes `VcMYb4` for `VcMYB4` scores only under the
//! second).

use serde::Serialize;

/// How many facts an answer contains.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct FactScore {
    /// Facts found with exact case.
    pub found: usize,
    /// Facts found ignoring case.
    pub found_case_insensitive: usize,
    /// Facts asked for.
    pub total: usize,
}

impl FactScore {
    /// Share of facts found with exact case (0 when there are no facts).
    pub fn score(&self) -> f64 {
        ratio(self.found, self.total)
    }

    /// Share of facts found ignoring case.
    pub fn score_case_insensitive(&self) -> f64 {
        ratio(self.found_case_insensitive, self.total)
    }

    /// Whether every fact was found with exact case.
    pub fn hit(&self) -> bool {
        self.total > 0 && self.found == self.total
    }
}

fn ratio(found: usize, total: usize) -> f64 {
    if total == 0 {
        0.0
    } else {
        found as f64 / total as f64
    }
}

/// Counts the `facts` that `answer` contains.
pub fn score(answer: &str, facts: &[String]) -> FactScore {
    let lower = answer.to_lowercase();
    FactScore {
        found: facts.iter().filter(|f| answer.contains(f.as_str())).count(),
        found_case_insensitive: facts
            .iter()
            .filter(|f| lower.contains(&f.to_lowercase()))
            .count(),
        total: facts.len(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn facts(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn the_seeds_case_mismatch_counts_only_case_insensitively() {
        let s = score(
            "The code is FROSTBLOCK-7 and the tag is VcMYb4.",
            &facts(&["FROSTBLOCK-7", "VcMYB4"]),
        );
        assert_eq!((s.found, s.found_case_insensitive, s.total), (1, 2, 2));
        assert_eq!(s.score(), 0.5);
        assert_eq!(s.score_case_insensitive(), 1.0);
        assert!(!s.hit());
    }

    #[test]
    fn a_wrong_key_is_a_miss() {
        let s = score("The secret pass key is 12354.", &facts(&["12345"]));
        assert_eq!((s.found, s.found_case_insensitive), (0, 0));
        assert!(!s.hit());
        assert_eq!(score("", &facts(&["a"])).score(), 0.0);
        assert_eq!(score("anything", &[]).score(), 0.0);
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, rng_seed: proptest::test_runner::RngSeed::Fixed(5), ..ProptestConfig::default() })]

        /// An answer that quotes every fact (in any surrounding text) scores 1 both ways; the
        /// case-insensitive count never falls below the exact one.
        #[test]
        fn quoting_every_fact_scores_one(list in proptest::collection::vec("[A-Za-z0-9-]{1,8}", 1..4), pad in "[ a-z.]{0,20}") {
            let answer = format!("{pad}{}{pad}", list.join(" and "));
            let s = score(&answer, &list);
            prop_assert!(s.hit());
            prop_assert_eq!(s.score(), 1.0);
            prop_assert_eq!(s.score_case_insensitive(), 1.0);
            let upper = score(&answer.to_uppercase(), &list);
            prop_assert!(upper.found_case_insensitive == list.len());
            prop_assert!(upper.found <= upper.found_case_insensitive);
        }
    }
}
