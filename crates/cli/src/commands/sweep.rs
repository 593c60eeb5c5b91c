//! `tq sweep`: every allocation file through the quality evaluation (`tq eval`) and the needle
//! grid (`tq needle`), then one table and three plots of what each costs and keeps: bits per
//! value against KL divergence, against needle score and against decode speed, with the Pareto
//! front marked. Adding an allocation is adding a TOML file to the command line.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use clap::Args;
use serde::Serialize;
use tq_cache::allocation::Allocation;
use tq_cache::allocation::StreamKind;
use tq_models::eval::sensitivity::{
    BitStep, bytes_per_token, raised, rank, spend_budget, stepped, stream_bits, trade_prefixes,
    traded,
};
use tq_models::eval::{EvalOptions, EvalReport, evaluate};
use tq_models::fetch::ModelSpec;
use tq_models::limits::all_in_bits_bound;
use tq_models::needle::{
    CellOrder, NeedleGrid, NeedleOptions, NeedleRow, NeedleSpec, PromptStyle, run_grid,
};
use tq_models::tokenizer::Tokenizer;

use super::eval::{load_allocations, text_tokens};
use super::model::open_model;
use super::needle::progress;
use crate::plot::{Better, Point, Scatter, pareto_front, write_scatter};

/// Arguments of `tq sweep`.
#[derive(Args, Debug)]
pub struct SweepArgs {
    /// Allocation TOML files or preset names (`all` for every preset).
    #[arg(required_unless_present = "replot")]
    allocs: Vec<String>,
    /// Needle context lengths in tokens.
    #[arg(long, value_delimiter = ',', default_values_t = vec![1024])]
    contexts: Vec<usize>,
    /// Needle depths in [0, 1].
    #[arg(long, value_delimiter = ',', default_values_t = vec![0.1, 0.5, 0.9])]
    depths: Vec<f64>,
    /// A needle spec (TOML); default: the built-in pass key.
    #[arg(long)]
    spec: Option<PathBuf>,
    /// Skip the needle grid (the needle column and plot are left out).
    #[arg(long)]
    no_needle: bool,
    /// The text of the quality evaluation.
    #[arg(long, default_value = "/usr/share/common-licenses/GPL-3")]
    text: PathBuf,
    /// Text tokens of the quality evaluation.
    #[arg(long, default_value_t = 512)]
    tokens: usize,
    /// Greedy decode steps timed after the text (the decode-speed figure).
    #[arg(long, default_value_t = 32)]
    decode_steps: usize,
    /// Tokens per prefill chunk, for the evaluation and the needle prompts.
    #[arg(long, default_value_t = 256)]
    prefill_chunk: usize,
    /// New tokens at most per needle answer.
    #[arg(long, default_value_t = 24)]
    max_tokens: usize,
    /// Output folder (created): results.json, results.md and the plots.
    #[arg(long, default_value = "sweep")]
    out: PathBuf,
    /// The model: `smollm2` (the reference model, the default), `gemma3-270m` (fetched on
    /// first use) or a .gguf file.
    #[arg(long)]
    model: Option<ModelSpec>,
    /// Per layer sensitivity of the first allocation instead of the sweep: raise the keys or
    /// the values of one layer at a time to f16 and rank them by KL saved per extra byte.
    #[arg(long)]
    sensitivity: bool,
    /// With --sensitivity: also write the allocation that spends this many extra bytes per
    /// token best (greedy by rank), and evaluate it.
    #[arg(long, conflicts_with = "step_bits")]
    budget: Option<usize>,
    /// With --sensitivity: step each layer's keys and values one bit up and one bit down
    /// instead of raising them to f16, pair the raises that buy most with the lowerings that
    /// cost least at the same bytes, evaluate the trades and write the best as
    /// `OUT/<alloc>-trades<k>.toml` (its overrides for this model's depth only). Measure on a
    /// calibration text, then check the file on another one.
    #[arg(long, requires = "sensitivity")]
    step_bits: bool,
    /// With --step-bits: keep only trades whose all-in bits per value at the evaluated length
    /// stay within this budget (an upper bound from the allocation: codes, windows, sinks,
    /// means, the most a fitted basis stores; `tq_models::limits::all_in_bits_bound`). A
    /// trade moves code bits between streams with windows of different lengths, so it can
    /// cost a little more all-in than the base.
    #[arg(long, requires = "step_bits")]
    max_bits: Option<f64>,
    /// Redraw the plots and the Markdown table from `OUT/results.json` without running the
    /// model (after editing the plotting, or to restyle).
    #[arg(long)]
    replot: bool,
}

