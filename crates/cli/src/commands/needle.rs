//! `tq needle`: pass-key retrieval on the reference model over a grid of allocations, context
//! lengths and needle depths; `tq needle --synthetic`: the cache-only experiment beyond the
//! model's window (16K–128K keys, no model needed).

use std::path::PathBuf;

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use tq_cache::allocation::Allocation;
use tq_cache::synthetic_needle::{NeedleOutcome, NeedleSetup, run as run_synthetic};
use tq_models::fetch::ModelSpec;
use tq_models::needle::{
    CellOrder, ExactChoice, ExactNeedle, NeedleGrid, NeedleOptions, NeedleRow, NeedleSpec,
    NeedleStreams, PromptStyle, paired_hits, rank_retrieval_heads, run_grid,
};
use tq_models::tokenizer::Tokenizer;

use crate::output::table;

/// Arguments of `tq needle`.
#[derive(Args, Debug)]
pub struct NeedleArgs {
    /// A needle spec (TOML: filler, needle, question, facts, key_seed, answer_prefix); default:
    /// the built-in 5-digit pass key in "the grass is green" filler (for a model without a chat
    /// template, such as gemma3-270m, asked as "Question: … Answer: The secret pass key is").
    #[arg(long)]
    spec: Option<PathBuf>,
    /// Allocations: preset names or TOML files, comma-separated, `all` for every preset
    /// [default: f16,k5v4,tq3.5,mse-k4v4; with --synthetic f16,k5v4,mse-k4v4,tq3.5,tq2.5].
    #[arg(long, value_delimiter = ',')]
    alloc: Vec<String>,
    /// Context lengths in tokens [default: 1024,2048; with --synthetic 16384,32768,65536,131072].
    #[arg(long, value_delimiter = ',')]
    contexts: Vec<usize>,
    /// Needle depths in [0, 1].
    #[arg(long, value_delimiter = ',', default_values_t = vec![0.1, 0.5, 0.9])]
    depths: Vec<f64>,
    /// Pass-key seeds: the grid once per seed, each drawing other keys for the same cells
    /// (the spec's `key_seed` replaced); with several allocations the summary pairs each with
    /// the first on the same cells (McNemar's exact test) [default: the spec's `key_seed`, 7
    /// for the built-in spec].
    #[arg(long, value_delimiter = ',')]
    key_seeds: Vec<u64>,
    /// New tokens at most per answer.
    #[arg(long, default_value_t = 32)]
    max_tokens: usize,
    /// Prompt tokens per prefill chunk (each chunk attends to the compressed past).
    #[arg(long, default_value_t = 256)]
    prefill_chunk: usize,
    /// Print JSON rows instead of a table (progress stays on stderr).
    #[arg(long)]
    json: bool,
    /// Run the grid's cells concurrently: about 1.8× sooner on two cores, the same answers,
    /// but each row's tokens/s then shares the cores with the other cells, and each cell in
    /// flight holds a cache of its own (--max-cache-bytes bounds one).
    #[arg(long)]
    concurrent: bool,
    /// Also measure, per layer and query head, the softmax weight on the needle while the
    /// model answers (scored against the exact keys): JSON rows gain `needle_attention`
    /// (`[layer][q_head]`), the table is followed by the KV heads that read the needle most
    /// (the retrieval heads, where a recipe may spend more bits).
    #[arg(long)]
    needle_attention: bool,
    /// An oracle for per-token precision: answer with the needle's own tokens read exactly
    /// (their keys, values or both), every other token as the allocation stores it — what
    /// keeping just those tokens at full precision could buy at most. Rows whose window still
    /// holds the needle are left as the cache wrote them. Not with --needle-attention.
    #[arg(long, value_enum, conflicts_with = "needle_attention")]
    exact_needle: Option<ExactStreams>,
    /// With --exact-needle: the layers where the needle is read exactly, `FIRST-LAST`
    /// (inclusive) [default: every layer].
    #[arg(long, requires = "exact_needle", value_parser = parse_layers)]
    exact_needle_layers: Option<std::ops::Range<usize>>,
    /// With --exact-needle: swap only the rows from the prompt's last token on (what a cache
    /// that chose the needle's tokens when the prompt ends could do), not every row after the
    /// needle.
    #[arg(long, requires = "exact_needle")]
    exact_needle_answer_only: bool,
    /// With --exact-needle: instead of the needle, read exactly the tokens a heavy-hitter
    /// policy would keep, `W,FACTOR`: per layer and KV head, each token whose attention
    /// received from the queries of the W tokens from it on (exact keys) reaches FACTOR times
    /// uniform attention, from the row that completes its window on (a simulation of keeping
    /// those tokens at full precision as they leave a W-token window); `every:N`, the control:
    /// every N-th token, as many kept without looking. Rows gain `exact_kept`, the share kept
    /// per layer.
    #[arg(long, requires = "exact_needle", value_name = "W,FACTOR|every:N", value_parser = parse_policy)]
    exact_policy: Option<ExactChoice>,
    /// Rank every token, per layer, by the attention it receives (exact keys) from the queries
    /// of the W tokens from it on — what a heavy-hitter policy could see before a window of W
    /// tokens writes its codes — and report where the needle's tokens rank: JSON rows gain
    /// `needle_window_ranks` (`[layer][needle token]`, 0 = received the most), the table per
    /// layer the share of needle tokens in the top 1%.
    #[arg(
        long,
        value_name = "W",
        value_parser = parse_window,
        conflicts_with_all = ["needle_attention", "exact_needle"]
    )]
    window_attention: Option<usize>,
    #[command(flatten)]
    budget: super::limits::CacheBudgetArgs,
    /// The model: `smollm2` (the reference model, the default), `gemma3-270m` (fetched on
    /// first use) or a .gguf file.
    #[arg(long)]
    model: Option<ModelSpec>,
    /// Run the synthetic experiment in the cache crate instead of the model: planted needle
    /// keys among realistic distractors, whether the needle keeps the top attention weight and
    /// its softmax mass.
    #[arg(long)]
    synthetic: bool,
    /// Head dimension of the synthetic experiment.
    #[arg(long, default_value_t = 128)]
    head_dim: usize,
}

