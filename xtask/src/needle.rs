//! `cargo xtask needle [--full] [args...]`: the needle-retrieval grid of `tq needle`.
//!
//! The small grid (contexts 1K and 2K, depths 10/50/90%, `f16`, `k5v4`, `tq3.5`, `mse-k4v4`) is
//! the one the goldens pin and takes minutes on two cores. `--full` runs contexts to 7.5K
//! (where the brief's llama.cpp baseline was measured; the window is 8K), depths
//! 10/25/50/75/90% and every preset — about two hours on two cores; its table goes into
//! `docs/results.md`. Further arguments (`--json`, `--spec FILE`, ...) pass through to
//! `tq needle`.

/// The grids, as `tq needle` arguments.
const SMALL: &[&str] = &[
    "--contexts",
    "1024,2048",
    "--depths",
    "0.1,0.5,0.9",
    "--alloc",
    "f16,k5v4,tq3.5,mse-k4v4",
];
const FULL: &[&str] = &[
    "--contexts",
    "1024,2048,4096,7680",
    "--depths",
    "0.1,0.25,0.5,0.75,0.9",
    "--alloc",
    "all",
];

/// Runs the grid.
pub fn run(args: &[String]) -> Result<(), String> {
    let full = args.iter().any(|a| a == "--full");
    let mut command = crate::cargo();
    command.args([
        "run",
        "--release",
        "--quiet",
        "-p",
        "tq-cli",
        "--",
        "needle",
    ]);
    // A grid flag the caller gives (`--contexts 4096`) replaces the grid's own.
    for pair in (if full { FULL } else { SMALL }).chunks(2) {
        let given = |a: &String| a == pair[0] || a.starts_with(&format!("{}=", pair[0]));
        if !args.iter().any(given) {
            command.args(pair);
        }
    }
    command.args(args.iter().filter(|a| *a != "--full"));
    crate::run(&mut command)
}
