//! `tq bench compare`: this engine against the reference engine (llama.cpp's `llama-bench`) on
//! the same model file, at the same thread counts and depths, interleaved, as ratios.
//!
//! Each round runs, for every thread count and depth, this engine's measurement of every
//! allocation (a `tq bench e2e` child process: a fresh process per figure, see
//! [`super::e2e`]) and then `llama-bench` once (`-r 1`, flash attention on, f16 cache); every
//! figure is the median over rounds. Interleaving matters on a shared machine: a neighbour's
//! load lands on both engines alike rather than on whichever ran during it.
//!
//! What is compared, per thread count:
//! - **prefill** at depth 0: `--prompt-tokens` tokens in one chunk (llama-bench's `pp512`);
//! - **decode** at each depth: `--decode-tokens` greedy steps after `depth` cached tokens
//!   (`tg32 @ dN`). This engine decodes after its prompt, so at depth 0 its decode runs after
//!   the `--prompt-tokens` of the prefill (a slightly deeper cache than the engine's: the ratio
//!   is conservative).
//!
//! Without `--llama-bench` the reference figures stored in `crates/cli/data/llamacpp_speed.json`
//! (one thread, nearest depth within 512 tokens) stand in. `--save FILE` writes the rows with
//! their provenance (both engines' builds, the CPU, the command), which is how the figures of
//! the last measured run are kept in `crates/cli/data/`.

use std::path::{Path, PathBuf};
use std::process::Command;

use clap::Args;
use serde::{Deserialize, Serialize};
use tq_cache::allocation::Allocation;
use tq_models::fetch::ModelSpec;

use super::e2e::{ChildRun, LlamaCppSpeed, Measurement, median, run_child};
use crate::output::table;

/// Arguments of `tq bench compare`.
#[derive(Args, Debug, Clone)]
pub struct CompareBenchArgs {
    /// llama.cpp's `llama-bench` binary, run on the same model file beside this engine. Without
    /// it, the stored figures (`crates/cli/data/llamacpp_speed.json`, one thread) stand in.
    #[arg(long)]
    llama_bench: Option<PathBuf>,
    /// The model: `smollm2` (the reference model, the default), `gemma3-270m` or a .gguf file.
    #[arg(long)]
    model: Option<ModelSpec>,
    /// Thread counts, each measured for both engines (comma separated).
    #[arg(long, value_delimiter = ',', default_values_t = [1, 2])]
    threads: Vec<usize>,
    /// Cache depths of the decode comparison (comma separated); 0 also times the prefill.
    #[arg(long, value_delimiter = ',', default_values_t = [0, 2048, 8000])]
    depths: Vec<usize>,
    /// This engine's allocations (preset names or TOML files); the reference engine runs f16.
    #[arg(long, value_delimiter = ',', default_values_t = ["f16".to_string(), "tq3.5".to_string()])]
    alloc: Vec<String>,
    /// Interleaved rounds (the median is reported).
    #[arg(long, default_value_t = 2)]
    rounds: usize,
    /// Prompt tokens of the prefill comparison (one chunk, from depth 0).
    #[arg(long, default_value_t = 512)]
    prompt_tokens: usize,
    /// Decode steps timed at each depth.
    #[arg(long, default_value_t = 32)]
    decode_tokens: usize,
    /// Print JSON rows instead of a table.
    #[arg(long)]
    json: bool,
    /// Also write the rows and their provenance to this JSON file.
    #[arg(long)]
    save: Option<PathBuf>,
}

/// One row: one engine (and allocation) at one thread count and depth, medians over rounds.
#[derive(Serialize, Debug, Clone)]
pub struct CompareRow {
    /// `tq` or `llama.cpp`.
    engine: String,
    /// The KV cache: an allocation of this engine, or `f16` for the reference engine.
    cache: String,
    threads: usize,
    depth: usize,
    /// Prefill tokens/s of `--prompt-tokens` from depth 0 (depth-0 rows only).
    prefill_tokens_per_s: Option<f64>,
    decode_tokens_per_s: f64,
    /// This row over the reference engine's row at the same threads and depth (`tq` rows).
    prefill_ratio: Option<f64>,
    decode_ratio: Option<f64>,
    /// Where the reference figure came from: `measured` (llama-bench in this run) or
    /// `stored` (`llamacpp_speed.json`).
    reference: Option<String>,
}