/// `--exact-needle`'s streams.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum ExactStreams {
    Keys,
    Values,
    Both,
}

/// `--exact-policy`: `W,FACTOR` (heavy hitters: a window of at least one token and a finite
/// factor ≥ 0) or `every:N` (the control: every N-th token, N ≥ 1).
fn parse_policy(text: &str) -> Result<ExactChoice, String> {
    if let Some(every) = text.strip_prefix("every:") {
        let every: usize = every
            .trim()
            .parse()
            .map_err(|e| format!("stride `{every}`: {e}"))?;
        if every == 0 {
            return Err(format!("`{text}`: the stride must be at least 1 token"));
        }
        return Ok(ExactChoice::Every { every });
    }
    let (window, factor) = text
        .split_once(',')
        .ok_or_else(|| format!("`{text}`: expected W,FACTOR (e.g. 512,8) or every:N"))?;
    let window: usize = window
        .trim()
        .parse()
        .map_err(|e| format!("window `{window}`: {e}"))?;
    let factor: f64 = factor
        .trim()
        .parse()
        .map_err(|e| format!("factor `{factor}`: {e}"))?;
    if window == 0 || !factor.is_finite() || factor < 0.0 {
        return Err(format!(
            "`{text}`: the window must be at least 1 token and the factor finite and ≥ 0"
        ));
    }
    Ok(ExactChoice::HeavyHitters { window, factor })
}

/// `--window-attention`'s window: at least one token (a token is read in its own row).
fn parse_window(text: &str) -> Result<usize, String> {
    match text.trim().parse::<usize>() {
        Ok(0) => Err("the window must be at least 1 token".into()),
        Ok(window) => Ok(window),
        Err(e) => Err(format!("`{text}`: {e}")),
    }
}

/// `FIRST-LAST` (inclusive) as a range of layers.
fn parse_layers(text: &str) -> Result<std::ops::Range<usize>, String> {
    let (first, last) = text
        .split_once('-')
        .ok_or_else(|| format!("`{text}`: expected FIRST-LAST, e.g. 0-14"))?;
    let number = |s: &str| {
        s.trim()
            .parse::<usize>()
            .map_err(|e| format!("`{s}` in `{text}`: {e}"))
    };
    let (first, last) = (number(first)?, number(last)?);
    if last < first {
        return Err(format!("`{text}`: the last layer comes before the first"));
    }
    Ok(first..last + 1)
}

