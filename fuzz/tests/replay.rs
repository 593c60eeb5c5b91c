//! Every seed and every input that once crashed a target, run through the target functions as
//! an ordinary test: a crash the fuzzer found stays fixed without a fuzzer in CI.
//!
//! Inputs: `fuzz/seeds/<target>/` (the corpus `cargo xtask fuzz` starts from; for the
//! allocation target also every shipped preset under `crates/cache/presets/`) and
//! `fuzz/regressions/<target>/` (each file named after what it broke; see `docs/fuzzing.md`).

use std::path::{Path, PathBuf};
use tq_fuzz::TokenizerPair;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

/// The files under `dir`, recursively, sorted (none if it does not exist).
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for entry in entries {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(files(&path));
        } else if path.file_name().is_some_and(|n| n != "README.md") {
            out.push(path);
        }
    }
    out.sort();
    out
}

fn inputs(target: &str) -> Vec<PathBuf> {
    let mut all = files(&root().join("seeds").join(target));
    all.extend(files(&root().join("regressions").join(target)));
    all
}

fn replay(target: &str, run: impl Fn(&[u8])) -> usize {
    let inputs = inputs(target);
    for path in &inputs {
        eprintln!("{target}: {}", path.display());
        run(&std::fs::read(path).unwrap());
    }
    inputs.len()
}

#[test]
fn gguf_inputs_replay() {
    assert!(replay("gguf", tq_fuzz::gguf) >= 2);
}

#[test]
fn allocation_inputs_replay() {
    let seeds = replay("allocation", tq_fuzz::allocation);
    let presets = files(&root().join("../crates/cache/presets"));
    for path in presets
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
    {
        tq_fuzz::allocation(&std::fs::read(path).unwrap());
    }
    assert!(seeds + presets.len() >= 20);
}

#[test]
fn cache_file_inputs_replay() {
    assert!(replay("cache_file", tq_fuzz::cache_file) >= 6);
}

#[test]
fn tokenizer_inputs_replay() {
    let pair = match TokenizerPair::load() {
        Ok(pair) => pair,
        Err(reason) if std::env::var("TQ_REQUIRE_MODEL").as_deref() != Ok("1") => {
            eprintln!("skipped: {reason}");
            return;
        }
        Err(reason) => panic!("{reason} and TQ_REQUIRE_MODEL=1"),
    };
    assert!(replay("tokenizer", |data| tq_fuzz::tokenizer(data, &pair)) >= 4);
}
