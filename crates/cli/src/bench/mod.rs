//! `tq bench ...`: benchmarks that print ratios and rates measured side by side in one run.

pub mod codec;
pub mod estimators;
mod timing;

use clap::Subcommand;

/// The benchmarks `tq bench` knows.
#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Encode and decode throughput of the codecs (vectors/s, one thread and all threads).
    Codec(codec::CodecBenchArgs),
    /// Bias and variance of the inner-product estimators (TQ_prod, debiased MSE) at b = 2..5.
    Estimators(estimators::EstimatorArgs),
}

/// Runs one benchmark.
pub fn run(command: BenchCommand) -> Result<(), Box<dyn std::error::Error>> {
    match command {
        BenchCommand::Codec(args) => codec::run(&args),
        BenchCommand::Estimators(args) => estimators::run(&args),
    }
}
