//! `--model smollm2|gemma3-270m|FILE.gguf` as a user passes it: commands that cannot run
//! Gemma 3 yet say so (before downloading anything), bad names and misuse are messages, and
//! `tq tokenize` / `tq inspect` work on both models. Tests that need a model file skip with a
//! message when it is absent (fail instead with `TQ_REQUIRE_MODEL=1`).

mod common;

use common::{present, tq};
use tq_models::fetch::KnownModel;

#[test]
fn forward_pass_commands_refuse_gemma3_with_a_message() {
    for args in [
        vec!["generate", "--model", "gemma3-270m", "--prompt", "Hi"],
        vec!["demo", "--model", "gemma3-270m"],
        vec!["needle", "--model", "gemma3-270m"],
        vec!["perplexity", "--model", "gemma3-270m", "--text", "x.txt"],
        vec!["bench", "e2e", "--model", "gemma3-270m"],
    ] {
        let (ok, _, stderr) = tq(&args);
        assert!(!ok, "{args:?} should fail");
        assert!(
            stderr.contains("cannot run gemma3-270m yet"),
            "{args:?}: {stderr}"
        );
        assert!(!stderr.contains("downloading"), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}

#[test]
fn bad_model_choices_are_messages() {
    let (ok, _, stderr) = tq(&["tokenize", "--model", "gemma3", "--text", "x"]);
    assert!(!ok);
    assert!(
        stderr.contains("unknown model `gemma3`: expected one of smollm2, gemma3-270m"),
        "{stderr}"
    );
    let (ok, _, stderr) = tq(&["fetch-model", "--model", "some.gguf"]);
    assert!(!ok);
    assert!(stderr.contains("takes a model name"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn tokenize_prints_the_reference_ids() {
    if present(KnownModel::SmolLm2).is_some() {
        let (ok, stdout, stderr) = tq(&["tokenize", "--text", "The capital of France is"]);
        assert!(ok, "{stderr}");
        assert_eq!(stdout.trim(), "504 3575 282 4649 314");
    }
    if present(KnownModel::Gemma3_270m).is_some() {
        let (ok, stdout, stderr) = tq(&[
            "tokenize",
            "--model",
            "gemma3-270m",
            "--text",
            "Hello world",
            "--json",
        ]);
        assert!(ok, "{stderr}");
        let v: serde_json::Value = serde_json::from_str(&stdout).expect("JSON on stdout");
        assert_eq!(v["model"], "gemma3-270m");
        assert_eq!(v["ids"], serde_json::json!([2, 9259, 1902]));
        assert_eq!(v["pieces"], serde_json::json!(["<bos>", "Hello", " world"]));
    }
}

#[test]
fn inspect_shows_gemma3() {
    let Some(path) = present(KnownModel::Gemma3_270m) else {
        return;
    };
    for args in [
        vec!["inspect", "--model", "gemma3-270m"],
        vec!["inspect", path.to_str().unwrap()],
    ] {
        let (ok, stdout, stderr) = tq(&args);
        assert!(ok, "{stderr}");
        assert!(stdout.contains("gemma3"), "{stdout}");
        assert!(stdout.contains("Q5_0"), "{stdout}");
    }
    // A Gemma 3 file is refused by name of architecture too.
    let (ok, _, stderr) = tq(&[
        "generate",
        "--model",
        path.to_str().unwrap(),
        "--prompt",
        "Hi",
    ]);
    assert!(!ok);
    assert!(stderr.contains("cannot run"), "{stderr}");
}