/// One allocation's line of the sweep.
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
struct SweepRow {
    alloc: String,
    bits_per_value: f64,
    key_bits_per_value: f64,
    value_bits_per_value: f64,
    bytes_per_token: usize,
    perplexity: f64,
    mean_kl: f64,
    top1_agreement: f64,
    mean_score_error: f64,
    decode_tokens_per_s: f64,
    needle_cells: usize,
    needle_hits: usize,
    /// Mean exact-case needle score over the cells (`None` without a needle grid).
    needle_score: Option<f64>,
    /// Mean case-insensitive needle score (the seed's headline scoring).
    needle_score_case_insensitive: Option<f64>,
    pareto_kl: bool,
    pareto_needle: bool,
    pareto_decode: bool,
}

#[derive(Serialize)]
struct SweepResults<'a> {
    command: String,
    rows: &'a [SweepRow],
    eval: &'a EvalReport,
    needle: &'a [NeedleRow],
}

/// Runs `tq sweep`.
pub fn run(args: &SweepArgs) -> Result<(), Box<dyn std::error::Error>> {
    if let Some(&depth) = args.depths.iter().find(|d| !(0.0..=1.0).contains(*d)) {
        return Err(format!("depth {depth} is not in [0, 1]").into());
    }
    if args.sensitivity {
        return run_sensitivity(args);
    }
    if args.replot {
        return replot(&args.out);
    }
    let allocations = load_allocations(&args.allocs)?;
    let spec = super::needle::read_spec(args.spec.as_deref())?;
    std::fs::create_dir_all(&args.out)
        .map_err(|e| format!("cannot create {}: {e}", args.out.display()))?;
    let model = open_model(&args.model)?;
    let model = &*model;
    let style = PromptStyle::for_model(model.file());
    let spec = spec.unwrap_or_else(|| NeedleSpec::builtin_for(&style));
    let tokenizer = Tokenizer::from_gguf(model.file())?;
    let tokens = text_tokens(
        &tokenizer,
        &args.text,
        args.tokens,
        model.dims().context_length,
    )?;
    let needle_cells = if args.no_needle {
        0
    } else {
        args.contexts.len() * args.depths.len() * allocations.len()
    };
    // The evaluation runs chunks of at most the model's longest forward call.
    let chunks = tokens
        .len()
        .div_ceil(args.prefill_chunk.clamp(1, model.max_chunk()));
    let reference = Allocation::preset("f16")?;
    let has_reference = allocations.iter().any(|(_, a)| *a == reference);
    let eval_calls = chunks * (allocations.len() + usize::from(!has_reference))
        + if args.decode_steps > 0 {
            allocations.len()
        } else {
            0
        };
    let bar = progress((eval_calls + needle_cells) as u64);
    bar.set_message(format!("quality evaluation over {} tokens", tokens.len()));
    let options = EvalOptions {
        prefill_chunk: args.prefill_chunk,
        decode_steps: args.decode_steps,
        ..EvalOptions::default()
    };
    let report = evaluate(
        model,
        &tokens,
        ("f16", &reference),
        &allocations,
        &options,
        |done, _| bar.set_position(done as u64),
    )?;
    bar.set_position(eval_calls as u64);
    let mut needle_rows = Vec::new();
    if !args.no_needle {
        let needle_options = NeedleOptions {
            max_tokens: args.max_tokens,
            prefill_chunk: args.prefill_chunk,
            ..NeedleOptions::default()
        };
        let named: Vec<(&str, &Allocation)> = allocations
            .iter()
            .map(|(name, allocation)| (name.as_str(), allocation))
            .collect();
        let grid = NeedleGrid {
            allocations: &named,
            contexts: &args.contexts,
            depths: &args.depths,
        };
        // One cell at a time: the cache budget checked above bounds one cache, and cells in
        // flight together would hold one each.
        needle_rows = run_grid(
            model,
            &tokenizer,
            &style,
            &spec,
            &grid,
            &needle_options,
            CellOrder::OneAtATime,
            &|row| {
                bar.set_message(format!(
                    "needle: {} at {} tokens, depth {:.0}%: done",
                    row.alloc,
                    row.context,
                    100.0 * row.depth
                ));
                bar.inc(1);
            },
        )?;
    }
    bar.finish_and_clear();
    let rows = summarize(&report, &needle_rows, !args.no_needle);
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let results = SweepResults {
        command: command.clone(),
        rows: &rows,
        eval: &report,
        needle: &needle_rows,
    };
    write(
        &args.out.join("results.json"),
        &serde_json::to_string_pretty(&results)?,
    )?;
    let figures = plot(&rows, &args.out, !args.no_needle, args.decode_steps > 0)?;
    let setup = Setup {
        tokens: report.tokens,
        prefill_chunk: report.prefill_chunk,
        decode_steps: report.rows.first().map_or(0, |r| r.decode_steps),
    };
    let markdown = markdown(&command, &setup, &rows, &figures);
    write(&args.out.join("results.md"), &markdown)?;
    println!("{markdown}");
    eprintln!("wrote {}", args.out.display());
    Ok(())
}

