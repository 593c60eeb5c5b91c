//! `tq bench ...`: benchmarks that print ratios and rates measured side by side in one run.

pub mod attention;
pub mod codec;
pub mod estimators;
mod timing;

use clap::Subcommand;

/// The benchmarks `tq bench` knows.
#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// One decode step of fused attention over f32, f16 and TurboQuant caches (T = 1K..64K),
    /// against the machine's streaming-read bandwidth.
    Attention(attention::AttentionBenchArgs),
    /// Encode and decode throughput of the codecs (vectors/s, one thread and all threads).
    Codec(codec::CodecBenchArgs),
    /// Bias and variance of the inner-product estimators (TQ_prod, debiased MSE) at b = 2..5.
    Estimators(estimators::EstimatorArgs),
}

/// Runs one benchmark.
pub fn run(command: BenchCommand) -> Result<(), Box<dyn std::error::Error>> {
    match command {
        BenchCommand::Attention(args) => attention::run(&args),
        BenchCommand::Codec(args) => codec::run(&args),
        BenchCommand::Estimators(args) => estimators::run(&args),
    }
}
