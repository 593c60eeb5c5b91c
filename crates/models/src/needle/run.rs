//! One cell of the needle grid: build the prompt, prefill it in chunks through the compressed
//! cache, decode greedily, score the answer.

use serde::Serialize;
use tq_cache::allocation::Allocation;
use tq_cache::attention::AttentionKernel;

use crate::causal_lm::CausalLm;
use crate::llama::generate::{generate, generate_with};
use crate::llama::{CpuAttention, GenerationOptions, Sampler};
use crate::tokenizer::Tokenizer;

use super::attention::NeedleAttentionProbe;
use super::exact::{ExactChoice, ExactNeedle, ExactNeedleAttention};
use super::kept::KeptTokens;
use super::prompt::{NeedlePrompt, build_prompt};
use super::score::score;
use super::window_attention::WindowAttentionProbe;
use super::{NeedleError, NeedleSpec, PromptStyle};

/// How to run a cell.
#[derive(Clone, Debug)]
pub struct NeedleOptions {
    /// New tokens at most (a 5-digit key and a short sentence need about 15).
    pub max_tokens: usize,
    /// Prompt tokens per forward call: each chunk attends to the compressed past.
    pub prefill_chunk: usize,
    /// CPU attention kernel.
    pub kernel: AttentionKernel,
    /// Also measure the weight each query head puts on the needle while answering
    /// ([`NeedleRow::needle_attention`]): the prompt's last token and every answer token are
    /// scored a second time against the exact keys.
    pub needle_attention: bool,
    /// An oracle for per-token precision: chosen tokens read exactly (their keys, values or
    /// both, in the given layers) — the needle's own, or those a heavy-hitter policy keeps
    /// ([`ExactChoice`]) — every other token as the cache stores it ([`ExactNeedle`]). Not
    /// with the other two instruments.
    pub exact_needle: Option<ExactNeedle>,
    /// With `Some(w)`: rank every token, per layer, by the attention it receives (exact keys)
    /// from the queries of the `w` tokens from it on — what a heavy-hitter policy could see
    /// before a window of `w` tokens writes its codes ([`NeedleRow::needle_window_ranks`]).
    /// Not with the other two instruments.
    pub window_attention: Option<usize>,
}

impl Default for NeedleOptions {
    fn default() -> Self {
        Self {
            max_tokens: 32,
            prefill_chunk: 256,
            kernel: AttentionKernel::Fused,
            needle_attention: false,
            exact_needle: None,
            window_attention: None,
        }
    }
}

/// The outcome of one (allocation, context, depth) cell.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct NeedleRow {
    /// Allocation name.
    pub alloc: String,
    /// Requested context in tokens.
    pub context: usize,
    /// Requested needle depth.
    pub depth: f64,
    /// The spec's `key_seed` (which pass key this cell hid).
    pub key_seed: u64,
    /// Facts found with exact case.
    pub facts_found: usize,
    /// Facts asked for.
    pub facts_total: usize,
    /// Share of facts found with exact case.
    pub score: f64,
    /// Share of facts found ignoring case.
    pub score_case_insensitive: f64,
    /// The model's answer.
    pub answer: String,
    /// The facts with the key filled in (what the answer was searched for).
    pub expected: Vec<String>,
    /// Prompt tokens (the real context length).
    pub prompt_tokens: usize,
    /// Token index of the needle in the prompt.
    pub needle_token: usize,
    /// Cache bytes per token (all layers, keys and values), by the layout formula.
    pub cache_bytes_per_token: usize,
    /// Prompt tokens per second.
    pub prefill_tokens_per_s: f64,
    /// Decode steps per second.
    pub decode_tokens_per_s: f64,
    /// With [`NeedleOptions::needle_attention`]: per layer and query head, the mean softmax
    /// weight on the needle's tokens over the prompt's last token and the answer tokens, from
    /// the exact keys (the model's own attention; where it is large, the head retrieves).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub needle_attention: Option<Vec<Vec<f32>>>,
    /// With [`NeedleOptions::exact_needle`]: what was read exactly, and how many (query row,
    /// query head) outputs of all layers were swapped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exact_needle: Option<(ExactNeedle, usize)>,
    /// With [`ExactChoice::HeavyHitters`] or [`ExactChoice::Every`]: per layer, the share of
    /// the decided tokens kept (over the KV heads).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exact_kept: Option<Vec<f64>>,
    /// With [`NeedleOptions::window_attention`]: per layer, each needle token's rank among
    /// all tokens by the attention it received in the window, as a fraction of the tokens (0:
    /// received the most).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub needle_window_ranks: Option<Vec<Vec<f64>>>,
    /// With an allocation that keeps heavy hitters: what the cache kept by the end of the
    /// cell (the share of the tokens decided, and per layer of the needle's tokens).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heavy_hitters: Option<KeptTokens>,
}

impl NeedleRow {
    /// Whether every fact was found with exact case.
    pub fn hit(&self) -> bool {
        self.facts_total > 0 && self.facts_found == self.facts_total
    }
}