fn write(path: &Path, text: &str) -> Result<(), Box<dyn std::error::Error>> {
    std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()).into())
}

/// Joins the evaluation rows with the needle cells of the same allocation and marks the
/// Pareto fronts.
fn summarize(report: &EvalReport, needle: &[NeedleRow], with_needle: bool) -> Vec<SweepRow> {
    let mut rows: Vec<SweepRow> = report
        .rows
        .iter()
        .map(|r| {
            let cells: Vec<&NeedleRow> = needle.iter().filter(|n| n.alloc == r.alloc).collect();
            let mean = |f: fn(&NeedleRow) -> f64| {
                (with_needle && !cells.is_empty())
                    .then(|| cells.iter().map(|c| f(c)).sum::<f64>() / cells.len() as f64)
            };
            SweepRow {
                alloc: r.alloc.clone(),
                bits_per_value: r.cost.bits_per_value,
                key_bits_per_value: r.cost.key_bits_per_value,
                value_bits_per_value: r.cost.value_bits_per_value,
                bytes_per_token: r.cost.bytes_per_token_formula,
                perplexity: r.text.perplexity,
                mean_kl: r.text.mean_kl,
                top1_agreement: r.text.top1_agreement,
                mean_score_error: r.mean_score_error,
                decode_tokens_per_s: r.decode_tokens_per_s,
                needle_cells: cells.len(),
                needle_hits: cells.iter().filter(|c| c.hit()).count(),
                needle_score: mean(|c| c.score),
                needle_score_case_insensitive: mean(|c| c.score_case_insensitive),
                pareto_kl: false,
                pareto_needle: false,
                pareto_decode: false,
            }
        })
        .collect();
    let front = |rows: &[SweepRow], y: fn(&SweepRow) -> f64, better| {
        let points: Vec<(f64, f64)> = rows.iter().map(|r| (r.bits_per_value, y(r))).collect();
        pareto_front(&points, better)
    };
    for i in front(&rows, |r| r.mean_kl, Better::Lower) {
        rows[i].pareto_kl = true;
    }
    if with_needle {
        let score = |r: &SweepRow| r.needle_score_case_insensitive.unwrap_or(f64::NAN);
        for i in front(&rows, score, Better::Higher) {
            rows[i].pareto_needle = true;
        }
    }
    for i in front(&rows, |r| r.decode_tokens_per_s, Better::Higher) {
        rows[i].pareto_decode = true;
    }
    rows
}

