//! `tq codebook --dim D --bits B [--distribution beta|gaussian] [--json]`.

use clap::{Args, ValueEnum};
use serde::Serialize;
use tq_lloyd_max::{CoordinateDistribution, LloydMaxCodebook};

use crate::output::table;

/// Which coordinate law the codebook is optimal for.
#[derive(Clone, Copy, Debug, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DistributionArg {
    /// The exact law of a rotated unit vector's coordinate, (1−t²)^((d−3)/2) on [−1, 1].
    Beta,
    /// Its Gaussian limit N(0, 1/d).
    Gaussian,
}

/// Arguments of `tq codebook`.
#[derive(Args, Debug)]
pub struct CodebookArgs {
    /// Vector dimension d (≥ 3 for beta, ≥ 1 for gaussian).
    #[arg(long)]
    dim: usize,
    /// Bits per coordinate, 1..=8.
    #[arg(long)]
    bits: u8,
    /// Coordinate law.
    #[arg(long, value_enum, default_value_t = DistributionArg::Beta)]
    distribution: DistributionArg,
    /// Print JSON (keys: dim, bits, distribution, centroids, thresholds, distortion).
    #[arg(long)]
    json: bool,
}

/// The JSON contract of `tq codebook --json`.
#[derive(Serialize)]
struct CodebookReport<'a> {
    dim: usize,
    bits: u8,
    distribution: DistributionArg,
    centroids: &'a [f64],
    thresholds: &'a [f64],
    /// Unit-vector distortion D_mse = d·C.
    distortion: f64,
}

/// Runs `tq codebook`.
pub fn run(args: &CodebookArgs) -> Result<(), Box<dyn std::error::Error>> {
    let distribution = match args.distribution {
        DistributionArg::Beta => CoordinateDistribution::Beta { dim: args.dim },
        DistributionArg::Gaussian => CoordinateDistribution::Gaussian { dim: args.dim },
    };
    let codebook = LloydMaxCodebook::new(distribution, args.bits)?;
    let report = CodebookReport {
        dim: args.dim,
        bits: args.bits,
        distribution: args.distribution,
        centroids: codebook.centroids(),
        thresholds: codebook.thresholds(),
        distortion: codebook.unit_vector_distortion(),
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    println!(
        "Lloyd-Max codebook: {:?}, d = {}, b = {} ({} levels)",
        args.distribution,
        args.dim,
        args.bits,
        codebook.levels()
    );
    println!(
        "unit-vector distortion D_mse = d·C = {:.10}  (4^-b = {:.6})\n",
        report.distortion,
        4f64.powi(-i32::from(args.bits))
    );
    let top = match args.distribution {
        DistributionArg::Beta => "+1",
        DistributionArg::Gaussian => "+inf",
    };
    let rows: Vec<Vec<String>> = codebook
        .centroids()
        .iter()
        .enumerate()
        .map(|(k, c)| {
            let upper = codebook
                .thresholds()
                .get(k)
                .map_or_else(|| top.to_string(), |t| format!("{t:+.12}"));
            vec![k.to_string(), format!("{c:+.12}"), upper]
        })
        .collect();
    println!("{}", table(&["code", "centroid", "upper threshold"], &rows));
    Ok(())
}