const MODEL_ALLOCS: [&str; 4] = ["f16", "k5v4", "tq3.5", "mse-k4v4"];
const MODEL_CONTEXTS: [usize; 2] = [1024, 2048];
const SYNTHETIC_ALLOCS: [&str; 5] = ["f16", "k5v4", "mse-k4v4", "tq3.5", "tq2.5"];
const SYNTHETIC_CONTEXTS: [usize; 4] = [16_384, 32_768, 65_536, 131_072];

/// A progress bar on stderr (drawn only on a terminal, so `--json` output and logs stay clean).
pub(crate) fn progress(len: u64) -> ProgressBar {
    let bar = ProgressBar::new(len);
    if let Ok(style) =
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}")
    {
        bar.set_style(style);
    }
    bar.enable_steady_tick(std::time::Duration::from_millis(200));
    bar
}

/// `values`, or `defaults` when none were given.
fn or_default<T: Clone, U: Into<T> + Clone>(values: &[T], defaults: &[U]) -> Vec<T> {
    if values.is_empty() {
        defaults.iter().cloned().map(Into::into).collect()
    } else {
        values.to_vec()
    }
}

/// Runs `tq needle`.
pub fn run(args: &NeedleArgs) -> Result<(), Box<dyn std::error::Error>> {
    if let Some(&depth) = args.depths.iter().find(|d| !(0.0..=1.0).contains(*d)) {
        return Err(format!("depth {depth} is not in [0, 1]").into());
    }
    if args.synthetic {
        run_synthetic_grid(args)
    } else {
        run_model_grid(args)
    }
}

/// Loads each allocation; `all` stands for every shipped preset, `recommended` for the
/// recommended ones.
fn load_allocations(names: &[String]) -> Result<Vec<Allocation>, Box<dyn std::error::Error>> {
    let mut out = Vec::new();
    for name in names {
        if name == "all" {
            for preset in Allocation::preset_names() {
                out.push(Allocation::preset(preset)?);
            }
        } else if name == "recommended" {
            for preset in Allocation::recommended_names() {
                out.push(Allocation::preset(preset)?);
            }
        } else {
            out.push(Allocation::load(name)?);
        }
    }
    Ok(out)
}

/// The spec at `path`, if one is given (read before the model, so a bad file fails fast);
/// without one the caller takes [`NeedleSpec::builtin_for`] the model's prompt style (a base
/// model gets the answer cue it completes).
pub(super) fn read_spec(
    path: Option<&std::path::Path>,
) -> Result<Option<NeedleSpec>, Box<dyn std::error::Error>> {
    let Some(path) = path else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read the needle spec {}: {e}", path.display()))?;
    Ok(Some(NeedleSpec::from_toml(&text)?))
}