/// Writes the plots; returns the PNG file names written (relative to the folder).
fn plot(
    rows: &[SweepRow],
    out: &Path,
    with_needle: bool,
    with_decode: bool,
) -> Result<Vec<(String, String)>, Box<dyn std::error::Error>> {
    let points = |y: fn(&SweepRow) -> f64| -> Vec<Point> {
        rows.iter()
            .map(|r| Point {
                label: r.alloc.clone(),
                x: r.bits_per_value,
                y: y(r),
            })
            .collect()
    };
    let x_label = "stored bits per value (log scale)";
    let mut plots = vec![(
        "bits-kl",
        "Bits per value vs next-token KL divergence (vs f16; 0 drawn at the floor)",
        "mean KL(P_f16 ‖ P), nats (log scale)",
        points(|r| r.mean_kl),
        Better::Lower,
        true,
    )];
    if with_needle {
        plots.push((
            "bits-needle",
            "Bits per value vs needle score (case-insensitive, mean over cells)",
            "needle score",
            points(|r| r.needle_score_case_insensitive.unwrap_or(f64::NAN)),
            Better::Higher,
            false,
        ));
    }
    if with_decode {
        plots.push((
            "bits-decode",
            "Bits per value vs decode speed (CPU, fused kernel)",
            "decode tokens per second",
            points(|r| r.decode_tokens_per_s),
            Better::Higher,
            false,
        ));
    }
    let mut written = Vec::new();
    for (stem, title, y_label, points, better, log_y) in plots {
        let scatter = Scatter {
            title,
            x_label,
            y_label,
            points: &points,
            better,
            log_y,
        };
        let svg = out.join(format!("{stem}.svg"));
        let png = out.join(format!("{stem}.png"));
        write_scatter(&scatter, &svg, &png)?;
        written.push((title.to_string(), format!("{stem}.png")));
    }
    Ok(written)
}

/// What the Markdown header says about the run.
struct Setup {
    tokens: usize,
    prefill_chunk: usize,
    decode_steps: usize,
}

/// `tq sweep --replot`: plots and Markdown again from `results.json`.
fn replot(out: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let path = out.join("results.json");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let value: serde_json::Value = serde_json::from_str(&text)?;
    let rows: Vec<SweepRow> = serde_json::from_value(value["rows"].clone())?;
    let number = |v: &serde_json::Value| v.as_u64().unwrap_or(0) as usize;
    let setup = Setup {
        tokens: number(&value["eval"]["tokens"]),
        prefill_chunk: number(&value["eval"]["prefill_chunk"]),
        decode_steps: number(&value["eval"]["rows"][0]["decode_steps"]),
    };
    let with_needle = rows.iter().any(|r| r.needle_score.is_some());
    let figures = plot(&rows, out, with_needle, setup.decode_steps > 0)?;
    let command = value["command"].as_str().unwrap_or("").to_string();
    let markdown = markdown(&command, &setup, &rows, &figures);
    write(&out.join("results.md"), &markdown)?;
    println!("{markdown}");
    Ok(())
}

/// The Markdown report: the command, the table, the figures.
fn markdown(
    command: &str,
    setup: &Setup,
    rows: &[SweepRow],
    figures: &[(String, String)],
) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "# Sweep results\n");
    let _ = writeln!(md, "Command: `{command}`\n");
    let _ = writeln!(
        md,
        "Quality over {} text tokens (chunks of {}), KL and top-1 against the f16 cache; \
         decode speed over {} greedy steps after the text; needle score = mean over the \
         cells, case-insensitive (exact-case in brackets). `*` marks a point on the Pareto \
         front of bits against that column.\n",
        setup.tokens, setup.prefill_chunk, setup.decode_steps
    );
    let _ = writeln!(
        md,
        "| allocation | bits/value (K / V) | bytes/token | perplexity | KL mean | top-1 | \
         score err | needle | decode tok/s |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|");
    let star = |on: bool| if on { " *" } else { "" };
    for r in rows {
        let needle = match (r.needle_score_case_insensitive, r.needle_score) {
            (Some(ci), Some(exact)) => format!(
                "{:.2} ({:.2}), {}/{} hits{}",
                ci,
                exact,
                r.needle_hits,
                r.needle_cells,
                star(r.pareto_needle)
            ),
            _ => "–".to_string(),
        };
        let _ = writeln!(
            md,
            "| {} | {:.3} ({:.2} / {:.2}) | {} | {:.3} | {:.5}{} | {:.1}% | {:.4} | {} | {:.1}{} |",
            r.alloc,
            r.bits_per_value,
            r.key_bits_per_value,
            r.value_bits_per_value,
            r.bytes_per_token,
            r.perplexity,
            r.mean_kl,
            star(r.pareto_kl),
            100.0 * r.top1_agreement,
            r.mean_score_error,
            needle,
            r.decode_tokens_per_s,
            star(r.pareto_decode),
        );
    }
    let _ = writeln!(md);
    for (title, file) in figures {
        let _ = writeln!(md, "![{title}]({file})\n");
    }
    md
}

