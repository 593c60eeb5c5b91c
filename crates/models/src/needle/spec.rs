//! What to hide and what to ask: the needle spec (a TOML contract users write haystacks in).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use serde::{Deserialize, Serialize};

use super::NeedleError;

/// The placeholder replaced by the per-prompt pass key in the needle, question and facts.
pub const KEY_PLACEHOLDER: &str = "{key}";

/// A needle test: filler, needle, question and the facts the answer must contain.
///
/// The TOML form (extra keys are allowed and ignored, so a spec can carry notes):
///
/// ```toml
/// filler   = "The grass is green. The sky is blue."        # repeated to the context length
/// needle   = "The secret pass key is {key}. Remember it."  # inserted at each depth
/// question = "What is the secret pass key?"               # asked after the haystack
/// facts    = ["{key}"]                                     # strings the answer must contain
/// key_seed = 7                                             # {key}: a 5-digit number per prompt
/// answer_prefix = "The secret pass key is"                # optional: the cue the model completes
/// ```
///
/// `answer_prefix` starts the answer for the model: after `Answer:` in a completion prompt
/// (base models), at the start of the assistant turn in a chat prompt (see
/// [`PromptStyle`](super::PromptStyle)). It may not contain `{key}`, which would give the
/// answer away.
///
/// Without `{key}` the needle and facts are literal (e.g. two facts such as `FROSTBLOCK-7` and
/// `VcMYb4` in one needle sentence).
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
pub struct NeedleSpec {
    /// Filler text, split into sentences and repeated to reach the context length.
    pub filler: String,
    /// The sentence(s) hidden in the filler; may contain `{key}`.
    pub needle: String,
    /// The question asked after the haystack; may contain `{key}`.
    pub question: String,
    /// Strings the answer must contain; may contain `{key}`.
    pub facts: Vec<String>,
    /// Seed of the pass keys (ignored when nothing contains `{key}`).
    #[serde(default)]
    pub key_seed: u64,
    /// The words the answer starts with, written into the prompt for the model to complete.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer_prefix: Option<String>,
}

impl NeedleSpec {
    /// The built-in spec: the classic pass-key test (as in the brief's llama.cpp baseline), a
    /// 5-digit key in "the grass is green" filler.
    pub fn builtin() -> Self {
        Self {
            filler: "The grass is green. The sky is blue. The sun is yellow. \
                     Here we go. There and back again."
                .to_owned(),
            needle: "The secret pass key is {key}. Remember it. {key} is the secret pass key."
                .to_owned(),
            question: "What is the secret pass key?".to_owned(),
            facts: vec![KEY_PLACEHOLDER.to_owned()],
            key_seed: 7,
            answer_prefix: None,
        }
    }

    /// [`builtin`](Self::builtin) with the answer cue `"The secret pass key is"`: the spec the
    /// needle commands use for a base model (no chat template), which completes text rather
    /// than answers questions.
    pub fn builtin_completion() -> Self {
        Self {
            answer_prefix: Some("The secret pass key is".to_owned()),
            ..Self::builtin()
        }
    }

    /// The built-in spec for a prompt `style`: [`builtin`](Self::builtin) for a chat model,
    /// [`builtin_completion`](Self::builtin_completion) for a base model.
    pub fn builtin_for(style: &super::PromptStyle) -> Self {
        match style {
            super::PromptStyle::Chat(_) => Self::builtin(),
            super::PromptStyle::Completion => Self::builtin_completion(),
        }
    }

    /// Parses and checks a TOML spec.
    pub fn from_toml(text: &str) -> Result<Self, NeedleError> {
        let spec: Self = toml::from_str(text)?;
        spec.validate()?;
        Ok(spec)
    }

    /// Checks that the spec can produce a prompt and a score.
    pub fn validate(&self) -> Result<(), NeedleError> {
        let blank = |s: &str| s.trim().is_empty();
        if blank(&self.filler) {
            return Err(NeedleError::Spec("`filler` is empty".into()));
        }
        if blank(&self.needle) {
            return Err(NeedleError::Spec("`needle` is empty".into()));
        }
        if blank(&self.question) {
            return Err(NeedleError::Spec("`question` is empty".into()));
        }
        if self.facts.is_empty() || self.facts.iter().any(|f| blank(f)) {
            return Err(NeedleError::Spec(
                "`facts` must list at least one non-empty string".into(),
            ));
        }
        if let Some(prefix) = &self.answer_prefix {
            if blank(prefix) {
                return Err(NeedleError::Spec(
                    "`answer_prefix` is empty (omit it instead)".into(),
                ));
            }
            if prefix.contains(KEY_PLACEHOLDER) {
                return Err(NeedleError::Spec(
                    "`answer_prefix` contains {key}: it would give the answer away".into(),
                ));
            }
        }
        // A fact that names the key can only be found if the needle states it.
        if self.facts.iter().any(|f| f.contains(KEY_PLACEHOLDER))
            && !self.needle.contains(KEY_PLACEHOLDER)
        {
            return Err(NeedleError::Spec(
                "a fact contains {key} but the needle does not".into(),
            ));
        }
        Ok(())
    }

    /// Whether the spec draws a pass key.
    pub fn uses_key(&self) -> bool {
        self.needle.contains(KEY_PLACEHOLDER)
            || self.question.contains(KEY_PLACEHOLDER)
            || self.facts.iter().any(|f| f.contains(KEY_PLACEHOLDER))
    }

