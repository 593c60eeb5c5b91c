//! Laying out a needle prompt in tokens: filler sentences repeated to the context length, the
//! needle on a sentence boundary at the requested depth, the question after the haystack, all
//! framed by a [`PromptStyle`].

use crate::tokenizer::Tokenizer;

use super::{NeedleError, NeedleSpec, PromptStyle};

/// A built prompt and where its parts sit.
#[derive(Clone, Debug, PartialEq)]
pub struct NeedlePrompt {
    /// The rendered prompt (framing applied).
    pub text: String,
    /// Its tokens.
    pub tokens: Vec<u32>,
    /// The pass key, if the spec draws one.
    pub key: Option<u32>,
    /// The spec's `key_seed`, which drew the key.
    pub key_seed: u64,
    /// The facts with the key filled in.
    pub facts: Vec<String>,
    /// Token index where the haystack (filler and needle) starts.
    pub haystack_start: usize,
    /// Token index just after the haystack (the question follows).
    pub haystack_end: usize,
    /// Token index of the needle's first token.
    pub needle_token: usize,
    /// Token index just after the needle.
    pub needle_end: usize,
    /// Filler sentences in the haystack.
    pub filler_sentences: usize,
}

impl NeedlePrompt {
    /// Where the needle landed: the filler tokens before it over all filler tokens (0 = first,
    /// 1 = last, as the depth is requested).
    pub fn needle_depth(&self) -> f64 {
        let filler =
            (self.haystack_end - self.haystack_start) - (self.needle_end - self.needle_token);
        (self.needle_token - self.haystack_start) as f64 / filler.max(1) as f64
    }
}

/// The filler split after each `.`, `!` or `?` that ends a sentence, trimmed, empty pieces
/// dropped.
pub fn sentences(filler: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    let bytes = filler.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        let ends = matches!(b, b'.' | b'!' | b'?')
            && bytes
                .get(i + 1)
                .is_none_or(|next| next.is_ascii_whitespace());
        if ends {
            out.push(filler[start..=i].trim());
            start = i + 1;
        }
    }
    out.push(filler[start..].trim());
    out.retain(|s| !s.is_empty());
    out
}