/// The part of a `llama-bench -o json` row this reads.
#[derive(Deserialize, Debug, Clone)]
struct LlamaBenchRow {
    build_commit: String,
    cpu_info: String,
    n_threads: usize,
    n_prompt: usize,
    n_gen: usize,
    #[serde(default)]
    n_depth: usize,
    avg_ts: f64,
}

/// What `--save` writes.
#[derive(Serialize)]
struct SavedRun<'a> {
    what: &'static str,
    command: String,
    model: String,
    llama_bench_build: Option<String>,
    cpu: Option<String>,
    tq_version: &'static str,
    rounds: usize,
    rows: &'a [CompareRow],
}

/// Runs `tq bench compare`.
pub fn run(args: &CompareBenchArgs) -> Result<(), Box<dyn std::error::Error>> {
    if args.threads.is_empty() || args.threads.contains(&0) {
        return Err("--threads needs thread counts of at least 1".into());
    }
    if args.depths.is_empty() || args.alloc.is_empty() {
        return Err("--depths and --alloc need at least one value each".into());
    }
    if args.prompt_tokens == 0 || args.decode_tokens == 0 {
        return Err("--prompt-tokens and --decode-tokens must be at least 1".into());
    }
    for name in &args.alloc {
        Allocation::load(name)?;
    }
    if let Some(path) = &args.llama_bench
        && !path.is_file()
    {
        return Err(format!("--llama-bench {}: no such file", path.display()).into());
    }
    let model = crate::commands::model::model_path(&args.model)?;
    let cells = cells(args);
    // Samples per (cell, allocation), cell-major, and the reference engine's rows per cell.
    let mut ours: Vec<Vec<Measurement>> = vec![Vec::new(); cells.len() * args.alloc.len()];
    let mut engine: Vec<Vec<LlamaBenchRow>> = vec![Vec::new(); cells.len()];
    for round in 0..args.rounds.max(1) {
        for (c, &(threads, depth)) in cells.iter().enumerate() {
            for (a, alloc) in args.alloc.iter().enumerate() {
                eprintln!(
                    "compare: round {}/{}, {threads} thread(s), depth {depth}, tq {alloc}",
                    round + 1,
                    args.rounds.max(1)
                );
                let run = ChildRun {
                    decode_tokens: args.decode_tokens,
                    prefill_chunk: args.prompt_tokens,
                    threads,
                };
                let context = depth.max(args.prompt_tokens);
                ours[c * args.alloc.len() + a].push(run_child(run, &model, alloc, context)?);
            }
            if let Some(bench) = &args.llama_bench {
                eprintln!(
                    "compare: round {}/{}, {threads} thread(s), depth {depth}, llama-bench",
                    round + 1,
                    args.rounds.max(1)
                );
                let rows = run_llama_bench(bench, &model, args, threads, depth)?;
                engine[c].extend(rows);
            }
        }
    }
    let stored = LlamaCppSpeed::parse()?;
    let mut rows = Vec::new();
    for (c, &(threads, depth)) in cells.iter().enumerate() {
        let reference = if args.llama_bench.is_some() {
            Some(measured_reference(&engine[c], args, threads, depth)?)
        } else if threads == 1 {
            stored_reference(&stored, args.prompt_tokens, depth)
        } else {
            None
        };
        if let Some(r) = &reference
            && args.llama_bench.is_some()
        {
            rows.push(CompareRow {
                engine: "llama.cpp".to_string(),
                cache: "f16".to_string(),
                threads,
                depth,
                prefill_tokens_per_s: r.prefill,
                decode_tokens_per_s: r.decode,
                prefill_ratio: None,
                decode_ratio: None,
                reference: None,
            });
        }
        for (a, alloc) in args.alloc.iter().enumerate() {
            let samples = &ours[c * args.alloc.len() + a];
            let decode = median(
                samples
                    .iter()
                    .map(|m| m.decode_steps as f64 / m.decode_seconds)
                    .collect(),
            );
            let prefill = (depth == 0).then(|| {
                median(
                    samples
                        .iter()
                        .map(|m| m.prefill_tokens as f64 / m.prefill_seconds)
                        .collect(),
                )
            });
            rows.push(CompareRow {
                engine: "tq".to_string(),
                cache: alloc.clone(),
                threads,
                depth,
                prefill_tokens_per_s: prefill,
                decode_tokens_per_s: decode,
                prefill_ratio: prefill
                    .zip(reference.as_ref().and_then(|r| r.prefill))
                    .map(|(p, r)| p / r),
                decode_ratio: reference.as_ref().map(|r| decode / r.decode),
                reference: reference.as_ref().map(|r| r.source.to_string()),
            });
        }
    }
    if let Some(path) = &args.save {
        let first = engine.iter().flatten().next();
        let saved = SavedRun {
            what: "tq bench compare: this engine and llama.cpp's llama-bench on the same model \
                   file, same threads and depths, interleaved rounds, medians; ratios are tq \
                   over llama.cpp at the same threads and depth",
            command: std::env::args().collect::<Vec<_>>().join(" "),
            model: model.display().to_string(),
            llama_bench_build: first.map(|r| r.build_commit.clone()),
            cpu: first.map(|r| r.cpu_info.clone()),
            tq_version: env!("CARGO_PKG_VERSION"),
            rounds: args.rounds.max(1),
            rows: &rows,
        };
        std::fs::write(path, serde_json::to_string_pretty(&saved)? + "\n")?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        print_table(args, &rows);
    }
    Ok(())
}

