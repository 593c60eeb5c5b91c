//! `--model smollm2|gemma3-270m|FILE.gguf` as a user passes it: `tq generate` runs Gemma 3
//! (with `--kernel llamacpp`, the reference engine's tokens), bad names and misuse are
//! messages, and `tq tokenize` / `tq inspect` work on both models (Gemma 3's sliding and
//! global layers shown apart). Tests that need a model file skip with a message when it is
//! absent (fail instead with `TQ_REQUIRE_MODEL=1`). `tq bench matmul` runs on both models.

mod common;

use common::{present, tq};
use tq_models::fetch::KnownModel;

/// The first 8 tokens llama.cpp generates greedily after "The capital of France is" on Gemma 3
/// 270M with an f16 cache (`../shared/reference/gemma3_llamacpp.json`).
const GEMMA3_FRANCE: [u64; 8] = [506, 5279, 529, 506, 2891, 529, 7001, 236761];

fn generated_tokens(args: &[&str]) -> Vec<u64> {
    let (ok, stdout, stderr) = tq(args);
    assert!(ok, "{args:?}: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("JSON on stdout");
    report["tokens"]
        .as_array()
        .expect("a tokens array")
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect()
}

#[test]
fn generate_runs_gemma3() {
    let Some(path) = present(KnownModel::Gemma3_270m) else {
        return;
    };
    let prompt = "The capital of France is";
    let fused = generated_tokens(&[
        "generate",
        "--model",
        "gemma3-270m",
        "--prompt",
        prompt,
        "--max-tokens",
        "8",
        "--json",
    ]);
    assert_eq!(fused.len(), 8, "{fused:?}");
    // The reference engine's kernel and numerics, the model given as a file: its tokens.
    let llamacpp = generated_tokens(&[
        "generate",
        "--model",
        path.to_str().unwrap(),
        "--prompt",
        prompt,
        "--max-tokens",
        "8",
        "--kernel",
        "llamacpp",
        "--json",
    ]);
    assert_eq!(llamacpp, GEMMA3_FRANCE);
}

#[test]
fn generate_with_the_llamacpp_kernel_gives_the_reference_text_on_smollm2() {
    if present(KnownModel::SmolLm2).is_none() {
        return;
    }
    let (ok, stdout, stderr) = tq(&[
        "generate",
        "--prompt",
        "The capital of France is",
        "--max-tokens",
        "24",
        "--kernel",
        "llamacpp",
        "--json",
    ]);
    assert!(ok, "{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("JSON on stdout");
    // llama.cpp's greedy completion (`../shared/reference/smollm2_llamacpp.json`).
    assert_eq!(
        report["text"],
        " Paris.\n\nThe United States has a population of approximately 321 million people.\n\n\
         The United States"
    );
}

#[test]
fn the_llamacpp_kernel_refuses_compressed_caches_with_a_message() {
    for (model, present) in [
        ("smollm2", present(KnownModel::SmolLm2).is_some()),
        ("gemma3-270m", present(KnownModel::Gemma3_270m).is_some()),
    ] {
        if !present {
            continue;
        }
        let (ok, _, stderr) = tq(&[
            "generate",
            "--model",
            model,
            "--prompt",
            "Hi",
            "--max-tokens",
            "2",
            "--alloc",
            "tq3.5",
            "--kernel",
            "llamacpp",
        ]);
        assert!(!ok, "{model}");
        assert!(
            stderr.contains("--kernel llamacpp reads plain f16 caches only")
                && stderr.contains("--alloc f16"),
            "{model}: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

/// Gemma 3 270M is a base model without a chat template: `--chat` says so instead of
/// wrapping the prompt in another model's template.
#[test]
fn chat_without_a_template_is_a_message() {
    if present(KnownModel::Gemma3_270m).is_none() {
        return;
    }
    let (ok, _, stderr) = tq(&[
        "generate",
        "--model",
        "gemma3-270m",
        "--prompt",
        "Hi",
        "--chat",
        "--max-tokens",
        "2",
    ]);
    assert!(!ok);
    assert!(
        stderr.contains("--chat needs a ChatML chat template") && stderr.contains("without --chat"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
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
    // The sliding / global breakdown, per preset, to 32K tokens.
    let (ok, stdout, stderr) = tq(&["inspect", "--model", "gemma3-270m"]);
    assert!(ok, "{stderr}");
    for text in [
        "15 sliding layers (window 512, ring 1023 slots), 3 global layers",
        "sliding B/token",
        "global B/token",
        "MiB at 4K",
        "MiB at 16K",
        "MiB at 32K",
    ] {
        assert!(stdout.contains(text), "{text}: {stdout}");
    }
    let (_, breakdown) = stdout.split_once("sliding B/token").unwrap();
    let f16 = breakdown
        .lines()
        .find(|l| l.trim_start().starts_with("f16 "))
        .unwrap_or_else(|| panic!("an f16 row: {stdout}"));
    // f16: 15 sliding layers × (1 head × 256 × 2 streams × 2 bytes + a 4-byte position) = 15420
    // bytes per token, 3 global layers 3084.
    assert!(f16.contains("15420") && f16.contains("3084"), "{f16}");
}

#[test]
fn inspect_has_no_sliding_table_for_smollm2() {
    if present(KnownModel::SmolLm2).is_none() {
        return;
    }
    let (ok, stdout, stderr) = tq(&["inspect"]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("30 layers (every token)"), "{stdout}");
    assert!(!stdout.contains("sliding B/token"), "{stdout}");
}

#[test]
fn bench_matmul_times_every_instruction_set_on_both_models() {
    for (model, name, kinds) in [
        (KnownModel::SmolLm2, "smollm2", &["Q4_1"][..]),
        (
            KnownModel::Gemma3_270m,
            "gemma3-270m",
            &["Q4_K", "Q6_K"][..],
        ),
    ] {
        if present(model).is_none() {
            continue;
        }
        let args = [
            "bench",
            "matmul",
            "--model",
            name,
            "--tokens",
            "1,3",
            "--repeats",
            "1",
            "--json",
        ];
        let (ok, stdout, stderr) = tq(&args);
        assert!(ok, "{args:?}: {stderr}");
        // The block's matrices are listed with their formats.
        for kind in kinds {
            assert!(stderr.contains(kind), "{kind}: {stderr}");
        }
        let rows: serde_json::Value = serde_json::from_str(&stdout).expect("a JSON array");
        let rows = rows.as_array().unwrap();
        let isas = tq_models::quant::Isa::available();
        // Per token count: a row per instruction set, then the plain read.
        assert_eq!(rows.len(), 2 * (isas.len() + 1), "{stdout}");
        for (row, (tokens, isa)) in rows.iter().zip([1u64, 3].iter().flat_map(|t| {
            isas.iter()
                .map(|i| i.name())
                .chain(["read"])
                .map(move |i| (*t, i))
        })) {
            assert_eq!(row["tokens"], tokens, "{row}");
            assert_eq!(row["isa"], isa, "{row}");
            assert!(row["weight_gbs"].as_f64().unwrap() > 0.0, "{row}");
            assert_eq!(row["gmacs"].as_f64().unwrap() > 0.0, isa != "read", "{row}");
        }
    }
    // The whole model: every block and the output head (SmolLM2 ties it to the embedding).
    if present(KnownModel::SmolLm2).is_some() {
        let args = ["bench", "matmul", "--layer", "all", "--tokens", "1"];
        let (ok, stdout, stderr) = tq(&[&args[..], &["--repeats", "1", "--json"]].concat());
        assert!(ok, "{args:?}: {stderr}");
        // 30 blocks of 7 matrices, and the tied output head.
        assert!(stderr.contains("211 matrices"), "{stderr}");
        let rows: serde_json::Value = serde_json::from_str(&stdout).expect("a JSON array");
        let read = rows.as_array().unwrap().last().unwrap().clone();
        assert_eq!(read["isa"], "read", "{stdout}");
        assert!(read["tokens_per_s"].is_null(), "{read}");
    }
    let (ok, _, stderr) = tq(&["bench", "matmul", "--layer", "x"]);
    assert!(
        !ok && stderr.contains("neither a block index nor `all`"),
        "{stderr}"
    );
    let (ok, _, stderr) = tq(&["bench", "matmul", "--tokens", "0"]);
    assert!(!ok && stderr.contains("--tokens"), "{stderr}");
}

#[test]
fn bench_e2e_accounts_for_the_peak_rss() {
    // A small run of the reference model: the JSON rows split the peak resident memory into
    // the model file, the fixed part (program, code paged in, metadata), the cache, one chunk's
    // scratch, and what is left. The split must explain the peak to within a few MiB: a model
    // file not resident, code pages counted twice or the cache's heap missed would leave tens
    // of MiB unexplained (the cache alone is 2 MiB here, the weights 100 MiB).
    if present(KnownModel::SmolLm2).is_none() {
        return;
    }
    let args = [
        "bench",
        "e2e",
        "--contexts",
        "96",
        "--alloc",
        "f16,tq3.5",
        "--repeats",
        "1",
        "--decode-tokens",
        "2",
        "--prefill-chunk",
        "32",
        "--json",
    ];
    let (ok, stdout, stderr) = tq(&args);
    assert!(ok, "{args:?}: {stderr}");
    let rows: serde_json::Value = serde_json::from_str(&stdout).expect("a JSON array");
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 2, "{stdout}");
    const MIB: f64 = 1048576.0;
    for row in rows {
        let get = |key: &str| {
            row[key]
                .as_f64()
                .unwrap_or_else(|| panic!("{key} in {row}"))
        };
        assert_eq!(row["prefill_tokens"], 96, "{row}");
        assert!(get("prefill_tokens_per_s") > 0.0 && get("decode_tokens_per_s") > 0.0);
        // The cache's heap holds its buffers (and codec state on top).
        assert!(get("cache_heap_bytes") >= get("cache_bytes"), "{row}");
        // The kernels' and forward pass's code: some pages, not the model file.
        let code = get("code_paged_bytes");
        assert!(code > 0.0 && code < 32.0 * MIB, "{row}");
        let accounted = get("weights_bytes")
            + get("program_bytes")
            + code
            + get("metadata_heap_bytes")
            + get("cache_heap_bytes")
            + get("scratch_bytes");
        let other = get("other_bytes");
        assert_eq!(get("peak_rss_bytes"), accounted + other, "{row}");
        assert!(
            other.abs() < 4.0 * MIB,
            "unexplained {} MiB: {row}",
            other / MIB
        );
    }
    assert!(stderr.contains("code paged in"), "{stderr}");
}