/// `tq sweep --sensitivity`: one variant per (layer, stream) of the first allocation.
fn run_sensitivity(args: &SweepArgs) -> Result<(), Box<dyn std::error::Error>> {
    let mut allocations = load_allocations(&args.allocs)?;
    if allocations.len() > 1 {
        eprintln!(
            "note: --sensitivity studies the first allocation ({}) only",
            allocations[0].0
        );
    }
    let (base_name, base) = allocations.swap_remove(0);
    std::fs::create_dir_all(&args.out)
        .map_err(|e| format!("cannot create {}: {e}", args.out.display()))?;
    let model = open_model(&args.model)?;
    let model = &*model;
    let tokenizer = Tokenizer::from_gguf(model.file())?;
    let tokens = text_tokens(
        &tokenizer,
        &args.text,
        args.tokens,
        model.dims().context_length,
    )?;
    let shape = model.dims().model_shape();
    if args.step_bits {
        return run_bit_steps(args, model, &tokens, (&base_name, &base));
    }
    let base_bytes = bytes_per_token(&base, &shape)?;
    let mut lanes = vec![(base_name.clone(), base.clone())];
    let mut variants = Vec::new();
    for layer in 0..shape.num_layers {
        for stream in StreamKind::BOTH {
            let variant = raised(&base, layer, stream);
            let extra = bytes_per_token(&variant, &shape)?.saturating_sub(base_bytes);
            variants.push((layer, stream, extra));
            lanes.push((variant.name.clone(), variant));
        }
    }
    let report = evaluate_lanes(
        model,
        &tokens,
        &lanes,
        args.prefill_chunk,
        Some(format!(
            "{} variants of {base_name} over {} tokens",
            variants.len(),
            tokens.len()
        )),
    )?;
    let rows: Vec<_> = variants
        .iter()
        .zip(&report.rows[1..])
        .map(|(&(layer, stream, extra), row)| (layer, stream, extra, row))
        .collect();
    let ranking = rank(&report.rows[0], &rows);
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# Per-layer sensitivity of `{base_name}`\n\nCommand: `{}`\n\nBase: mean KL {:.5} \
         nats over {} tokens, {base_bytes} bytes per token. Each row raises one layer's keys or \
         values to f16.\n",
        std::env::args().collect::<Vec<_>>().join(" "),
        report.rows[0].text.mean_kl,
        report.tokens
    );
    let _ = writeln!(
        md,
        "| rank | layer | stream | extra bytes/token | KL | KL saved | KL saved per KB |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|");
    for (i, s) in ranking.iter().enumerate() {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {:.5} | {:.5} | {:.5} |",
            i + 1,
            s.layer,
            s.stream,
            s.extra_bytes_per_token,
            s.kl,
            s.kl_saved,
            1024.0 * s.kl_saved_per_byte
        );
    }
    let mut budget_report = None;
    if let Some(budget) = args.budget {
        let (allocation, spent) = spend_budget(&base, &ranking, budget);
        let path = args.out.join(format!("{}.toml", allocation.name));
        write(&path, &allocation.to_toml_string()?)?;
        let lanes = [
            (base_name.clone(), base.clone()),
            (allocation.name.clone(), allocation.clone()),
        ];
        let check = evaluate_lanes(model, &tokens, &lanes, args.prefill_chunk, None)?;
        let _ = writeln!(
            md,
            "\nBudget {budget} bytes per token: `{}` spends {spent} ({}); evaluated together: \
             mean KL {:.5} → {:.5}, top-1 {:.1}% → {:.1}%.",
            path.display(),
            allocation.description.as_deref().unwrap_or(""),
            check.rows[0].text.mean_kl,
            check.rows[1].text.mean_kl,
            100.0 * check.rows[0].text.top1_agreement,
            100.0 * check.rows[1].text.top1_agreement,
        );
        budget_report = Some(check);
    }
    #[derive(Serialize)]
    struct SensitivityResults<'a> {
        base: &'a str,
        base_bytes_per_token: usize,
        ranking: &'a [tq_models::eval::sensitivity::LayerSensitivity],
        eval: &'a EvalReport,
        budget_check: Option<&'a EvalReport>,
    }
    write(
        &args.out.join("sensitivity.json"),
        &serde_json::to_string_pretty(&SensitivityResults {
            base: &base_name,
            base_bytes_per_token: base_bytes,
            ranking: &ranking,
            eval: &report,
            budget_check: budget_report.as_ref(),
        })?,
    )?;
    write(&args.out.join("sensitivity.md"), &md)?;
    println!("{md}");
    Ok(())
}

