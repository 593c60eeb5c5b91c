//! The Python bindings' steps: `cargo xtask verify` builds the `turboquant` wheel into a
//! temporary virtual environment and runs its pytest suite; `cargo xtask bench python` runs
//! the encode benchmark there.
//!
//! The environment gets maturin, numpy and pytest from PyPI with pip; the wheel is built in the
//! workspace's own target directory (`target/release`, or `$CARGO_TARGET_DIR`), so it reuses every crate the test step compiled (a target
//! directory of its own rebuilt all of them: minutes of a fresh CI run). Only the PyO3 crates
//! and the bindings compile again, because the extension's feature and maturin's environment
//! differ from the test build's; the next workspace build recompiles those few (under a
//! minute). Without a `python3` (or `$TQ_PYTHON`) the step is skipped
//! with the reason printed, unless `TQ_REQUIRE_PYTHON=1`, which makes it a failure.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use crate::{run, workspace_root};

/// What the environment installs from PyPI.
const PACKAGES: &[&str] = &["maturin>=1.9.4,<2", "numpy", "pytest"];

/// A temporary virtual environment with the wheel installed; removed on drop.
struct Env {
    dir: PathBuf,
    python: PathBuf,
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The interpreter to build the environment from, or why there is none.
fn interpreter() -> Result<String, String> {
    let python = std::env::var("TQ_PYTHON").unwrap_or_else(|_| "python3".to_string());
    match Command::new(&python).arg("--version").output() {
        Ok(out) if out.status.success() => Ok(python),
        Ok(out) => Err(format!("`{python} --version` exited with {}", out.status)),
        Err(e) => Err(format!("no `{python}` on PATH ({e})")),
    }
}

/// Creates the environment and installs the freshly built wheel, or returns `None` (after
/// printing why) when there is no Python and `TQ_REQUIRE_PYTHON` is not `1`.
fn prepare(purpose: &str) -> Result<Option<Env>, String> {
    let python = match interpreter() {
        Ok(python) => python,
        Err(reason) => {
            if std::env::var("TQ_REQUIRE_PYTHON").is_ok_and(|v| v == "1") {
                return Err(format!(
                    "{purpose} needs Python 3.9+, and TQ_REQUIRE_PYTHON=1: {reason}"
                ));
            }
            eprintln!(
                "==> python: skipped ({reason}; set TQ_REQUIRE_PYTHON=1 to make this an error)"
            );
            return Ok(None);
        }
    };
    let root = workspace_root();
    let dir = std::env::temp_dir().join(format!("tq-python-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let env = Env {
        python: dir.join("venv").join("bin").join("python"),
        dir,
    };
    let started = Instant::now();
    run(Command::new(&python)
        .args(["-m", "venv"])
        .arg(env.dir.join("venv")))
    .map_err(|e| {
        format!("{e} (on Debian/Ubuntu, `apt-get install python3-venv` provides the venv module)")
    })?;
    run(Command::new(&env.python)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
        ])
        .args(PACKAGES))?;
    let wheels = env.dir.join("wheels");
    run(Command::new(&env.python)
        .args([
            "-m",
            "maturin",
            "build",
            "--release",
            "--quiet",
            "--manifest-path",
        ])
        .arg(root.join("crates/python/Cargo.toml"))
        .arg("--interpreter")
        .arg(&env.python)
        .arg("--out")
        .arg(&wheels))?;
    let wheel = only_wheel(&wheels)?;
    run(Command::new(&env.python)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-deps",
        ])
        .arg(&wheel))?;
    eprintln!(
        "==> python: built and installed {} ({:.1} s)",
        wheel.file_name().unwrap_or_default().to_string_lossy(),
        started.elapsed().as_secs_f64()
    );
    Ok(Some(env))
}

fn only_wheel(dir: &Path) -> Result<PathBuf, String> {
    let mut wheels: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("cannot list {}: {e}", dir.display()))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "whl"))
        .collect();
    match wheels.len() {
        1 => Ok(wheels.remove(0)),
        n => Err(format!(
            "expected one wheel in {}, found {n}",
            dir.display()
        )),
    }
}

/// The verify step: build the wheel into a temporary venv and run `pytest crates/python/tests`.
pub fn verify() -> Result<(), String> {
    let Some(env) = prepare("the Python step")? else {
        return Ok(());
    };
    let root = workspace_root();
    // From the workspace root, so `import turboquant` finds the installed wheel, never the
    // sources under crates/python/python.
    run(Command::new(&env.python)
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
        .arg(root.join("crates/python/tests"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .current_dir(&root))
}

/// `cargo xtask bench python [args]`: the encode benchmark against the numpy peer.
pub fn bench(args: &[String]) -> Result<(), String> {
    let Some(env) = prepare("`bench python`")? else {
        return Ok(());
    };
    let root = workspace_root();
    run(Command::new(&env.python)
        .arg(root.join("crates/python/bench/bench_encode.py"))
        .args(args)
        .current_dir(&root))
}