fn run_model_grid(args: &NeedleArgs) -> Result<(), Box<dyn std::error::Error>> {
    let spec = read_spec(args.spec.as_deref())?;
    if args.key_seeds.len() > 1 && spec.as_ref().is_some_and(|spec| !spec.uses_key()) {
        return Err(
            "--key-seeds: this spec draws no pass key ({key} appears nowhere), so \
                    every seed would ask the same prompts"
                .into(),
        );
    }
    if let Some((i, seed)) =
        (args.key_seeds.iter().enumerate()).find(|(i, seed)| args.key_seeds[..*i].contains(seed))
    {
        return Err(format!(
            "--key-seeds: seed {seed} is given twice (position {}): its cells would be \
             counted twice",
            i + 1
        )
        .into());
    }
    let allocations = load_allocations(&or_default(&args.alloc, &MODEL_ALLOCS))?;
    let contexts = or_default(&args.contexts, &MODEL_CONTEXTS);
    let model = super::model::open_model(&args.model)?;
    let model = &*model;
    super::limits::check_run(
        model,
        &allocations,
        contexts.iter().max().copied().unwrap_or(0) + args.max_tokens,
        "the longest --contexts plus --max-tokens",
        &args.budget,
    )?;
    if let Some(layers) = &args.exact_needle_layers
        && layers.end > model.dims().layers
    {
        return Err(format!(
            "--exact-needle-layers {}-{}: the model has {} layers (0-{})",
            layers.start,
            layers.end - 1,
            model.dims().layers,
            model.dims().layers - 1
        )
        .into());
    }
    let tokenizer = Tokenizer::from_gguf(model.file())?;
    let style = PromptStyle::for_model(model.file());
    let spec = spec.unwrap_or_else(|| NeedleSpec::builtin_for(&style));
    let options = NeedleOptions {
        max_tokens: args.max_tokens,
        prefill_chunk: args.prefill_chunk,
        needle_attention: args.needle_attention,
        exact_needle: args.exact_needle.map(|streams| ExactNeedle {
            streams: match streams {
                ExactStreams::Keys => NeedleStreams::Keys,
                ExactStreams::Values => NeedleStreams::Values,
                ExactStreams::Both => NeedleStreams::Both,
            },
            layers: args
                .exact_needle_layers
                .clone()
                .unwrap_or(0..model.dims().layers),
            answer_only: args.exact_needle_answer_only,
            choice: args.exact_policy.unwrap_or(ExactChoice::Needle),
        }),
        window_attention: args.window_attention,
        ..NeedleOptions::default()
    };
    let seeds = if args.key_seeds.is_empty() {
        vec![spec.key_seed]
    } else {
        args.key_seeds.clone()
    };
    let cells = seeds.len() * contexts.len() * args.depths.len() * allocations.len();
    let bar = progress(cells as u64);
    let named: Vec<(&str, &Allocation)> = allocations
        .iter()
        .map(|allocation| (allocation.name.as_str(), allocation))
        .collect();
    let grid = NeedleGrid {
        allocations: &named,
        contexts: &contexts,
        depths: &args.depths,
    };
    let order = if args.concurrent {
        CellOrder::Concurrent
    } else {
        CellOrder::OneAtATime
    };
    let mut rows = Vec::with_capacity(cells);
    for &key_seed in &seeds {
        let spec = NeedleSpec {
            key_seed,
            ..spec.clone()
        };
        rows.extend(run_grid(
            model,
            &tokenizer,
            &style,
            &spec,
            &grid,
            &options,
            order,
            &|row| {
                bar.set_message(format!(
                    "{} at {} tokens, depth {:.0}%, key seed {key_seed}: done",
                    row.alloc,
                    row.context,
                    100.0 * row.depth
                ));
                bar.inc(1);
            },
        )?);
    }
    bar.finish_and_clear();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        println!("{}", model_table(&rows, seeds.len() > 1));
        println!();
        for line in summary(&rows, &named) {
            println!("{line}");
        }
        if let Some(exact) = &options.exact_needle {
            let swapped: Vec<String> = rows
                .iter()
                .filter_map(|r| r.exact_needle.as_ref().map(|(_, n)| n.to_string()))
                .collect();
            println!();
            let kept: Vec<String> = rows
                .iter()
                .filter_map(|r| r.exact_kept.as_ref())
                .map(|share| {
                    let mean = share.iter().sum::<f64>() / share.len().max(1) as f64;
                    format!("{:.2}%", 100.0 * mean)
                })
                .collect();
            let tokens = match exact.choice {
                ExactChoice::Needle => "The needle's".to_owned(),
                ExactChoice::HeavyHitters { window, factor } => format!(
                    "The heavy hitters' (attention received in a {window}-token window at least \
                     {factor}× uniform; kept per cell, mean over layers: {})",
                    kept.join(", ")
                ),
                ExactChoice::Every { every } => format!(
                    "Every {every}th token's (kept per cell, mean over layers: {})",
                    kept.join(", ")
                ),
            };
            println!(
                "{tokens} {:?} read exactly in layers {}-{}{} (an oracle); outputs swapped \
                 per cell (query rows × heads, all layers): {}",
                exact.streams,
                exact.layers.start,
                exact.layers.end.saturating_sub(1),
                if exact.answer_only {
                    ", from the prompt's last token on"
                } else {
                    ""
                },
                swapped.join(", ")
            );
        }
        for &(name, _) in &named {
            if let Some(line) = heavy_hitters_line(&rows, name) {
                println!();
                println!("{line}");
            }
        }
        if let Some(window) = args.window_attention {
            for &(name, _) in &named {
                println!();
                println!("{}", window_ranks_line(&rows, name, window));
            }
        }
        if args.needle_attention {
            for &(name, _) in &named {
                println!();
                println!(
                    "{}",
                    retrieval_heads_line(&rows, name, model.dims().kv_heads)
                );
            }
        }
    }
    Ok(())
}

