//! `tq eval`: quality and memory figures of bit allocations on a real text, against the f16
//! cache (perplexity, next-token KL divergence, top-1 agreement, per layer attention-score
//! error, cache bytes per token, peak RSS).

use std::path::{Path, PathBuf};

use clap::Args;
use tq_cache::allocation::Allocation;
use tq_models::eval::{EvalOptions, EvalReport, evaluate};
use tq_models::fetch::ModelSpec;
use tq_models::tokenizer::Tokenizer;

use super::model::open_model;
use super::needle::progress;
use crate::output::table;

/// Arguments of `tq eval`.
#[derive(Args, Debug)]
pub struct EvalArgs {
    /// The text to run (plain UTF-8), e.g. /usr/share/common-licenses/GPL-3.
    #[arg(long)]
    text: PathBuf,
    /// Allocations: preset names or TOML files, comma-separated, `all` for every preset,
    /// `recommended` for the recommended ones.
    #[arg(long, value_delimiter = ',', default_value = "all")]
    alloc: Vec<String>,
    /// The reference allocation the KL divergence and top-1 agreement are taken against.
    #[arg(long, default_value = "f16")]
    reference: String,
    /// Text tokens to run (the text's first N; at most the model's context).
    #[arg(long, default_value_t = 1024)]
    tokens: usize,
    /// Tokens per prefill chunk (each chunk attends to the compressed past).
    #[arg(long, default_value_t = 256)]
    prefill_chunk: usize,
    /// Greedy decode steps timed after the text, per allocation (decode speed; 0: none).
    #[arg(long, default_value_t = 16)]
    decode_steps: usize,
    /// Skip the per layer attention-score error (faster; less memory).
    #[arg(long)]
    no_score_error: bool,
    /// Also print the per layer attention-score error table.
    #[arg(long)]
    per_layer: bool,
    /// Print the report as JSON instead of tables (progress stays on stderr).
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    budget: super::limits::CacheBudgetArgs,
    /// The model: `smollm2` (the reference model, the default), `gemma3-270m` (fetched on
    /// first use) or a .gguf file.
    #[arg(long)]
    model: Option<ModelSpec>,
}

/// Loads each allocation as `(name, allocation)`; `all` stands for every shipped preset,
/// `recommended` for the recommended ones.
pub(crate) fn load_allocations(
    names: &[String],
) -> Result<Vec<(String, Allocation)>, Box<dyn std::error::Error>> {
    let mut out: Vec<(String, Allocation)> = Vec::new();
    for name in names {
        let loaded = if name == "all" {
            Allocation::preset_names()
                .map(Allocation::preset)
                .collect::<Result<Vec<_>, _>>()?
        } else if name == "recommended" {
            Allocation::recommended_names()
                .map(Allocation::preset)
                .collect::<Result<Vec<_>, _>>()?
        } else {
            vec![Allocation::load(name)?]
        };
        for allocation in loaded {
            if out.iter().any(|(n, _)| *n == allocation.name) {
                return Err(format!(
                    "two allocations are named `{}`: names label rows and plots, give each file its own",
                    allocation.name
                )
                .into());
            }
            out.push((allocation.name.clone(), allocation));
        }
    }
    Ok(out)
}

/// The first `limit` tokens of the text file (and at most `context`).
pub(crate) fn text_tokens(
    tokenizer: &Tokenizer,
    path: &Path,
    limit: usize,
    context: usize,
) -> Result<Vec<u32>, Box<dyn std::error::Error>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read the text {}: {e}", path.display()))?;
    let mut tokens = tokenizer.encode(&text)?;
    tokens.truncate(limit.min(context));
    if tokens.len() < limit.min(context) {
        eprintln!(
            "note: {} has only {} tokens (asked for {limit})",
            path.display(),
            tokens.len()
        );
    }
    Ok(tokens)
}

/// Runs `tq eval`.
pub fn run(args: &EvalArgs) -> Result<(), Box<dyn std::error::Error>> {
    let allocations = load_allocations(&args.alloc)?;
    let reference = Allocation::load(&args.reference)?;
    let model = open_model(&args.model)?;
    let model = &*model;
    super::limits::check_run(
        model,
        allocations.iter().map(|(_, a)| a).chain([&reference]),
        args.tokens + args.decode_steps,
        "--tokens plus --decode-steps",
        &args.budget,
    )?;
    let tokenizer = Tokenizer::from_gguf(model.file())?;
    let tokens = text_tokens(
        &tokenizer,
        &args.text,
        args.tokens,
        model.dims().context_length,
    )?;
    let options = EvalOptions {
        prefill_chunk: args.prefill_chunk,
        score_error: !args.no_score_error,
        decode_steps: args.decode_steps,
        ..EvalOptions::default()
    };
    let bar = progress(0);
    let report = evaluate(
        model,
        &tokens,
        (&reference.name, &reference),
        &allocations,
        &options,
        |done, total| {
            bar.set_length(total as u64);
            bar.set_position(done as u64);
        },
    )?;
    bar.finish_and_clear();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("{}", summary_table(&report));
        if args.per_layer && !args.no_score_error {
            println!("\n{}", layer_table(&report));
            println!("\n{}", distance_table(&report));
        }
        println!("\n{}", footer(&report));
    }
    Ok(())
}

