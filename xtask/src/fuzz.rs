//! `cargo xtask fuzz <target> [--runs N] [-- LIBFUZZER_ARGS...]`: builds one target of the
//! `tq-fuzz` crate as a libFuzzer binary with coverage instrumentation and runs it.
//!
//! - Build: `cargo build --release -p tq-fuzz --features libfuzzer --bin fuzz_<target>` for the
//!   host triple named explicitly (so the instrumentation flags in `RUSTFLAGS` reach the target
//!   code but not build scripts or proc macros), into `target/fuzz`. The flags are the ones
//!   `cargo fuzz` passes without a sanitizer, all stable: LLVM's sanitizer-coverage pass with
//!   inline 8-bit edge counters, the PC table and comparison tracing, plus debug assertions and
//!   overflow checks, so an arithmetic overflow in a loader is a crash, not silent wrapping.
//! - Corpus: libFuzzer writes what it finds to `fuzz/corpus/<target>/` (ignored by git) and
//!   reads the seeds in `fuzz/seeds/<target>/` (for `allocation` also the shipped presets).
//! - Run: `-runs=N` executions (default 10 000 000), crashes to `fuzz/artifacts/<target>/`,
//!   final statistics printed; tokenizer inputs at most 256 bytes unless `-max_len=` is given.
//!   Anything after `--` goes to libFuzzer unchanged (`-max_len=`, `-fork=2`, `-dict=`, ...).
//!
//! A crash is a failure of this command; turn the file libFuzzer names into a regression test
//! by copying it to `fuzz/regressions/<target>/` (see `docs/fuzzing.md`).

use std::path::Path;
use std::process::Command;

/// The targets of `fuzz/src/lib.rs` (`tq_fuzz::TARGETS`; xtask has no dependencies).
const TARGETS: [&str; 4] = ["gguf", "tokenizer", "allocation", "cache_file"];

/// Sanitizer-coverage instrumentation as `cargo fuzz` sets it (no sanitizer, stable flags).
const COVERAGE_FLAGS: &[&str] = &[
    "-Cpasses=sancov-module",
    "-Cllvm-args=-sanitizer-coverage-level=4",
    "-Cllvm-args=-sanitizer-coverage-inline-8bit-counters",
    "-Cllvm-args=-sanitizer-coverage-pc-table",
    "-Cllvm-args=-sanitizer-coverage-trace-compares",
    "--cfg=fuzzing",
    "-Cdebug-assertions",
    "-Coverflow-checks",
];

const DEFAULT_RUNS: u64 = 10_000_000;

pub fn run(args: &[String]) -> Result<(), String> {
    let usage = || {
        format!(
            "usage: cargo xtask fuzz <{}> [--runs N] [-- LIBFUZZER_ARGS...]",
            TARGETS.join("|")
        )
    };
    let (ours, libfuzzer_args) = match args.iter().position(|a| a == "--") {
        Some(i) => (&args[..i], &args[i + 1..]),
        None => (args, &[][..]),
    };
    let (target, runs) = match ours {
        [target] => (target, DEFAULT_RUNS),
        [target, flag, n] if flag == "--runs" => (
            target,
            n.parse()
                .map_err(|_| format!("--runs takes a number, not {n:?}"))?,
        ),
        _ => return Err(usage()),
    };
    if !TARGETS.contains(&target.as_str()) {
        return Err(format!("unknown fuzz target {target:?}; {}", usage()));
    }
    let root = crate::workspace_root();
    let host = host_triple()?;
    let binary = format!("fuzz_{target}");

    let mut build = crate::cargo();
    build
        .args([
            "build",
            "--release",
            "-p",
            "tq-fuzz",
            "--features",
            "libfuzzer",
        ])
        .args([
            "--bin",
            &binary,
            "--target",
            &host,
            "--target-dir",
            "target/fuzz",
        ])
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env("RUSTFLAGS", COVERAGE_FLAGS.join(" "));
    crate::run(&mut build)?;

    let corpus = root.join("fuzz/corpus").join(target);
    let artifacts = root.join("fuzz/artifacts").join(target);
    for dir in [&corpus, &artifacts] {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    let mut inputs = vec![corpus, root.join("fuzz/seeds").join(target)];
    if target == "allocation" {
        let presets = root.join("crates/cache/presets");
        inputs.extend(subfolders(&presets));
        inputs.push(presets);
    }
    let mut fuzz = Command::new(
        root.join("target/fuzz")
            .join(&host)
            .join("release")
            .join(&binary),
    );
    // One rayon thread: the model's forward pass in the GGUF target would otherwise hand tiny
    // work items to a second thread on every iteration, and two targets fuzzed side by side
    // would fight over the cores.
    if std::env::var_os("RAYON_NUM_THREADS").is_none() {
        fuzz.env("RAYON_NUM_THREADS", "1");
    }
    // Tokenizer inputs stay short unless asked otherwise: merges and byte fallbacks act within
    // a few characters, and libFuzzer grows texts to kilobytes whose encoding makes each
    // iteration several times slower without reaching new code.
    if target == "tokenizer" && !libfuzzer_args.iter().any(|a| a.starts_with("-max_len=")) {
        fuzz.arg("-max_len=256");
    }
    fuzz.current_dir(&root)
        .args(&inputs)
        .arg(format!("-runs={runs}"))
        .arg(format!("-artifact_prefix={}/", artifacts.display()))
        .arg("-print_final_stats=1")
        .args(libfuzzer_args);
    eprintln!(
        "==> fuzz {target}: {runs} runs; crashes go to {}",
        artifacts.display()
    );
    crate::run(&mut fuzz).map_err(|e| {
        format!(
            "{e}\nthe input that failed is in {}; copy it to fuzz/regressions/{target}/ and fix",
            artifacts.display()
        )
    })
}

/// The host's target triple, from `rustc -vV`.
fn host_triple() -> Result<String, String> {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let output = Command::new(&rustc)
        .arg("-vV")
        .output()
        .map_err(|e| format!("could not run {rustc} -vV: {e}"))?;
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .find_map(|line| line.strip_prefix("host: ").map(str::to_owned))
        .ok_or_else(|| "rustc -vV printed no host triple".into())
}

/// The folders directly under `dir`.
fn subfolders(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out: Vec<_> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.is_dir())
        .collect();
    out.sort();
    out
}
