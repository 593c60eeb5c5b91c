//! `tq bench estimators`: bias and variance of inner-product estimators at equal bits.
//!
//! For unit vectors `x` (encoded) and `y` (query), the error is `⟨y, x̂⟩ − ⟨y, x⟩`.
//! - bias: the mean relative error with `y = x` (the sharpest case; against an independent `y`
//!   every estimator has zero-mean error), with its standard error;
//! - variance: `d · Var(error)` with `y` an independent unit vector ("per unit ‖y‖², ×d").
//!
//! `x` and `y` are isotropic, so one fixed codec per row averages over the rotation as well.

use clap::Args;
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use rand_distr::{Distribution, StandardNormal};
use serde::Serialize;
use tq_cache::codec::{CodecError, CodecScratch, DebiasedMse, MseSpec, ProdSpec, TqMse, TqProd};
use tq_qjl::SketchScale;
use tq_rotation::RotationKind;

use crate::output::table;

/// Arguments of `tq bench estimators`.
#[derive(Args, Debug)]
pub struct EstimatorArgs {
    /// Print JSON rows instead of a table.
    #[arg(long)]
    json: bool,
    /// Vector dimension.
    #[arg(long, default_value_t = 128)]
    dim: usize,
    /// Pairs (x, y) per row.
    #[arg(long, default_value_t = 20_000)]
    samples: usize,
}

/// One JSON row of `tq bench estimators --json`.
#[derive(Serialize, Debug)]
struct EstimatorRow {
    estimator: &'static str,
    dim: usize,
    bits: u8,
    bias: f64,
    bias_standard_error: f64,
    variance_times_d: f64,
}

/// The estimators compared, each a function `(x, y) ↦ ⟨y, x̂⟩` built for a bit budget.
// One value per benchmark row: the size difference of the variants costs nothing.
#[allow(clippy::large_enum_variant)]
enum Estimator {
    Mse(TqMse),
    Debiased(DebiasedMse),
    Prod(TqProd),
}

impl Estimator {
    fn estimate(
        &self,
        x: &[f32],
        y: &[f32],
        scratch: &mut CodecScratch,
    ) -> Result<f64, CodecError> {
        let dim = x.len();
        let mut rotated = vec![0.0f32; dim];
        Ok(f64::from(match self {
            Estimator::Mse(c) => {
                c.rotate_query(y, &mut rotated)?;
                c.inner_product(&rotated, &c.encode(x)?, scratch)?
            }
            Estimator::Debiased(c) => {
                c.codec().rotate_query(y, &mut rotated)?;
                c.inner_product(&rotated, &c.codec().encode(x)?, scratch)?
            }
            Estimator::Prod(c) => c.inner_product(&c.prepare_query(y)?, &c.encode(x)?)?,
        }))
    }
}

fn unit(rng: &mut ChaCha20Rng, dim: usize) -> Vec<f32> {
    let v: Vec<f64> = (0..dim).map(|_| StandardNormal.sample(rng)).collect();
    let n = v.iter().map(|a| a * a).sum::<f64>().sqrt();
    v.iter().map(|a| (a / n) as f32).collect()
}

fn mean_and_variance(samples: &[f64]) -> (f64, f64) {
    let n = samples.len() as f64;
    let mean = samples.iter().sum::<f64>() / n;
    let var = samples.iter().map(|s| (s - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, var)
}

fn measure(
    estimator: &Estimator,
    dim: usize,
    samples: usize,
    seed: u64,
) -> Result<(f64, f64, f64), CodecError> {
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    let mut scratch = CodecScratch::new(dim);
    let mut self_errors = Vec::with_capacity(samples);
    let mut cross_errors = Vec::with_capacity(samples);
    for _ in 0..samples {
        let x = unit(&mut rng, dim);
        let y = unit(&mut rng, dim);
        self_errors.push(estimator.estimate(&x, &x, &mut scratch)? - 1.0);
        let exact: f64 = x.iter().zip(&y).map(|(a, b)| f64::from(a * b)).sum();
        cross_errors.push(estimator.estimate(&x, &y, &mut scratch)? - exact);
    }
    let (bias, self_var) = mean_and_variance(&self_errors);
    let (_, cross_var) = mean_and_variance(&cross_errors);
    Ok((
        bias,
        (self_var / samples as f64).sqrt(),
        cross_var * dim as f64,
    ))
}

/// Runs `tq bench estimators`.
pub fn run(args: &EstimatorArgs) -> Result<(), Box<dyn std::error::Error>> {
    let dim = args.dim;
    let mut rows = Vec::new();
    for bits in 2u8..=5 {
        let mse_spec = MseSpec {
            dim,
            bits,
            rotation: RotationKind::Haar,
            seed: 1,
            norm_correction: false,
        };
        let mut paper = ProdSpec::paper(dim, bits, 1);
        paper.rotation = RotationKind::Haar;
        let mut haar = ProdSpec::orthogonal(dim, bits, 1).scale(SketchScale::Exact);
        haar.rotation = RotationKind::Haar;
        let estimators: [(&'static str, Estimator); 4] = [
            ("prod-gaussian", Estimator::Prod(TqProd::new(paper)?)),
            ("prod-haar", Estimator::Prod(TqProd::new(haar)?)),
            (
                "debiased-mse",
                Estimator::Debiased(DebiasedMse::new(mse_spec)?),
            ),
            ("mse", Estimator::Mse(TqMse::new(mse_spec)?)),
        ];
        for (name, estimator) in &estimators {
            let (bias, bias_standard_error, variance_times_d) =
                measure(estimator, dim, args.samples, 0xE571 + u64::from(bits))?;
            rows.push(EstimatorRow {
                estimator: name,
                dim,
                bits,
                bias,
                bias_standard_error,
                variance_times_d,
            });
        }
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    let body: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.estimator.to_string(),
                r.bits.to_string(),
                format!("{:+.5}", r.bias),
                format!("{:.5}", r.bias_standard_error),
                format!("{:.4}", r.variance_times_d),
            ]
        })
        .collect();
    println!(
        "inner-product estimators at d = {dim}, {} pairs per row (bias: y = x; variance: independent unit y)\n{}",
        args.samples,
        table(&["estimator", "bits", "bias", "bias s.e.", "d·Var"], &body)
    );
    Ok(())
}
