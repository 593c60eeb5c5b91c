//! Prints a Lloyd-Max codebook.
//!
//! ```text
//! cargo run --release -p tq-lloyd-max --example codebook -- [beta|gaussian] [dim] [bits]
//! ```
//! Defaults: `beta 128 3`.

use std::process::ExitCode;

use tq_lloyd_max::{CoordinateDistribution, LloydMaxCodebook};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let kind = args.first().map_or("beta", String::as_str);
    let (Ok(dim), Ok(bits)) = (
        args.get(1).map_or(Ok(128), |s| s.parse::<usize>()),
        args.get(2).map_or(Ok(3), |s| s.parse::<u8>()),
    ) else {
        eprintln!("usage: codebook [beta|gaussian] [dim] [bits]");
        return ExitCode::FAILURE;
    };
    let distribution = match kind {
        "beta" => CoordinateDistribution::Beta { dim },
        "gaussian" => CoordinateDistribution::Gaussian { dim },
        other => {
            eprintln!("unknown law {other:?}: expected beta or gaussian");
            return ExitCode::FAILURE;
        }
    };
    let started = std::time::Instant::now();
    let codebook = match LloydMaxCodebook::new(distribution, bits) {
        Ok(codebook) => codebook,
        Err(error) => {
            eprintln!("{error}");
            return ExitCode::FAILURE;
        }
    };
    let elapsed = started.elapsed();
    let sigma = distribution.std_dev();
    println!("{distribution:?}, {bits} bits, solved in {elapsed:.2?}");
    println!(
        "{:>5} {:>22} {:>12} {:>22}",
        "code", "centroid", "centroid/σ", "upper threshold"
    );
    for (k, c) in codebook.centroids().iter().enumerate() {
        let threshold = codebook
            .thresholds()
            .get(k)
            .map_or_else(|| "+∞".to_owned(), |t| format!("{t:.15e}"));
        println!("{k:>5} {c:>22.15e} {:>12.6} {threshold:>22}", c / sigma);
    }
    println!(
        "per-coordinate MSE C = {:.10e}",
        codebook.mse_per_coordinate()
    );
    println!(
        "unit-vector distortion D = d·C = {:.10}",
        codebook.unit_vector_distortion()
    );
    println!(
        "D·4^b = {:.6} (bounds: 1 ≤ D·4^b ≤ √3·π/2 ≈ 2.7207)",
        codebook.unit_vector_distortion() * 4f64.powi(i32::from(bits))
    );
    ExitCode::SUCCESS
}
