//! Golden snapshot of the synthetic needle (no model needed): planted needle keys among 16K and
//! 64K distractor keys drawn like real keys, per allocation the needle's attention rank and
//! softmax mass (50% with exact keys), the setup `tq needle --synthetic` uses (d = 128, depths
//! 10/50/90%, seeds 1000 + depth index). A change in any codec's scoring moves these numbers;
//! review the diff like code (`cargo insta review`, or `INSTA_UPDATE=always` and read the
//! `golden/` file).

use serde::Serialize;
use tq_cache::allocation::Allocation;
use tq_cache::synthetic_needle::{NeedleSetup, run};

#[derive(Serialize)]
struct Cell {
    alloc: String,
    tokens: usize,
    depth: f64,
    needle_rank: usize,
    /// Percent, rounded to 0.01 so the snapshot reads at a glance.
    needle_mass_pct: String,
    exact_mass_pct: String,
    bytes_per_token: usize,
}

const ALLOCS: [&str; 5] = ["f16", "k5v4", "mse-k4v4", "tq3.5", "tq2.5"];
const DEPTHS: [f64; 3] = [0.1, 0.5, 0.9];

fn cells(tokens: usize) -> Vec<Cell> {
    let mut out = Vec::new();
    for name in ALLOCS {
        let allocation = Allocation::preset(name).expect("a shipped preset");
        for (i, depth) in DEPTHS.into_iter().enumerate() {
            let setup = NeedleSetup {
                tokens,
                head_dim: 128,
                depth,
                target_weight: 0.5,
                seed: 1000 + i as u64,
            };
            let o = run(&allocation, &setup).expect("the experiment runs");
            out.push(Cell {
                alloc: o.alloc,
                tokens: o.tokens,
                depth: o.depth,
                needle_rank: o.needle_rank,
                needle_mass_pct: format!("{:.2}", 100.0 * o.needle_weight),
                exact_mass_pct: format!("{:.2}", 100.0 * o.exact_weight),
                bytes_per_token: o.bytes_per_token,
            });
        }
    }
    out
}

fn check(name: &str, tokens: usize) {
    let cells = cells(tokens);
    insta::with_settings!({
        snapshot_path => concat!(env!("CARGO_MANIFEST_DIR"), "/../../golden"),
        prepend_module_to_snapshot => false,
        description => "synthetic needle: rank and softmax mass (%) of a planted key per allocation",
    }, {
        insta::assert_json_snapshot!(name, cells);
    });
}

#[test]
fn synthetic_needle_16k() {
    check("synthetic_needle_16k", 16_384);
}

#[test]
fn synthetic_needle_64k() {
    check("synthetic_needle_64k", 65_536);
}
