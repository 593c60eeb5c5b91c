//! Runs beyond the model's window or the cache budget are refused before any prefill, with the
//! numbers. Skips with a message without the model file (fails instead with
//! `TQ_REQUIRE_MODEL=1`).

use std::process::Command;

use tq_models::fetch::KnownModel;

fn tq(args: &[&str]) -> (bool, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_tq"))
        .args(args)
        .output()
        .expect("tq runs");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn over_the_window_or_the_budget_is_refused_up_front() {
    let model = KnownModel::SmolLm2.path();
    if !model.exists() {
        assert!(
            std::env::var("TQ_REQUIRE_MODEL").as_deref() != Ok("1"),
            "model not found at {} and TQ_REQUIRE_MODEL=1",
            model.display()
        );
        eprintln!("skipped: model not found at {}", model.display());
        return;
    }
    let (ok, stderr) = tq(&["generate", "--prompt", "Hello", "--max-tokens", "9000"]);
    assert!(!ok);
    assert!(
        stderr.contains("8192") && stderr.contains("context window"),
        "{stderr}"
    );
    // f16 for 1 + 64 tokens is 65 × 23 160 bytes: far over a 100 KB budget.
    let (ok, stderr) = tq(&[
        "generate",
        "--prompt",
        "Hello",
        "--max-cache-bytes",
        "100000",
    ]);
    assert!(!ok);
    assert!(
        stderr.contains("budget") && stderr.contains("100000"),
        "{stderr}"
    );
    let (ok, stderr) = tq(&[
        "perplexity",
        "--text",
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../models/tests/data/GPL-3.txt"
        ),
        "--ctx",
        "16384",
    ]);
    assert!(!ok);
    assert!(
        stderr.contains("16384") && stderr.contains("8192"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}
