//! `tq bench ...`: benchmarks that print ratios and rates measured side by side in one run.

pub mod attention;
pub mod codec;
pub mod compare;
pub mod e2e;
pub mod estimators;
pub mod matmul;
pub mod scan;
pub mod states;
mod timing;

use clap::Subcommand;

/// The benchmarks `tq bench` knows.
#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// One decode step of fused attention over f32, f16 and TurboQuant caches (T = 1K..64K),
    /// against the machine's streaming-read bandwidth (`--backend wgpu`: the GPU kernels).
    Attention(attention::AttentionBenchArgs),
    /// Encode and decode throughput of the codecs (vectors/s, one thread and all threads).
    Codec(codec::CodecBenchArgs),
    /// This engine against llama.cpp's `llama-bench` (`--llama-bench PATH`; otherwise its
    /// stored figures) on the same model, threads and depths, interleaved: prefill and decode
    /// ratios.
    Compare(compare::CompareBenchArgs),
    /// The reference model end to end: prefill and decode tokens/s, cache bytes and peak RSS
    /// per allocation and context, against llama.cpp's figures.
    E2e(e2e::E2eBenchArgs),
    /// Bias and variance of the inner-product estimators (TQ_prod, debiased MSE) at b = 2..5.
    Estimators(estimators::EstimatorArgs),
    /// The weight products of one block of a real model (decode and prefill-chunk shapes) on
    /// each instruction set this CPU runs, side by side.
    Matmul(matmul::MatmulBenchArgs),
    /// Key scoring alone, one thread: f16 keys, TurboQuant_mse records and the same codes in the
    /// token-parallel fast-scan layout (integer byte-shuffle scoring), side by side; with
    /// `--attention` also whole decode steps (fused kernel against `fast_scan::attend`).
    Scan(scan::ScanBenchArgs),
    /// Memory of the hybrid models' states (sliding rings, full KV, shared KV, fixed conv and
    /// recurrent states), or with --model a real model's, against context length: byte
    /// formula beside the measured allocation.
    States(states::StatesBenchArgs),
}

/// Runs one benchmark.
pub fn run(command: BenchCommand) -> Result<(), Box<dyn std::error::Error>> {
    match command {
        BenchCommand::Attention(args) => attention::run(&args),
        BenchCommand::Codec(args) => codec::run(&args),
        BenchCommand::Compare(args) => compare::run(&args),
        BenchCommand::E2e(args) => e2e::run(&args),
        BenchCommand::Estimators(args) => estimators::run(&args),
        BenchCommand::Matmul(args) => matmul::run(&args),
        BenchCommand::Scan(args) => scan::run(&args),
        BenchCommand::States(args) => states::run(&args),
    }
}
