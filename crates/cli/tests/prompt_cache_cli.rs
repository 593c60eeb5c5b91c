//! `tq generate --prompt-cache FILE` on the reference model: a cold run with the flag gives the
//! tokens a run without it gives, a warm run reuses the cache and gives them again, a longer
//! prompt reuses the shared prefix and matches its own cold run, and a cache of another
//! allocation or a damaged file is reported and ignored. Uses `rec4.25`, whose centered
//! streams calibrate on the first prefill chunk and whose heavy hitters depend on where prefill
//! chunks end (so its cache is saved and reused at a chunk boundary) — the cases where reuse
//! could go wrong. Skips with a message without the model file (fails instead with
//! `TQ_REQUIRE_MODEL=1`).

use std::path::Path;
use std::process::Command;

mod common;

use common::present;
use tq_models::fetch::KnownModel;

fn generate(prompt: &str, alloc: &str, cache: Option<&Path>) -> (Vec<u64>, Option<u64>, String) {
    generate_n(prompt, alloc, cache, 6)
}

/// [`generate`] of `max_tokens` tokens.
fn generate_n(
    prompt: &str,
    alloc: &str,
    cache: Option<&Path>,
    max_tokens: usize,
) -> (Vec<u64>, Option<u64>, String) {
    let max_tokens = max_tokens.to_string();
    let mut command = Command::new(env!("CARGO_BIN_EXE_tq"));
    command.args([
        "generate",
        "--prompt",
        prompt,
        "--max-tokens",
        &max_tokens,
        "--alloc",
        alloc,
        "--json",
    ]);
    if let Some(path) = cache {
        command.arg("--prompt-cache").arg(path);
    }
    let output = command.output().expect("tq runs");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let tokens = report["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect();
    (tokens, report["prompt_cache_reused"].as_u64(), stderr)
}

#[test]
fn warm_runs_give_the_cold_runs_tokens_and_foreign_caches_are_ignored() {
    if present(KnownModel::SmolLm2).is_none() {
        return;
    }
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/tests/data/GPL-3.txt"),
    )
    .unwrap();
    // About 330 tokens: more than one 256-token prefill chunk.
    let prompt: String = text.chars().take(1500).collect();
    let longer = format!("{prompt} You may copy it.");
    let dir = std::env::temp_dir().join(format!("tq-prompt-cache-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("prompt.tqp");

    let (plain, _, _) = generate(&prompt, "rec4.25", None);
    let (cold, reused, _) = generate(&prompt, "rec4.25", Some(&file));
    assert_eq!((cold.clone(), reused), (plain.clone(), Some(0)));
    let (warm, reused, stderr) = generate(&prompt, "rec4.25", Some(&file));
    assert_eq!(warm, plain);
    // The whole first chunk: the boundary a heavy-hitter cache is saved on.
    assert_eq!(reused, Some(256), "{stderr}");
    assert!(stderr.contains("reusing"), "{stderr}");

    let (longer_plain, _, _) = generate(&longer, "rec4.25", None);
    let (longer_warm, reused, _) = generate(&longer, "rec4.25", Some(&file));
    assert_eq!(longer_warm, longer_plain);
    assert_eq!(reused, Some(256));

    // Another allocation: reported, recomputed, and its own cold tokens.
    let (other_plain, _, _) = generate(&prompt, "k5v4", None);
    let (other, reused, stderr) = generate(&prompt, "k5v4", Some(&file));
    assert_eq!((other, reused), (other_plain, Some(0)));
    assert!(
        stderr.contains("ignored") && stderr.contains("allocation"),
        "{stderr}"
    );

    // A damaged file: reported, recomputed.
    let mut bytes = std::fs::read(&file).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x20;
    std::fs::write(&file, &bytes).unwrap();
    let (again, reused, stderr) = generate(&prompt, "k5v4", Some(&file));
    assert_eq!(reused, Some(0));
    assert!(stderr.contains("ignored"), "{stderr}");
    let (other_plain, _, _) = generate(&prompt, "k5v4", None);
    assert_eq!(again, other_plain);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Windows that grow with the context (`recent_fraction` over small floors, so they grow
/// within this prompt): a run's window depends on the tokens held only, so a run without a
/// prompt cache (a cache of fixed capacity, sized by `--max-tokens`), a cold and a warm run with
/// one (a cache that grows in pages) and a run asked for more tokens all give the same tokens.
/// (Windows given as fractions of the capacity failed exactly this.)
#[test]
fn growing_windows_give_the_same_tokens_in_every_cache() {
    if present(KnownModel::SmolLm2).is_none() {
        return;
    }
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/tests/data/GPL-3.txt"),
    )
    .unwrap();
    let prompt: String = text.chars().take(1500).collect();
    let dir = std::env::temp_dir().join(format!("tq-prompt-cache-grow-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let alloc = dir.join("grow.toml");
    std::fs::write(
        &alloc,
        "name = \"grow\"\nsink_tokens = 2\nrecent_dtype = \"q8\"\n\
         key = { codec = \"mse\", bits = 4, center = \"first-chunk\", basis = \"planes\", \
         recent_fp_tokens = 8, recent_fraction = 0.125 }\n\
         value = { codec = \"mse\", bits = 3, center = \"first-chunk\", norm_correction = true, \
         recent_fraction = 0.078125 }\n",
    )
    .unwrap();
    let alloc = alloc.to_str().unwrap();
    let file = dir.join("prompt.tqp");
    let (plain, _, _) = generate(&prompt, alloc, None);
    let (cold, reused, _) = generate(&prompt, alloc, Some(&file));
    assert_eq!((cold, reused), (plain.clone(), Some(0)));
    let (warm, reused, stderr) = generate(&prompt, alloc, Some(&file));
    assert_eq!(warm, plain);
    assert!(reused.unwrap() > 256, "{stderr}");
    let (longer, _, _) = generate_n(&prompt, alloc, None, 40);
    assert_eq!(
        longer[..plain.len()],
        plain[..],
        "--max-tokens 40 against 6"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_prompt_cache_needs_the_cpu_backend() {
    let output = Command::new(env!("CARGO_BIN_EXE_tq"))
        .args([
            "generate",
            "--prompt",
            "Hi",
            "--backend",
            "wgpu",
            "--prompt-cache",
            "/tmp/x.tqp",
        ])
        .output()
        .expect("tq runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    // Either no adapter (reported first) or the backend refusal; never a panic.
    assert!(
        stderr.contains("--prompt-cache needs the CPU backend")
            || stderr.contains("no GPU adapter"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}