/// `tq sweep --sensitivity --step-bits`: every stream of every layer one bit up and one bit
/// down, then the budget-neutral trades built from them, evaluated together; the best is
/// written as an allocation file.
fn run_bit_steps(
    args: &SweepArgs,
    model: &dyn tq_models::causal_lm::CausalLm,
    tokens: &[u32],
    (base_name, base): (&str, &Allocation),
) -> Result<(), Box<dyn std::error::Error>> {
    let shape = model.dims().model_shape();
    let kinds = model.layer_kinds();
    let base_bytes = bytes_per_token(base, &shape)?;
    let mut lanes = vec![(base_name.to_string(), base.clone())];
    let mut variants = Vec::new();
    for layer in 0..shape.num_layers {
        let kind = kinds.get(layer).copied().unwrap_or_default();
        for stream in StreamKind::BOTH {
            let Some(bits) = stream_bits(base, &shape, layer, kind, stream)? else {
                continue;
            };
            for to in [bits.checked_add(1), bits.checked_sub(1)]
                .into_iter()
                .flatten()
            {
                if !(1..=8).contains(&to) {
                    continue;
                }
                let variant = stepped(base, shape.num_layers, layer, stream, bits, to);
                let bytes = bytes_per_token(&variant, &shape)?.abs_diff(base_bytes);
                variants.push((layer, stream, (bits, to), bytes));
                lanes.push((variant.name.clone(), variant));
            }
        }
    }
    if variants.is_empty() {
        return Err(format!(
            "{base_name} has no stream a one-bit step applies to (mse or debiased-mse, one tier)"
        )
        .into());
    }
    let report = evaluate_lanes(
        model,
        tokens,
        &lanes,
        args.prefill_chunk,
        Some(format!(
            "{} one-bit steps of {base_name} over {} tokens",
            variants.len(),
            tokens.len()
        )),
    )?;
    let steps: Vec<BitStep> = variants
        .iter()
        .zip(&report.rows[1..])
        .map(|(&(layer, stream, bits, bytes), row)| {
            BitStep::measured(&report.rows[0], layer, stream, bits, bytes, row)
        })
        .collect();
    let prefixes = trade_prefixes(&steps);
    let trades: Vec<(String, Allocation)> = prefixes
        .iter()
        .map(|pairs| {
            let a = traded(base, shape.num_layers, pairs);
            (a.name.clone(), a)
        })
        .collect();
    let mut check_lanes = vec![(base_name.to_string(), base.clone())];
    check_lanes.extend(trades.iter().cloned());
    let check = evaluate_lanes(
        model,
        tokens,
        &check_lanes,
        args.prefill_chunk,
        Some(format!("{} trades of {base_name}", trades.len())),
    )?;

    let mut md = String::new();
    let _ = writeln!(
        md,
        "# One-bit steps of `{base_name}`\n\nCommand: `{}`\n\nBase: mean KL {:.5} nats over {} \
         tokens of `{}`, {base_bytes} bytes per token. Each row moves one layer's keys or values \
         one bit up (what it buys) or down (what it costs).\n",
        std::env::args().collect::<Vec<_>>().join(" "),
        report.rows[0].text.mean_kl,
        report.tokens,
        args.text.display()
    );
    let _ = writeln!(
        md,
        "| layer | stream | bits | bytes/token | KL | KL bought (+) or paid (−) |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|");
    for s in &steps {
        let signed = if s.to_bits > s.from_bits {
            s.kl_change
        } else {
            -s.kl_change
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} → {} | {} | {:.5} | {signed:+.5} |",
            s.layer, s.stream, s.from_bits, s.to_bits, s.bytes_per_token, s.kl
        );
    }
    let _ = writeln!(
        md,
        "\nTrades at the same bytes of codes per token (raises by KL bought per byte, lowerings \
         by KL paid per byte), evaluated together; all-in bits per value at {} tokens, an upper \
         bound{}:\n\n| allocation | bytes/token | all-in bits (bound) | mean KL | top-1 |\n\
         |---|---|---|---|---|",
        tokens.len(),
        match args.max_bits {
            Some(b) => format!(" (trades above {b} are not chosen)"),
            None => String::new(),
        }
    );
    let mut best: Option<(f64, usize)> = None;
    for (i, row) in check.rows.iter().enumerate() {
        let allocation = &check_lanes[i].1;
        let bytes = bytes_per_token(allocation, &shape)?;
        let bits = all_in_bits_bound(allocation, &shape, tokens.len())?;
        let _ = writeln!(
            md,
            "| {} | {bytes} | {bits:.4} | {:.5} | {:.1}% |",
            row.alloc,
            row.text.mean_kl,
            100.0 * row.text.top1_agreement
        );
        let fits = args.max_bits.is_none_or(|b| bits <= b);
        if i > 0 && fits && best.is_none_or(|(kl, _)| row.text.mean_kl < kl) {
            best = Some((row.text.mean_kl, i));
        }
    }
    let chosen = match best {
        Some((kl, i)) if kl < check.rows[0].text.mean_kl => {
            let allocation = &check_lanes[i].1;
            let path = args.out.join(format!("{}.toml", allocation.name));
            write(&path, &allocation.to_toml_string()?)?;
            let _ = writeln!(
                md,
                "\nBest: `{}` ({}), written to `{}`.",
                allocation.name,
                allocation.description.as_deref().unwrap_or(""),
                path.display()
            );
            Some(allocation.name.clone())
        }
        _ => {
            let _ = writeln!(
                md,
                "\nNo trade beats `{base_name}` on this text within the budget; nothing written."
            );
            None
        }
    };
    #[derive(Serialize)]
    struct StepResults<'a> {
        base: &'a str,
        base_bytes_per_token: usize,
        steps: &'a [BitStep],
        eval: &'a EvalReport,
        trades: &'a EvalReport,
        chosen: Option<String>,
    }
    write(
        &args.out.join("bit-steps.json"),
        &serde_json::to_string_pretty(&StepResults {
            base: base_name,
            base_bytes_per_token: base_bytes,
            steps: &steps,
            eval: &report,
            trades: &check,
            chosen,
        })?,
    )?;
    write(&args.out.join("bit-steps.md"), &md)?;
    println!("{md}");
    Ok(())
}

/// The sensitivity modes' evaluation: `lanes` over `tokens` against the f16 cache, without the
/// score error or decode steps, behind a progress bar showing `message` (none without one).
fn evaluate_lanes(
    model: &dyn tq_models::causal_lm::CausalLm,
    tokens: &[u32],
    lanes: &[(String, Allocation)],
    prefill_chunk: usize,
    message: Option<String>,
) -> Result<EvalReport, Box<dyn std::error::Error>> {
    let reference = Allocation::preset("f16")?;
    let options = EvalOptions {
        prefill_chunk,
        score_error: false,
        decode_steps: 0,
        ..EvalOptions::default()
    };
    let bar = message.map(|m| {
        let bar = progress(0);
        bar.set_message(m);
        bar
    });
    let report = evaluate(
        model,
        tokens,
        ("f16", &reference),
        lanes,
        &options,
        |done, total| {
            if let Some(bar) = &bar {
                bar.set_length(total as u64);
                bar.set_position(done as u64);
            }
        },
    )?;
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    Ok(report)
}
