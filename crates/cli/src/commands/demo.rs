//! `tq demo`: what compression keeps, in one table.
//!
//! Until the model runner lands, the demo plants a needle key among tens of thousands of
//! realistic distractor keys (see `tq_cache::synthetic_needle`) and shows, per bit allocation,
//! whether attention still ranks the needle first and what share of the softmax mass it keeps
//! (exact keys give it 50%), next to what a token costs.

use clap::Args;
use tq_cache::allocation::Allocation;
use tq_cache::synthetic_needle::{NeedleSetup, run as run_needle};

use crate::output::table;

/// Arguments of `tq demo`.
#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Context lengths (cached keys).
    #[arg(long, value_delimiter = ',', default_values_t = vec![16_384usize, 65_536])]
    tokens: Vec<usize>,
    /// Head dimension.
    #[arg(long, default_value_t = 128)]
    head_dim: usize,
}

/// The allocations the demo compares.
const PRESETS: [&str; 5] = ["f16", "k5v4", "mse-k4v4", "tq3.5", "tq2.5"];

/// Runs `tq demo`.
pub fn run(args: &DemoArgs) -> Result<(), Box<dyn std::error::Error>> {
    println!(
        "Needle retrieval on a compressed KV cache: one head, d = {}, a planted key at depths\n\
         10/50/90%, distractors drawn like real keys (outlier channels); with exact keys the\n\
         needle gets 50.0% of the attention. Columns: needle rank and mass per depth.\n",
        args.head_dim
    );
    let mut rows = Vec::new();
    let f16_bytes = Allocation::preset("f16").map(|a| {
        let setup = NeedleSetup {
            tokens: 1,
            head_dim: args.head_dim,
            depth: 0.0,
            target_weight: 0.5,
            seed: 0,
        };
        run_needle(&a, &setup).map(|o| o.bytes_per_token)
    })??;
    for &tokens in &args.tokens {
        for name in PRESETS {
            let allocation = Allocation::preset(name)?;
            let mut cells = vec![name.to_string(), tokens.to_string()];
            let mut bytes = 0;
            for (i, depth) in [0.1, 0.5, 0.9].into_iter().enumerate() {
                let setup = NeedleSetup {
                    tokens,
                    head_dim: args.head_dim,
                    depth,
                    target_weight: 0.5,
                    seed: 1000 + i as u64,
                };
                let outcome = run_needle(&allocation, &setup)?;
                bytes = outcome.bytes_per_token;
                cells.push(format!(
                    "#{} {:5.1}%",
                    outcome.needle_rank,
                    100.0 * outcome.needle_weight
                ));
            }
            cells.push(bytes.to_string());
            cells.push(format!("{:.2}×", f16_bytes as f64 / bytes as f64));
            rows.push(cells);
        }
    }
    println!(
        "{}",
        table(
            &[
                "allocation",
                "tokens",
                "depth 10%",
                "depth 50%",
                "depth 90%",
                "bytes/token",
                "vs f16"
            ],
            &rows
        )
    );
    println!(
        "\n(bytes/token: keys + values of this head, every norm and sign bit, plus the 4-byte position)"
    );
    Ok(())
}