/// (threads, depth) in the order they are measured within a round.
fn cells(args: &CompareBenchArgs) -> Vec<(usize, usize)> {
    args.threads
        .iter()
        .flat_map(|&t| args.depths.iter().map(move |&d| (t, d)))
        .collect()
}

/// The reference engine's figures at one thread count and depth.
struct Reference {
    prefill: Option<f64>,
    decode: f64,
    source: &'static str,
}

/// One `llama-bench` run: decode at `depth`, and the prefill too at depth 0.
fn run_llama_bench(
    bench: &Path,
    model: &Path,
    args: &CompareBenchArgs,
    threads: usize,
    depth: usize,
) -> Result<Vec<LlamaBenchRow>, Box<dyn std::error::Error>> {
    let prompt = if depth == 0 { args.prompt_tokens } else { 0 };
    let mut command = Command::new(bench);
    command
        .arg("-m")
        .arg(model)
        .args(["-t", &threads.to_string()])
        .args(["-p", &prompt.to_string()])
        .args(["-n", &args.decode_tokens.to_string()])
        .args(["-d", &depth.to_string()])
        .args([
            "-r", "1", "-fa", "1", "-ctk", "f16", "-ctv", "f16", "-o", "json",
        ]);
    // A build's shared libraries usually sit beside its binaries.
    if let Some(dir) = bench.parent() {
        let mut path = std::ffi::OsString::from(dir);
        if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
            path.push(":");
            path.push(old);
        }
        command.env("LD_LIBRARY_PATH", path);
    }
    let output = command.output()?;
    if !output.status.success() {
        return Err(format!(
            "{} failed: {}",
            bench.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        )
        .into());
    }
    parse_llama_bench(&String::from_utf8(output.stdout)?)
}

/// `llama-bench -o json`'s array of rows.
fn parse_llama_bench(text: &str) -> Result<Vec<LlamaBenchRow>, Box<dyn std::error::Error>> {
    let rows: Vec<LlamaBenchRow> = serde_json::from_str(text)
        .map_err(|e| format!("llama-bench printed no JSON array of results: {e}"))?;
    Ok(rows)
}

/// The median of the measured rows at `threads` and `depth`.
fn measured_reference(
    rows: &[LlamaBenchRow],
    args: &CompareBenchArgs,
    threads: usize,
    depth: usize,
) -> Result<Reference, Box<dyn std::error::Error>> {
    let pick = |prompt: usize, generated: usize| -> Vec<f64> {
        rows.iter()
            .filter(|r| {
                r.n_threads == threads
                    && r.n_depth == depth
                    && r.n_prompt == prompt
                    && r.n_gen == generated
            })
            .map(|r| r.avg_ts)
            .collect()
    };
    let decode = pick(0, args.decode_tokens);
    if decode.is_empty() {
        return Err(format!(
            "llama-bench gave no tg{} row at {threads} thread(s), depth {depth}",
            args.decode_tokens
        )
        .into());
    }
    let prefill = pick(args.prompt_tokens, 0);
    Ok(Reference {
        prefill: (depth == 0 && !prefill.is_empty()).then(|| median(prefill)),
        decode: median(decode),
        source: "measured",
    })
}

