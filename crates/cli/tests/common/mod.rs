//! What the CLI tests share: running the `tq` binary (and reading its JSON), and skipping when
//! a model is absent.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;

use tq_models::fetch::KnownModel;

/// Runs `tq` with `args`: (success, stdout, stderr).
pub fn tq(args: &[&str]) -> (bool, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_tq"))
        .args(args)
        .output()
        .expect("tq runs");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Runs `tq` with `args`, asserts it succeeded and returns its stdout parsed as JSON.
pub fn json(args: &[&str]) -> serde_json::Value {
    let (ok, stdout, stderr) = tq(args);
    assert!(ok, "tq {args:?} failed: {stderr}");
    serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("tq {args:?} printed invalid JSON ({e}): {stdout}"))
}

/// The model's file if it is present; otherwise skips with a message (`None`), or fails when
/// `TQ_REQUIRE_MODEL=1`.
pub fn present(model: KnownModel) -> Option<PathBuf> {
    let path = model.path();
    if path.exists() {
        return Some(path);
    }
    assert!(
        std::env::var("TQ_REQUIRE_MODEL").as_deref() != Ok("1"),
        "model not found at {} and TQ_REQUIRE_MODEL=1",
        path.display()
    );
    eprintln!("skipped: model not found at {}", path.display());
    None
}