/// Per allocation, the cells that retrieved every fact; after the first, each paired with the
/// first on the same cells.
fn summary(rows: &[NeedleRow], allocations: &[(&str, &Allocation)]) -> Vec<String> {
    let hits = |name: &str| {
        let mine = rows.iter().filter(|r| r.alloc == name);
        let cells = mine.clone().count();
        (mine.filter(|r| r.hit()).count(), cells)
    };
    let mut lines = Vec::new();
    let Some(&(baseline, _)) = allocations.first() else {
        return lines;
    };
    for &(name, _) in allocations {
        let (found, cells) = hits(name);
        let mut line =
            format!("{name}: {found} of {cells} cells retrieved every fact (exact case)");
        if name != baseline {
            let paired = paired_hits(rows, name, baseline);
            line += &format!(
                "; against {baseline} on the same {} cells: {} found where {baseline} missed, \
                 {} missed where {baseline} found (McNemar's exact p = {:.3})",
                paired.cells,
                paired.only_this,
                paired.only_baseline,
                paired.p_value()
            );
        }
        lines.push(line + ".");
    }
    lines
}

/// How many KV heads the retrieval ranking prints.
const RETRIEVAL_HEADS_SHOWN: usize = 12;

/// The KV heads whose query heads put the most weight on the needle in `name`'s cells.
fn retrieval_heads_line(rows: &[NeedleRow], name: &str, kv_heads: usize) -> String {
    let cells = rows
        .iter()
        .filter(|r| r.alloc == name)
        .filter_map(|r| r.needle_attention.as_deref());
    let ranked = rank_retrieval_heads(cells, kv_heads);
    let heads: Vec<String> = ranked
        .iter()
        .take(RETRIEVAL_HEADS_SHOWN)
        .map(|h| format!("layer {} head {} {:.3}", h.layer, h.kv_head, h.weight))
        .collect();
    format!(
        "{name}: KV heads by weight on the needle (mean over cells of the largest among their \
         query heads): {}",
        heads.join(", ")
    )
}

/// For an allocation that keeps heavy hitters: the share of tokens kept per cell, and per
/// layer the share of the needle's tokens kept (mean over `name`'s cells); `None` otherwise.
fn heavy_hitters_line(rows: &[NeedleRow], name: &str) -> Option<String> {
    let kept: Vec<_> = rows
        .iter()
        .filter(|r| r.alloc == name)
        .filter_map(|r| r.heavy_hitters.as_ref())
        .collect();
    if kept.is_empty() {
        return None;
    }
    let shares: Vec<String> = kept
        .iter()
        .map(|k| format!("{:.2}%", 100.0 * k.share))
        .collect();
    let layers = kept.iter().map(|k| k.needle.len()).max().unwrap_or(0);
    let needle: Vec<String> = (0..layers)
        .map(|l| {
            let mean = kept
                .iter()
                .map(|k| k.needle.get(l).copied().unwrap_or(0.0))
                .sum::<f64>()
                / kept.len() as f64;
            format!("{l}: {:.0}%", 100.0 * mean)
        })
        .collect();
    Some(format!(
        "{name}: heavy hitters kept (share of the tokens that left the windows) per cell: {}; \
         the needle's tokens kept by the keys, per layer: {}",
        shares.join(", "),
        needle.join(", ")
    ))
}

/// Per layer, the share of the needle's tokens that rank in the top 1% of all tokens by the
/// attention received in the window, over `name`'s cells.
fn window_ranks_line(rows: &[NeedleRow], name: &str, window: usize) -> String {
    let mut top = Vec::<(usize, usize)>::new();
    for ranks in rows
        .iter()
        .filter(|r| r.alloc == name)
        .filter_map(|r| r.needle_window_ranks.as_deref())
    {
        top.resize(top.len().max(ranks.len()), (0, 0));
        for (layer, tokens) in ranks.iter().enumerate() {
            top[layer].0 += tokens.iter().filter(|&&rank| rank < 0.01).count();
            top[layer].1 += tokens.len();
        }
    }
    let layers: Vec<String> = top
        .iter()
        .enumerate()
        .map(|(layer, &(hit, all))| {
            format!("{layer}: {:.0}%", 100.0 * hit as f64 / all.max(1) as f64)
        })
        .collect();
    format!(
        "{name}: needle tokens in the top 1% by attention received in a {window}-token window, \
         per layer: {}",
        layers.join(", ")
    )
}

