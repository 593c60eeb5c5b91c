//! Runs beyond the model's window or the cache budget are refused before any prefill, with the
//! numbers. Skips with a message without the model file (fails instead with
//! `TQ_REQUIRE_MODEL=1`).

mod common;

use common::{present, tq};
use tq_models::fetch::KnownModel;

#[test]
fn over_the_window_or_the_budget_is_refused_up_front() {
    if present(KnownModel::SmolLm2).is_none() {
        return;
    }
    let (ok, _, stderr) = tq(&["generate", "--prompt", "Hello", "--max-tokens", "9000"]);
    assert!(!ok);
    assert!(
        stderr.contains("8192") && stderr.contains("context window"),
        "{stderr}"
    );
    // f16 for 1 + 64 tokens is 65 × 23 160 bytes: far over a 100 KB budget.
    let (ok, _, stderr) = tq(&[
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
    let (ok, _, stderr) = tq(&[
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