    /// The pass key of the prompt at (`context`, `depth`): a 5-digit number, a pure function of
    /// `key_seed` and the cell, so every allocation sees the same prompt and reruns agree.
    /// `None` when the spec is literal.
    pub fn key(&self, context: usize, depth: f64) -> Option<u32> {
        if !self.uses_key() {
            return None;
        }
        let seed = mix(mix(mix(self.key_seed) ^ context as u64) ^ depth.to_bits());
        Some(ChaCha20Rng::seed_from_u64(seed).random_range(10_000..100_000))
    }

    /// `template` with `{key}` replaced by `key` (unchanged for a literal spec).
    pub fn fill(template: &str, key: Option<u32>) -> String {
        match key {
            Some(key) => template.replace(KEY_PLACEHOLDER, &key.to_string()),
            None => template.to_owned(),
        }
    }
}

/// SplitMix64's finalizer: spreads nearby inputs (context 1024 vs 2048, depth 0.1 vs 0.5) over
/// unrelated seeds.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_issue_example_parses_and_extra_keys_are_ignored() {
        let text = r#"
            filler   = "The grass is green. The sky is blue."
            needle   = "The secret pass key is {key}. Remember it."
            question = "What is the secret pass key?"
            facts    = ["{key}"]
            key_seed = 7
            note     = "written by a user"
        "#;
        let spec = NeedleSpec::from_toml(text).unwrap();
        assert_eq!(spec.key_seed, 7);
        assert_eq!(spec.facts, ["{key}"]);
        assert!(spec.uses_key());
    }

    #[test]
    fn a_literal_spec_has_no_key_and_keeps_its_facts() {
        let text = r#"
            filler   = "Nothing happens here."
            needle   = "The code is FROSTBLOCK-7 and the tag is VcMYb4."
            question = "What are the code and the tag?"
            facts    = ["FROSTBLOCK-7", "VcMYb4"]
        "#;
        let spec = NeedleSpec::from_toml(text).unwrap();
        assert_eq!(spec.key(2048, 0.5), None);
        assert_eq!(NeedleSpec::fill(&spec.needle, None), spec.needle);
    }

    #[test]
    fn unusable_specs_are_typed_errors() {
        let missing = "filler = \"a.\"\nneedle = \"b\"\nquestion = \"c\"";
        assert!(matches!(
            NeedleSpec::from_toml(missing),
            Err(NeedleError::Toml(_))
        ));
        let no_facts = "filler = \"a.\"\nneedle = \"b\"\nquestion = \"c\"\nfacts = []";
        assert!(matches!(
            NeedleSpec::from_toml(no_facts),
            Err(NeedleError::Spec(_))
        ));
        let blank = "filler = \"  \"\nneedle = \"b\"\nquestion = \"c\"\nfacts = [\"b\"]";
        assert!(matches!(
            NeedleSpec::from_toml(blank),
            Err(NeedleError::Spec(_))
        ));
        let orphan_key = "filler = \"a.\"\nneedle = \"b\"\nquestion = \"c\"\nfacts = [\"{key}\"]";
        assert!(matches!(
            NeedleSpec::from_toml(orphan_key),
            Err(NeedleError::Spec(_))
        ));
        let base = "filler = \"a.\"\nneedle = \"k {key}\"\nquestion = \"c\"\nfacts = [\"{key}\"]\n";
        for prefix in ["answer_prefix = \" \"", "answer_prefix = \"It is {key}\""] {
            assert!(matches!(
                NeedleSpec::from_toml(&format!("{base}{prefix}")),
                Err(NeedleError::Spec(_))
            ));
        }
        let cued = NeedleSpec::from_toml(&format!("{base}answer_prefix = \"The key is\"")).unwrap();
        assert_eq!(cued.answer_prefix.as_deref(), Some("The key is"));
    }

    #[test]
    fn the_builtin_specs_are_valid_and_round_trip_through_toml() {
        for spec in [NeedleSpec::builtin(), NeedleSpec::builtin_completion()] {
            spec.validate().unwrap();
            let text = toml::to_string(&spec).unwrap();
            assert_eq!(NeedleSpec::from_toml(&text).unwrap(), spec);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, rng_seed: proptest::test_runner::RngSeed::Fixed(6), ..ProptestConfig::default() })]

        /// Keys are 5-digit, a pure function of (seed, context, depth), and the filled facts
        /// carry them.
        #[test]
        fn keys_are_five_digit_and_deterministic(seed in any::<u64>(), context in 1usize..1 << 20, depth in 0.0f64..=1.0) {
            let spec = NeedleSpec { key_seed: seed, ..NeedleSpec::builtin() };
            let key = spec.key(context, depth).unwrap();
            prop_assert!((10_000..100_000).contains(&key));
            prop_assert_eq!(spec.key(context, depth), Some(key));
            let fact = NeedleSpec::fill(&spec.facts[0], Some(key));
            prop_assert_eq!(fact, key.to_string());
        }
    }

    #[test]
    fn keys_differ_between_cells_and_seeds() {
        let spec = NeedleSpec::builtin();
        let mut keys: Vec<u32> = [1024usize, 2048, 4096]
            .iter()
            .flat_map(|&c| [0.1, 0.5, 0.9].map(|d| spec.key(c, d).unwrap()))
            .collect();
        let other = NeedleSpec {
            key_seed: 8,
            ..NeedleSpec::builtin()
        };
        keys.push(other.key(1024, 0.1).unwrap());
        let count = keys.len();
        keys.sort_unstable();
        keys.dedup();
        // 10 draws from 90 000 values collide with probability < 1e-3; these fixed draws don't.
        assert_eq!(keys.len(), count);
    }
}