/// The stored one-thread figures at the nearest depth (no figure beyond 512 tokens of it).
fn stored_reference(
    stored: &LlamaCppSpeed,
    prompt_tokens: usize,
    depth: usize,
) -> Option<Reference> {
    let decode = stored.decode_f16(depth)?;
    Some(Reference {
        prefill: if depth == 0 {
            stored.prefill_f16(prompt_tokens).map(|r| r.tokens_per_s)
        } else {
            None
        },
        decode: decode.tokens_per_s,
        source: "stored",
    })
}

fn print_table(args: &CompareBenchArgs, rows: &[CompareRow]) {
    let opt =
        |v: Option<f64>, digits: usize| v.map_or("-".to_string(), |x| format!("{x:.digits$}"));
    let body: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.engine.clone(),
                r.cache.clone(),
                r.threads.to_string(),
                r.depth.to_string(),
                opt(r.prefill_tokens_per_s, 1),
                format!("{:.2}", r.decode_tokens_per_s),
                opt(r.prefill_ratio, 2),
                opt(r.decode_ratio, 2),
                r.reference.clone().unwrap_or_default(),
            ]
        })
        .collect();
    println!(
        "tq against llama.cpp (f16 cache, flash attention): prefill of {} tokens from depth 0, \
         decode of {} tokens at each depth; medians of {} interleaved rounds",
        args.prompt_tokens,
        args.decode_tokens,
        args.rounds.max(1)
    );
    println!(
        "{}",
        table(
            &[
                "engine",
                "cache",
                "threads",
                "depth",
                "prefill tok/s",
                "decode tok/s",
                "prefill x llama.cpp",
                "decode x llama.cpp",
                "reference",
            ],
            &body
        )
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    const LLAMA_BENCH_JSON: &str = r#"[
      {"build_commit": "0c1e570", "build_number": 1, "cpu_info": "Intel(R) Xeon(R) Processor",
       "n_threads": 2, "type_k": "f16", "type_v": "f16", "n_prompt": 512, "n_gen": 0,
       "n_depth": 0, "avg_ts": 250.5, "samples_ts": [250.5]},
      {"build_commit": "0c1e570", "build_number": 1, "cpu_info": "Intel(R) Xeon(R) Processor",
       "n_threads": 2, "type_k": "f16", "type_v": "f16", "n_prompt": 0, "n_gen": 32,
       "n_depth": 0, "avg_ts": 90.0, "samples_ts": [90.0]}
    ]"#;

    fn args(depths: &[usize]) -> CompareBenchArgs {
        CompareBenchArgs {
            llama_bench: None,
            model: None,
            threads: vec![1, 2],
            depths: depths.to_vec(),
            alloc: vec!["f16".into()],
            rounds: 1,
            prompt_tokens: 512,
            decode_tokens: 32,
            json: false,
            save: None,
        }
    }

    #[test]
    fn llama_bench_rows_are_matched_by_threads_depth_and_test() {
        let rows = parse_llama_bench(LLAMA_BENCH_JSON).unwrap();
        let r = measured_reference(&rows, &args(&[0]), 2, 0).unwrap();
        assert_eq!((r.prefill, r.decode), (Some(250.5), 90.0));
        // No row at another thread count: an error, not a silent ratio against nothing.
        assert!(measured_reference(&rows, &args(&[0]), 1, 0).is_err());
        assert!(parse_llama_bench("| model | size |").is_err());
    }

    #[test]
    fn stored_figures_stand_in_at_one_thread_and_known_depths() {
        let stored = LlamaCppSpeed::parse().unwrap();
        let r = stored_reference(&stored, 512, 0).unwrap();
        assert!(r.prefill.is_some() && r.decode > 0.0);
        assert!(
            stored_reference(&stored, 512, 2048)
                .unwrap()
                .prefill
                .is_none()
        );
        assert!(stored_reference(&stored, 512, 4096).is_none());
        assert_eq!(
            cells(&args(&[0, 2048])),
            vec![(1, 0), (1, 2048), (2, 0), (2, 2048)]
        );
    }
}