/// Runs one cell: the prompt of `spec` at `context` tokens with the needle at `depth`, framed
/// by the model's [`PromptStyle`], over a fresh cache with `allocation` (reported as
/// `alloc_name`).
#[allow(clippy::too_many_arguments)]
pub fn run_cell(
    model: &dyn CausalLm,
    tokenizer: &Tokenizer,
    spec: &NeedleSpec,
    alloc_name: &str,
    allocation: &Allocation,
    context: usize,
    depth: f64,
    options: &NeedleOptions,
) -> Result<NeedleRow, NeedleError> {
    let style = PromptStyle::for_model(model.file());
    let prompt = build_prompt(tokenizer, &style, spec, context, depth)?;
    run_prompt(
        model, tokenizer, &prompt, alloc_name, allocation, context, depth, options,
    )
}

/// Runs an already built prompt (callers that run one prompt over several allocations build it
/// once); `context` and `depth` are recorded in the row as requested.
#[allow(clippy::too_many_arguments)]
pub fn run_prompt(
    model: &dyn CausalLm,
    tokenizer: &Tokenizer,
    prompt: &NeedlePrompt,
    alloc_name: &str,
    allocation: &Allocation,
    context: usize,
    depth: f64,
    options: &NeedleOptions,
) -> Result<NeedleRow, NeedleError> {
    let needed = prompt.tokens.len() + options.max_tokens;
    if needed > model.dims().context_length {
        return Err(NeedleError::ContextTooLong {
            needed,
            limit: model.dims().context_length,
        });
    }
    let mut cache = model.new_cache(allocation, needed)?;
    let stop_tokens: Vec<u32> = ["<|im_end|>", "<|endoftext|>", "<end_of_turn>"]
        .iter()
        .filter_map(|t| tokenizer.token_id(t))
        .chain(tokenizer.eos_id())
        .collect();
    let generation_options = GenerationOptions {
        max_tokens: options.max_tokens,
        prefill_chunk: options.prefill_chunk,
        kernel: options.kernel,
        stop_tokens,
    };
    let instruments = usize::from(options.needle_attention)
        + usize::from(options.exact_needle.is_some())
        + usize::from(options.window_attention.is_some());
    if instruments > 1 {
        return Err(NeedleError::Options(
            "the needle-attention probe, the exact-needle oracle and the window-attention \
             probe run one at a time"
                .into(),
        ));
    }
    let mut exact_needle = None;
    let mut exact_kept = None;
    let mut needle_window_ranks = None;
    let (generation, needle_attention) = if let Some(window) = options.window_attention {
        let attention = CpuAttention {
            cache: &mut cache,
            kernel: options.kernel,
        };
        let mut probe = WindowAttentionProbe::new(attention, model.dims().layers, window);
        let generation = generate_with(
            model,
            &mut probe,
            0,
            &prompt.tokens,
            &mut Sampler::Greedy,
            &generation_options,
            |_| {},
        )?;
        needle_window_ranks = Some(
            probe
                .into_record()
                .needle_ranks(prompt.needle_token..prompt.needle_end),
        );
        (generation, None)
    } else if let Some(exact) = &options.exact_needle {
        let attention = CpuAttention {
            cache: &mut cache,
            kernel: options.kernel,
        };
        let mut oracle = ExactNeedleAttention::new(
            attention,
            model.dims().layers,
            prompt.needle_token..prompt.needle_end,
            prompt.tokens.len().saturating_sub(1),
            exact.clone(),
        );
        let generation = generate_with(
            model,
            &mut oracle,
            0,
            &prompt.tokens,
            &mut Sampler::Greedy,
            &generation_options,
            |_| {},
        )?;
        exact_needle = Some((exact.clone(), oracle.swapped().iter().sum()));
        if !matches!(exact.choice, ExactChoice::Needle) {
            exact_kept = Some(oracle.kept_share());
        }
        (generation, None)
    } else if options.needle_attention {
        let attention = CpuAttention {
            cache: &mut cache,
            kernel: options.kernel,
        };
        let last = prompt.tokens.len().saturating_sub(1);
        let mut probe = NeedleAttentionProbe::new(
            attention,
            model.dims().layers,
            prompt.needle_token..prompt.needle_end,
            last,
        );
        let generation = generate_with(
            model,
            &mut probe,
            0,
            &prompt.tokens,
            &mut Sampler::Greedy,
            &generation_options,
            |_| {},
        )?;
        (generation, Some(probe.into_record().mean_per_head()))
    } else {
        let generation = generate(
            model,
            &mut cache,
            &prompt.tokens,
            &mut Sampler::Greedy,
            &generation_options,
            |_| {},
        )?;
        (generation, None)
    };
    let answer = tokenizer.decode(&generation.tokens)?;
    let found = score(&answer, &prompt.facts);
    let cache_bytes_per_token = cache.memory().iter().map(|m| m.bytes_per_token).sum();
    let heavy_hitters = KeptTokens::of(
        &cache,
        model.dims().layers,
        prompt.needle_token..prompt.needle_end,
    );
    Ok(NeedleRow {
        alloc: alloc_name.to_owned(),
        context,
        depth,
        key_seed: prompt.key_seed,
        facts_found: found.found,
        facts_total: found.total,
        score: found.score(),
        score_case_insensitive: found.score_case_insensitive(),
        answer,
        expected: prompt.facts.clone(),
        prompt_tokens: prompt.tokens.len(),
        needle_token: prompt.needle_token,
        cache_bytes_per_token,
        prefill_tokens_per_s: generation.prefill_tokens_per_s(),
        decode_tokens_per_s: generation.decode_tokens_per_s(),
        needle_attention,
        exact_needle,
        exact_kept,
        needle_window_ranks,
        heavy_hitters,
    })
}