/// One line per allocation: cost and quality.
pub(crate) fn summary_table(report: &EvalReport) -> String {
    let rows: Vec<Vec<String>> = report
        .rows
        .iter()
        .map(|r| {
            vec![
                r.alloc.clone(),
                format!("{:.3}", r.cost.bits_per_value),
                r.cost.bytes_per_token_formula.to_string(),
                format!("{:.1}", r.cost.bytes_per_token_allocated),
                format!("{:.3}", r.text.perplexity),
                format!("{:.5}", r.text.mean_kl),
                format!("{:.3}", r.text.max_kl),
                format!("{:.2}%", 100.0 * r.text.top1_agreement),
                format!("{:.4}", r.mean_score_error),
                format!("{:.4}", r.mean_weight_tv),
                db(r.key_distance_db),
                db(r.value_distance_db),
                format!("{:.1}", r.tokens_per_s),
                format!("{:.1}", r.decode_tokens_per_s),
            ]
        })
        .collect();
    table(
        &[
            "allocation",
            "bits/value",
            "B/token",
            "B/token alloc",
            "perplexity",
            "KL mean",
            "KL max",
            "top-1",
            "score err",
            "weight TV",
            "K dB",
            "V dB",
            "prefill tok/s",
            "decode tok/s",
        ],
        &rows,
    )
}

/// A distance to the rate-distortion limit in dB, or `-` when not measured.
fn db(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_string(), |v| format!("{v:.2}"))
}

/// Layers down, allocations across: key and value distance to the rate-distortion limit
/// (dB above `4^(−b)`, `b` the layer's all-in bits).
fn distance_table(report: &EvalReport) -> String {
    let layers = report
        .rows
        .iter()
        .map(|r| r.layer_key_distance_db.len())
        .max()
        .unwrap_or(0);
    let mut header = vec!["layer".to_string()];
    for r in &report.rows {
        header.push(format!("{} K dB", r.alloc));
        header.push(format!("{} V dB", r.alloc));
    }
    let rows: Vec<Vec<String>> = (0..layers)
        .map(|l| {
            let mut row = vec![l.to_string()];
            for r in &report.rows {
                row.push(db(r.layer_key_distance_db.get(l).copied().flatten()));
                row.push(db(r.layer_value_distance_db.get(l).copied().flatten()));
            }
            row
        })
        .collect();
    let header: Vec<&str> = header.iter().map(String::as_str).collect();
    table(&header, &rows)
}

/// Layers down, allocations across: relative attention-score error.
fn layer_table(report: &EvalReport) -> String {
    let layers = report
        .rows
        .iter()
        .map(|r| r.layer_score_error.len())
        .max()
        .unwrap_or(0);
    let mut header = vec!["layer".to_string()];
    header.extend(report.rows.iter().map(|r| r.alloc.clone()));
    let rows: Vec<Vec<String>> = (0..layers)
        .map(|l| {
            let mut row = vec![l.to_string()];
            row.extend(report.rows.iter().map(|r| {
                r.layer_score_error
                    .get(l)
                    .map_or_else(String::new, |e| format!("{e:.4}"))
            }));
            row
        })
        .collect();
    let header: Vec<&str> = header.iter().map(String::as_str).collect();
    table(&header, &rows)
}

/// What the columns mean, the run's size and its peak RSS.
pub(crate) fn footer(report: &EvalReport) -> String {
    let rss = match report.peak_rss_bytes {
        Some(bytes) => format!(
            "{:.1} MiB{}",
            bytes as f64 / 1_048_576.0,
            if report.peak_rss_reset {
                " (from the start of the evaluation)"
            } else {
                " (whole process)"
            }
        ),
        None => "unavailable".to_string(),
    };
    format!(
        "{} text tokens in chunks of {}, kernel {}; KL = mean KL(P_{} ‖ P) in nats over {} \
         positions; score err = ‖s̃ − s‖/‖s‖ of the attention scores against exact keys, mean \
         over layers; weight TV = mean total-variation distance of the attention weights; K dB / \
         V dB = distance of the compressed body's key / value error to the rate-distortion \
         limit, 10·log10(Σ‖x − x̃‖²/Σ‖x‖² · 4^b) with b the all-in bits per value (0 dB is the \
         limit); \
         B/token = cache bytes per token by formula, B/token alloc = allocated bytes per slot \
         (positions included). Peak RSS: {rss}.",
        report.tokens,
        report.prefill_chunk,
        report.kernel,
        report.reference,
        report.tokens.saturating_sub(1),
    )
}