/// The answer on one line, cut to `width` characters.
pub(crate) fn one_line(answer: &str, width: usize) -> String {
    let flat = answer.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() <= width {
        flat
    } else {
        let cut: String = flat.chars().take(width.saturating_sub(1)).collect();
        format!("{cut}…")
    }
}

/// The rows as a table, with a key seed column when the grid ran several.
fn model_table(rows: &[NeedleRow], seeds: bool) -> String {
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let mut cells = vec![
                r.alloc.clone(),
                r.prompt_tokens.to_string(),
                format!("{:.0}%", 100.0 * r.depth),
                if r.hit() { "hit" } else { "miss" }.to_string(),
                format!("{}/{}", r.facts_found, r.facts_total),
                format!("{:.2}", r.score_case_insensitive),
                r.expected.join(", "),
                one_line(&r.answer, 48),
            ];
            if seeds {
                cells.insert(3, r.key_seed.to_string());
            }
            cells
        })
        .collect();
    let mut header = vec![
        "allocation",
        "tokens",
        "depth",
        "",
        "facts",
        "score (any case)",
        "expected",
        "answer",
    ];
    if seeds {
        header.insert(3, "key seed");
    }
    table(&header, &cells)
}

fn run_synthetic_grid(args: &NeedleArgs) -> Result<(), Box<dyn std::error::Error>> {
    let allocations = load_allocations(&or_default(&args.alloc, &SYNTHETIC_ALLOCS))?;
    let contexts = or_default(&args.contexts, &SYNTHETIC_CONTEXTS);
    let bar = progress((contexts.len() * allocations.len() * args.depths.len()) as u64);
    let mut outcomes: Vec<NeedleOutcome> = Vec::new();
    for &tokens in &contexts {
        for allocation in &allocations {
            for (i, &depth) in args.depths.iter().enumerate() {
                bar.set_message(format!("{} at {tokens} keys", allocation.name));
                let setup = synthetic_setup(tokens, args.head_dim, depth, i);
                outcomes.push(run_synthetic(allocation, &setup)?);
                bar.inc(1);
            }
        }
    }
    bar.finish_and_clear();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&outcomes)?);
        return Ok(());
    }
    println!(
        "Needle among distractor keys, beyond the model's window: one head, d = {}, a planted\n\
         key per depth, distractors drawn like real keys (outlier channels); with exact keys the\n\
         needle gets 50.0% of the attention. Cells: the needle's rank and softmax mass.\n",
        args.head_dim
    );
    println!("{}", synthetic_table(&outcomes, &args.depths));
    println!(
        "\n(bytes/token: keys + values of this head, every norm and sign bit, plus the 4-byte position)"
    );
    Ok(())
}

/// The setup of one synthetic cell: the depth's index picks the seed, so each depth has its own
/// keys and every allocation sees the same ones.
pub(crate) fn synthetic_setup(
    tokens: usize,
    head_dim: usize,
    depth: f64,
    index: usize,
) -> NeedleSetup {
    NeedleSetup {
        tokens,
        head_dim,
        depth,
        target_weight: 0.5,
        seed: 1000 + index as u64,
    }
}

fn synthetic_table(outcomes: &[NeedleOutcome], depths: &[f64]) -> String {
    let f16 = outcomes
        .iter()
        .find(|o| o.alloc == "f16")
        .map(|o| o.bytes_per_token);
    let mut header = vec!["allocation".to_string(), "tokens".to_string()];
    header.extend(depths.iter().map(|d| format!("depth {:.0}%", 100.0 * d)));
    header.push("bytes/token".into());
    header.push("vs f16".into());
    let rows: Vec<Vec<String>> = outcomes
        .chunks(depths.len().max(1))
        .map(|group| {
            let mut cells = vec![group[0].alloc.clone(), group[0].tokens.to_string()];
            cells.extend(
                group
                    .iter()
                    .map(|o| format!("#{} {:5.1}%", o.needle_rank, 100.0 * o.needle_weight)),
            );
            cells.push(group[0].bytes_per_token.to_string());
            cells.push(match f16 {
                Some(b) => format!("{:.2}×", b as f64 / group[0].bytes_per_token as f64),
                None => "-".into(),
            });
            cells
        })
        .collect();
    let header: Vec<&str> = header.iter().map(String::as_str).collect();
    table(&header, &rows)
}
