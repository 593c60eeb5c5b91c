//! `tq perplexity`: perplexity and KL divergence of allocations in the reference engine's
//! `llama-perplexity` protocol (chunks of `--ctx` tokens from an empty cache, the second half
//! of each scored), so its rows compare with that engine's.

use std::path::{Path, PathBuf};

use clap::Args;
use tq_cache::allocation::Allocation;
use tq_models::eval::{PerplexityOptions, PerplexityReport, perplexity};
use tq_models::fetch::ModelSpec;
use tq_models::tokenizer::Tokenizer;

use super::eval::load_allocations;
use super::kernel::KernelChoice;
use super::model::open_model;
use super::needle::progress;
use crate::output::table;

/// Arguments of `tq perplexity`.
#[derive(Args, Debug)]
pub struct PerplexityArgs {
    /// The text (plain UTF-8), e.g. /usr/share/common-licenses/GPL-3. Read whole, one
    /// trailing newline dropped, tokenized once.
    #[arg(long)]
    text: PathBuf,
    /// Tokens per chunk (the reference engine's `-c`).
    #[arg(long, default_value_t = 512)]
    ctx: usize,
    /// Allocations: preset names or TOML files, comma-separated; `all` for every preset,
    /// `recommended` for the recommended ones (about 4.25, 3.25 and 2.5 bits per value).
    #[arg(long, value_delimiter = ',', default_value = "f16")]
    alloc: Vec<String>,
    /// Also compare every allocation's next-token distributions with the base allocation's
    /// (mean, median and 99th-percentile KL divergence, same top token).
    #[arg(long)]
    kl_divergence: bool,
    /// The base allocation of `--kl-divergence`.
    #[arg(long, default_value = "f16")]
    base: String,
    /// Attention kernel of every run: `fused`, or `llamacpp` (the reference engine's f16 kernel
    /// and model numerics for this model; f16 caches only).
    #[arg(long, value_enum, default_value = "fused")]
    kernel: KernelChoice,
    /// Tokens per forward call inside a chunk (prefill chunking through the cache under test).
    #[arg(long, default_value_t = 256)]
    prefill_chunk: usize,
    /// Run at most this many chunks.
    #[arg(long)]
    chunks: Option<usize>,
    /// Print one JSON object per allocation (an array) instead of a table.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    budget: super::limits::CacheBudgetArgs,
    /// The model: `smollm2` (the reference model, the default), `gemma3-270m` (fetched on
    /// first use) or a .gguf file.
    #[arg(long)]
    model: Option<ModelSpec>,
}

/// The text as the reference engine's `-f` reads it: the whole file, one trailing newline
/// dropped.
pub(crate) fn protocol_text(path: &Path) -> Result<String, Box<dyn std::error::Error>> {
    let mut text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read the text {}: {e}", path.display()))?;
    if text.ends_with('\n') {
        text.pop();
    }
    Ok(text)
}

/// Runs `tq perplexity`.
pub fn run(args: &PerplexityArgs) -> Result<(), Box<dyn std::error::Error>> {
    let allocations = load_allocations(&args.alloc)?;
    let base = if args.kl_divergence {
        Some(Allocation::load(&args.base)?)
    } else {
        None
    };
    let mut model = open_model(&args.model)?;
    let kernel = args.kernel.apply(model.as_mut());
    let model = &*model;
    for allocation in allocations.iter().map(|(_, a)| a).chain(&base) {
        args.kernel.check(model, allocation)?;
    }
    super::limits::check_run(
        model,
        allocations.iter().map(|(_, a)| a).chain(&base),
        args.ctx,
        "--ctx",
        &args.budget,
    )?;
    let tokenizer = Tokenizer::from_gguf(model.file())?;
    let tokens = tokenizer.encode(&protocol_text(&args.text)?)?;
    let bos = if tokenizer.add_bos() {
        tokenizer.bos_id()
    } else {
        None
    };
    let options = PerplexityOptions {
        ctx: args.ctx,
        prefill_chunk: args.prefill_chunk,
        kernel,
        max_chunks: args.chunks,
    };
    let bar = progress(0);
    let report = perplexity(
        model,
        &tokens,
        bos,
        base.as_ref().map(|b| (b.name.as_str(), b)),
        &allocations,
        &options,
        |done, total| {
            bar.set_length(total as u64);
            bar.set_position(done as u64);
        },
    )?;
    bar.finish_and_clear();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report.rows)?);
    } else {
        println!("{}", report_table(&report));
        println!("\n{}", footer(&report));
    }
    Ok(())
}

fn optional(value: Option<f64>, digits: usize) -> String {
    value.map_or_else(|| "-".to_string(), |v| format!("{v:.digits$}"))
}

/// One line per allocation.
pub(crate) fn report_table(report: &PerplexityReport) -> String {
    let rows: Vec<Vec<String>> = report
        .rows
        .iter()
        .map(|r| {
            vec![
                format!("{}{}", r.alloc, if r.base { " (base)" } else { "" }),
                format!("{:.3}", r.bits_per_value),
                format!("{:.4} ± {:.4}", r.ppl, r.ppl_err),
                match (r.kld_mean, r.kld_err) {
                    (Some(m), Some(e)) => format!("{m:.5} ± {e:.5}"),
                    _ => "-".to_string(),
                },
                optional(r.kld_median, 5),
                optional(r.kld_p99, 4),
                optional(r.same_top_p, 2),
                format!("{:.1}", r.seconds),
            ]
        })
        .collect();
    table(
        &[
            "allocation",
            "bits/value",
            "PPL",
            "KLD mean",
            "KLD median",
            "KLD p99",
            "same top %",
            "seconds",
        ],
        &rows,
    )
}

fn footer(report: &PerplexityReport) -> String {
    let scored = report.rows.first().map_or(0, |r| r.scored_tokens);
    format!(
        "{} text tokens → {} chunks of {} (remainder dropped), each from an empty cache in \
         prefill pieces of {}, the second half scored: {} tokens; kernel {}. KLD in nats \
         against {}; bits/value: everything the cache stores at this context (codes, norms, \
         metadata, full-precision sinks and windows, means) per cached value.",
        report.text_tokens,
        report.chunks,
        report.ctx,
        report.prefill_chunk,
        scored,
        report.kernel,
        report
            .base
            .as_deref()
            .unwrap_or("no base (run with --kl-divergence)"),
    )
}