/// Builds the prompt of `spec` at `context` tokens (the whole prompt, framing included, within
/// about one filler sentence) with the needle at `depth` ∈ [0, 1] of the haystack, framed by
/// `style`.
pub fn build_prompt(
    tokenizer: &Tokenizer,
    style: &PromptStyle,
    spec: &NeedleSpec,
    context: usize,
    depth: f64,
) -> Result<NeedlePrompt, NeedleError> {
    if !(0.0..=1.0).contains(&depth) {
        return Err(NeedleError::Depth(depth));
    }
    spec.validate()?;
    let key = spec.key(context, depth);
    let needle = NeedleSpec::fill(spec.needle.trim(), key);
    let question = NeedleSpec::fill(spec.question.trim(), key);
    let facts: Vec<String> = spec
        .facts
        .iter()
        .map(|f| NeedleSpec::fill(f, key))
        .collect();
    let render = |haystack: &str| style.render(haystack, &question, spec.answer_prefix.as_deref());

    let overhead = tokenizer.encode(&render(&needle).0)?.len();
    if overhead > context {
        return Err(NeedleError::ContextTooShort {
            context,
            needed: overhead,
        });
    }
    let filler = sentences(&spec.filler);
    // Mid-text every sentence follows a space, which the GPT-2 pattern attaches to its first
    // word (and SentencePiece to the word's piece): count each sentence that way, without the
    // BOS token `encode` may prepend.
    let bos = usize::from(tokenizer.add_bos() && tokenizer.bos_id().is_some());
    let costs = filler
        .iter()
        .map(|s| {
            Ok(tokenizer
                .encode(&format!(" {s}"))?
                .len()
                .saturating_sub(bos)
                .max(1))
        })
        .collect::<Result<Vec<usize>, NeedleError>>()?;
    let budget = context - overhead;
    let mut cumulative = vec![0usize];
    loop {
        let total = *cumulative.last().unwrap_or(&0);
        let cost = costs[(cumulative.len() - 1) % costs.len()];
        // Take the next sentence while that lands closer to the budget than stopping.
        if total + cost > budget && total + cost - budget >= budget.saturating_sub(total) {
            break;
        }
        cumulative.push(total + cost);
    }
    let count = cumulative.len() - 1;
    let total = cumulative[count] as f64;
    let insert_at = (0..=count)
        .min_by(|&a, &b| {
            let da = (cumulative[a] as f64 - depth * total).abs();
            let db = (cumulative[b] as f64 - depth * total).abs();
            da.total_cmp(&db)
        })
        .unwrap_or(0);
    let pieces: Vec<&str> = (0..count).map(|i| filler[i % filler.len()]).collect();
    let before = pieces[..insert_at].join(" ");
    let after = pieces[insert_at..].join(" ");
    let mut haystack = before.clone();
    for part in [needle.as_str(), after.as_str()] {
        if part.is_empty() {
            continue;
        }
        if !haystack.is_empty() {
            haystack.push(' ');
        }
        haystack.push_str(part);
    }
    let (text, haystack_at) = render(&haystack);
    if text.get(haystack_at..haystack_at + haystack.len()) != Some(haystack.as_str()) {
        return Err(NeedleError::Spec(
            "the chat template altered the user message".into(),
        ));
    }
    let tokens = tokenizer.encode(&text)?;
    // Cuts fall where the pre-tokenizer splits anyway (before a space-led word or after the
    // template's newline), so a prefix's tokens are the prompt's first tokens.
    let tokens_before = |bytes: usize| -> Result<usize, NeedleError> {
        Ok(tokenizer.encode(&text[..haystack_at + bytes])?.len())
    };
    Ok(NeedlePrompt {
        haystack_start: tokens_before(0)?,
        needle_token: tokens_before(before.len())?,
        needle_end: tokens_before(before.len() + usize::from(!before.is_empty()) + needle.len())?,
        haystack_end: tokens_before(haystack.len())?,
        text,
        tokens,
        key,
        key_seed: spec.key_seed,
        facts,
        filler_sentences: count,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::ChatTemplate;
    use crate::tokenizer::{BpeVocab, PreTokenizerKind, TokenType};
    use proptest::prelude::*;

    /// A byte-level tokenizer with a few merges and the ChatML control tokens: real BPE
    /// behaviour (space-led words, digits split) without the model file.
    fn tokenizer() -> Tokenizer {
        tokenizer_with_bos(false)
    }

    /// [`tokenizer`], prepending a BOS token `<s>` when `bos` (as base models' files ask).
    fn tokenizer_with_bos(bos: bool) -> Tokenizer {
        let mut tokens: Vec<String> = (0..=255u8)
            .map(|b| Tokenizer::byte_token(b).to_string())
            .collect();
        let mut token_types = vec![TokenType::Normal; 256];
        let merges = ["Ġ T", "h e", "ĠT he", "i s", "Ġ is", "e e", "r e"];
        for merge in merges {
            tokens.push(merge.replace(' ', ""));
            token_types.push(TokenType::Normal);
        }
        for control in ["<|im_start|>", "<|im_end|>", "<s>"] {
            tokens.push(control.to_owned());
            token_types.push(TokenType::Control);
        }
        let bos_id = (tokens.len() - 1) as u32;
        Tokenizer::from_vocab(BpeVocab {
            tokens,
            token_types,
            merges: merges.iter().map(|m| (*m).to_owned()).collect(),
            pre_tokenizer: PreTokenizerKind::DigitsThenGpt2,
            bos_id: bos.then_some(bos_id),
            eos_id: None,
            add_bos: bos,
            add_eos: false,
        })
        .unwrap()
    }

    fn longest_sentence(tokenizer: &Tokenizer, spec: &NeedleSpec) -> usize {
        sentences(&spec.filler)
            .iter()
            .map(|s| tokenizer.encode(&format!(" {s}")).unwrap().len())
            .max()
            .unwrap()
    }

    #[test]
    fn sentences_split_on_terminal_punctuation_only() {
        assert_eq!(
            sentences("The grass is green. Version 1.5 is out! Why? trailing words"),
            [
                "The grass is green.",
                "Version 1.5 is out!",
                "Why?",
                "trailing words"
            ]
        );
        assert!(sentences("   ").is_empty());
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, rng_seed: proptest::test_runner::RngSeed::Fixed(11), ..ProptestConfig::default() })]

        /// The prompt is within one filler sentence of the target length, the needle sits on a
        /// sentence boundary within one sentence of the requested depth, and the question
        /// follows the haystack — in a chat prompt, and in a completion prompt with an answer
        /// cue and a BOS token (a base model's).
        #[test]
        fn length_and_depth_are_on_target(context in 400usize..3000, depth in 0.0f64..=1.0, completion in any::<bool>()) {
            let tokenizer = tokenizer_with_bos(completion);
            let (spec, template, bos, tail) = if completion {
                let spec = NeedleSpec::builtin_completion();
                let tail = format!("\n\nQuestion: {}\nAnswer: The secret pass key is", spec.question);
                (spec, PromptStyle::Completion, "<s>", tail)
            } else {
                let spec = NeedleSpec::builtin();
                let tail = format!("\n\n{}<|im_end|>\n<|im_start|>assistant\n", spec.question);
                (spec, PromptStyle::Chat(ChatTemplate::smollm2()), "", tail)
            };
            let p = build_prompt(&tokenizer, &template, &spec, context, depth).unwrap();
            let sentence = longest_sentence(&tokenizer, &spec);
            // Half a sentence from choosing the count, plus one token each where the first
            // sentence and the needle gain or lose a leading space.
            prop_assert!(p.tokens.len().abs_diff(context) <= sentence / 2 + 2,
                "{} tokens for a target of {context}", p.tokens.len());
            let filler = (p.haystack_end - p.haystack_start - (p.needle_end - p.needle_token)) as f64;
            prop_assert!((p.needle_depth() - depth).abs() <= (sentence as f64 / 2.0 + 1.0) / filler,
                "needle at {} for depth {depth}", p.needle_depth());
            let needle = NeedleSpec::fill(&spec.needle, p.key);
            let from_needle = tokenizer.decode(&p.tokens[p.needle_token..]).unwrap();
            prop_assert!(from_needle.trim_start().starts_with(&needle), "{from_needle}");
            let before = tokenizer.decode(&p.tokens[..p.needle_token]).unwrap();
            prop_assert!(before.ends_with('.') || before.ends_with("user\n") || before == bos, "{before}");
            prop_assert_eq!(p.text.matches(&needle).count(), 1);
            let after = tokenizer.decode(&p.tokens[p.haystack_end..]).unwrap();
            prop_assert_eq!(after, tail);
            prop_assert_eq!(tokenizer.decode(&p.tokens).unwrap(), format!("{bos}{}", p.text));
            prop_assert_eq!(p.facts.clone(), vec![p.key.unwrap().to_string()]);
        }
    }

    #[test]
    fn the_same_cell_gives_the_same_prompt_and_the_seed_changes_only_the_key() {
        let tokenizer = tokenizer();
        let template = PromptStyle::Chat(ChatTemplate::smollm2());
        let spec = NeedleSpec::builtin();
        let a = build_prompt(&tokenizer, &template, &spec, 1024, 0.5).unwrap();
        let b = build_prompt(&tokenizer, &template, &spec, 1024, 0.5).unwrap();
        assert_eq!(a, b);
        let reseeded = NeedleSpec {
            key_seed: spec.key_seed + 1,
            ..spec.clone()
        };
        let c = build_prompt(&tokenizer, &template, &reseeded, 1024, 0.5).unwrap();
        assert_ne!(a.key, c.key);
        let (ka, kc) = (a.key.unwrap().to_string(), c.key.unwrap().to_string());
        assert_eq!(a.text.replace(&ka, "KEY"), c.text.replace(&kc, "KEY"));
    }

    #[test]
    fn depth_zero_and_one_put_the_needle_at_the_ends() {
        let tokenizer = tokenizer();
        let template = PromptStyle::Chat(ChatTemplate::smollm2());
        let spec = NeedleSpec::builtin();
        let first = build_prompt(&tokenizer, &template, &spec, 800, 0.0).unwrap();
        assert_eq!(first.needle_token, first.haystack_start);
        let last = build_prompt(&tokenizer, &template, &spec, 800, 1.0).unwrap();
        let needle = NeedleSpec::fill(&spec.needle, last.key);
        let tail = tokenizer
            .decode(&last.tokens[last.needle_token..last.haystack_end])
            .unwrap();
        assert_eq!(tail.trim_start(), needle);
    }

    #[test]
    fn bad_depths_and_short_contexts_are_typed_errors() {
        let tokenizer = tokenizer();
        let template = PromptStyle::Chat(ChatTemplate::smollm2());
        let spec = NeedleSpec::builtin();
        for depth in [-0.1, 1.5, f64::NAN] {
            assert!(matches!(
                build_prompt(&tokenizer, &template, &spec, 1024, depth),
                Err(NeedleError::Depth(_))
            ));
        }
        assert!(matches!(
            build_prompt(&tokenizer, &template, &spec, 20, 0.5),
            Err(NeedleError::ContextTooShort { context: 20, .. })
        ));
    }
}
