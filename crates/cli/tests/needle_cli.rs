//! `tq needle` and `tq demo` as a user runs them: the synthetic grid (no model), the JSON row
//! contract of the model grid, the demo table, and errors as messages. Tests that need the
//! reference model skip with a message when it is absent (fail instead with
//! `TQ_REQUIRE_MODEL=1`) and run the smallest prompts that still hold a haystack.

mod common;

use common::{json, present, tq};
use tq_models::fetch::KnownModel;

fn model_present() -> bool {
    present(KnownModel::SmolLm2).is_some()
}

/// The smallest model grid (300 tokens, f16 and `tq3.5`, answers of `max_tokens` tokens) at
/// `depths`, followed by `extra`.
fn small_grid<'a>(depths: &'a str, max_tokens: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let grid = ["needle", "--contexts", "300", "--depths", depths];
    let tail = ["--alloc", "f16,tq3.5", "--max-tokens", max_tokens];
    grid.into_iter()
        .chain(tail)
        .chain(extra.iter().copied())
        .collect()
}

/// The JSON rows `tq` prints for `args`.
fn rows(args: &[&str]) -> Vec<serde_json::Value> {
    json(args).as_array().expect("an array of rows").clone()
}

#[test]
fn synthetic_needle_json_rows_cover_the_grid() {
    let (ok, stdout, stderr) = tq(&[
        "needle",
        "--synthetic",
        "--contexts",
        "1024,2048",
        "--depths",
        "0.1,0.9",
        "--alloc",
        "f16,tq2.5",
        "--head-dim",
        "64",
        "--json",
    ]);
    assert!(ok, "{stderr}");
    let rows: serde_json::Value = serde_json::from_str(&stdout).expect("JSON on stdout only");
    let rows = rows.as_array().expect("an array");
    assert_eq!(rows.len(), 2 * 2 * 2);
    for row in rows {
        for key in [
            "alloc",
            "tokens",
            "depth",
            "needle_rank",
            "needle_weight",
            "exact_weight",
            "bytes_per_token",
        ] {
            assert!(row.get(key).is_some(), "missing {key}: {row}");
        }
    }
    // f16 keys barely move the scores: the needle stays first with about its exact mass.
    let f16 = rows.iter().find(|r| r["alloc"] == "f16").unwrap();
    assert_eq!(f16["needle_rank"], 1);
    let drift = f16["needle_weight"].as_f64().unwrap() - f16["exact_weight"].as_f64().unwrap();
    assert!(drift.abs() < 0.01, "{f16}");
}

#[test]
fn synthetic_needle_table_names_every_allocation() {
    let (ok, stdout, stderr) = tq(&[
        "needle",
        "--synthetic",
        "--contexts",
        "1024",
        "--head-dim",
        "64",
    ]);
    assert!(ok, "{stderr}");
    for preset in ["f16", "k5v4", "mse-k4v4", "tq3.5", "tq2.5"] {
        assert!(stdout.contains(preset), "{stdout}");
    }
}

#[test]
fn needle_errors_are_messages_not_panics() {
    // A spec without {key} hides the same needle whatever the seed.
    let literal = std::env::temp_dir().join(format!("tq-literal-{}.toml", std::process::id()));
    let spec = "filler = \"a\"\nneedle = \"b\"\nquestion = \"c\"\nfacts = [\"b\"]\n";
    std::fs::write(&literal, spec).expect("temp file");
    for (args, says) in [
        (&["needle", "--synthetic", "--depths", "1.5"][..], "depth"),
        (&["needle", "--synthetic", "--alloc", "k9v9"][..], "k9v9"),
        (
            &[
                "needle",
                "--spec",
                "/nonexistent/spec.toml",
                "--model",
                "/nonexistent.gguf",
            ][..],
            "spec",
        ),
        (&["demo", "--depth=-0.5"][..], "depth"),
        (
            &[
                "needle",
                "--spec",
                literal.to_str().expect("a UTF-8 temp path"),
                "--key-seeds",
                "1,2",
            ][..],
            "--key-seeds",
        ),
        (
            &[
                "needle",
                "--key-seeds",
                "1,2,1",
                "--model",
                "/nonexistent.gguf",
            ][..],
            "seed 1 is given twice",
        ),
        (
            &[
                "needle",
                "--exact-needle",
                "both",
                "--exact-needle-layers",
                "3-1",
            ][..],
            "comes before",
        ),
        (
            &["needle", "--exact-needle", "both", "--needle-attention"][..],
            "cannot be used with",
        ),
        (
            &["needle", "--exact-needle-layers", "0-3"][..],
            "--exact-needle",
        ),
        (
            &["needle", "--exact-needle", "keys", "--exact-policy", "0,4"][..],
            "at least 1 token",
        ),
        (
            &[
                "needle",
                "--exact-needle",
                "keys",
                "--exact-policy",
                "every:0",
            ][..],
            "at least 1 token",
        ),
        (
            &["needle", "--window-attention", "0"][..],
            "at least 1 token",
        ),
    ] {
        let (ok, _, stderr) = tq(args);
        assert!(!ok, "tq {args:?} succeeded");
        assert!(stderr.contains(says), "tq {args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    let _ = std::fs::remove_file(literal);
}

#[test]
fn needle_json_rows_have_the_contract_keys() {
    if !model_present() {
        return;
    }
    let rows = rows(&small_grid("0.5", "12", &["--json"]));
    assert_eq!(rows.len(), 2);
    for row in rows {
        for key in [
            "alloc",
            "context",
            "depth",
            "facts_found",
            "facts_total",
            "score",
            "score_case_insensitive",
            "answer",
        ] {
            assert!(row.get(key).is_some(), "missing {key}: {row}");
        }
        assert_eq!(row["facts_total"], 1);
        assert_eq!(row["context"], 300);
    }
}

/// `--key-seeds` runs the grid once per seed: each seed hides another key in the same cells,
/// the rows say which, and the table's summary pairs the allocations on the same cells.
#[test]
fn key_seeds_run_the_grid_once_per_seed() {
    if !model_present() {
        return;
    }
    let grid = small_grid("0.5", "8", &["--key-seeds", "1,2"]);
    let rows = rows(&[grid.as_slice(), &["--json"]].concat());
    let cells: Vec<(String, u64, String)> = rows
        .iter()
        .map(|r| {
            let seed = r["key_seed"].as_u64().expect("a key seed");
            (r["alloc"].to_string(), seed, r["expected"].to_string())
        })
        .collect();
    assert_eq!(cells.len(), 4, "{cells:?}");
    let seeds: Vec<u64> = cells.iter().map(|c| c.1).collect();
    assert_eq!(seeds, [1, 1, 2, 2]);
    // The two allocations of a seed look for the same key; the two seeds for different ones.
    assert_eq!(cells[0].2, cells[1].2);
    assert_eq!(cells[2].2, cells[3].2);
    assert_ne!(cells[0].2, cells[2].2);

    let (ok, stdout, stderr) = tq(&grid);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("key seed"), "{stdout}");
    let summary = stdout
        .lines()
        .find(|l| l.starts_with("tq3.5:"))
        .unwrap_or_else(|| panic!("no summary line for tq3.5: {stdout}"));
    assert!(
        summary.contains("of 2 cells") && summary.contains("against f16 on the same 2 cells"),
        "{summary}"
    );
    assert!(summary.contains("McNemar's exact p ="), "{summary}");
}

/// `--needle-attention` measures the weight every query head of every layer puts on the
/// needle without changing the answers, and the table names the heads that read it most.
#[test]
fn needle_attention_measures_every_head_without_changing_the_answers() {
    if !model_present() {
        return;
    }
    let answers = |rows: &[serde_json::Value]| -> Vec<String> {
        rows.iter().map(|r| r["answer"].to_string()).collect()
    };
    let plain = rows(&small_grid("0.5", "8", &["--json"]));
    let probed = rows(&small_grid("0.5", "8", &["--json", "--needle-attention"]));
    assert_eq!(answers(&probed), answers(&plain));
    assert!(plain[0].get("needle_attention").is_none(), "{}", plain[0]);
    for row in &probed {
        let layers = row["needle_attention"].as_array().expect("per layer");
        assert_eq!(layers.len(), 30, "SmolLM2's layers");
        let weights: Vec<f64> = layers
            .iter()
            .flat_map(|heads| heads.as_array().expect("per query head").clone())
            .map(|w| w.as_f64().expect("a weight"))
            .collect();
        assert_eq!(weights.len(), 30 * 9, "SmolLM2's query heads");
        assert!(
            weights.iter().all(|w| (0.0..=1.0).contains(w)),
            "{weights:?}"
        );
        // The needle is a sentence among some 300 tokens: some head reads it.
        assert!(weights.iter().any(|&w| w > 0.1), "{weights:?}");
    }
    let (ok, stdout, stderr) = tq(&small_grid("0.5", "8", &["--needle-attention"]));
    assert!(ok, "{stderr}");
    let line = stdout
        .lines()
        .find(|l| l.starts_with("f16: KV heads by weight on the needle"))
        .unwrap_or_else(|| panic!("no retrieval-head line for f16: {stdout}"));
    assert_eq!(line.matches("layer ").count(), 12, "{line}");
}

/// `--exact-needle` swaps the needle's share of every row after it (its window aside) for
/// its exact keys and values, in the layers asked for: the rows say what was read exactly and
/// how many outputs were swapped; a layer range beyond the model is a message.
#[test]
fn exact_needle_swaps_the_rows_after_the_needle_in_the_layers_asked_for() {
    if !model_present() {
        return;
    }
    let swapped = |extra: &[&str]| -> Vec<u64> {
        let args = small_grid(
            "0.2",
            "8",
            &[&["--json", "--exact-needle", "both"], extra].concat(),
        );
        rows(&args)
            .iter()
            .map(|row| {
                let exact = &row["exact_needle"];
                assert_eq!(exact[0]["streams"], "both", "{row}");
                exact[1].as_u64().expect("a count of swapped outputs")
            })
            .collect()
    };
    let all = swapped(&[]);
    let first_layer = swapped(&["--exact-needle-layers", "0-0"]);
    let answer_only = swapped(&["--exact-needle-answer-only"]);
    for ((all, first_layer), answer_only) in all.iter().zip(&first_layer).zip(&answer_only) {
        // tq3.5 keeps no window, so its rows after the needle are swapped in every layer.
        assert!(*first_layer > 0, "{first_layer}");
        assert!(first_layer < all, "{first_layer} of {all}");
        assert!(answer_only < all, "{answer_only} of {all}");
    }
    let plain = rows(&small_grid("0.2", "8", &["--json"]));
    assert!(plain[0].get("exact_needle").is_none(), "{}", plain[0]);
    // The heavy-hitter simulation: rows report the share kept per layer, small for a high
    // threshold.
    let policy = rows(&small_grid(
        "0.2",
        "4",
        &["--json", "--exact-needle", "both", "--exact-policy", "32,8"],
    ));
    for row in &policy {
        let kept: Vec<f64> = row["exact_kept"]
            .as_array()
            .expect("the share kept per layer")
            .iter()
            .map(|k| k.as_f64().expect("a share"))
            .collect();
        assert_eq!(kept.len(), 30, "{row}");
        assert!(kept.iter().all(|k| (0.0..0.5).contains(k)), "{kept:?}");
        assert!(kept.iter().any(|&k| k > 0.0), "{kept:?}");
    }
    let (ok, _, stderr) = tq(&small_grid(
        "0.2",
        "8",
        &["--exact-needle", "keys", "--exact-needle-layers", "0-30"],
    ));
    assert!(
        !ok && stderr.contains("the model has 30 layers"),
        "{stderr}"
    );
}

/// `--window-attention W` ranks every needle token in every layer, and the table reports the
/// share in the top 1% per layer.
#[test]
fn window_attention_ranks_the_needles_tokens_in_every_layer() {
    if !model_present() {
        return;
    }
    for row in rows(&small_grid(
        "0.5",
        "4",
        &["--json", "--window-attention", "64"],
    )) {
        let layers = row["needle_window_ranks"].as_array().expect("per layer");
        assert_eq!(layers.len(), 30, "SmolLM2's layers");
        for tokens in layers {
            let ranks = tokens.as_array().expect("per needle token");
            assert!(!ranks.is_empty(), "{row}");
            assert!(
                ranks
                    .iter()
                    .all(|r| (0.0..1.0).contains(&r.as_f64().expect("a rank"))),
                "{ranks:?}"
            );
        }
    }
    let (ok, stdout, stderr) = tq(&small_grid("0.5", "4", &["--window-attention", "64"]));
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains("f16: needle tokens in the top 1% by attention received in a 64-token window, per layer: 0: "),
        "{stdout}"
    );
}

/// An allocation with heavy hitters reports what its cache kept (the share of the tokens that
/// left the windows, and per layer the share of the needle's tokens), in the rows and the
/// table; an allocation without them reports nothing.
#[test]
fn heavy_hitters_report_what_the_cache_kept() {
    if !model_present() {
        return;
    }
    let file = std::env::temp_dir().join(format!("tq-heavy-{}.toml", std::process::id()));
    std::fs::write(
        &file,
        "name = \"heavy\"\n\
         key = { codec = \"mse\", bits = 3, recent_fp_tokens = 32, heavy_hitters = 4.0 }\n\
         value = { codec = \"mse\", bits = 3, recent_fp_tokens = 32, heavy_hitters = 4.0 }\n",
    )
    .unwrap();
    let alloc = format!("f16,{}", file.display());
    let args = [
        "needle",
        "--contexts",
        "300",
        "--depths",
        "0.5",
        "--alloc",
        &alloc,
        "--max-tokens",
        "4",
    ];
    let found = rows(&[&args[..], &["--json"]].concat());
    assert_eq!(found.len(), 2);
    assert!(found[0].get("heavy_hitters").is_none(), "{}", found[0]);
    let kept = &found[1]["heavy_hitters"];
    let share = kept["share"].as_f64().expect("a share");
    assert!(share > 0.0 && share < 1.0, "{kept}");
    let needle = kept["needle"].as_array().expect("per layer");
    assert_eq!(needle.len(), 30, "SmolLM2's layers");
    assert!(
        needle
            .iter()
            .all(|n| (0.0..=1.0).contains(&n.as_f64().unwrap()))
    );
    let (ok, stdout, stderr) = tq(&args);
    std::fs::remove_file(&file).ok();
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains(
            "heavy: heavy hitters kept (share of the tokens that left the windows) per cell: "
        ),
        "{stdout}"
    );
}

/// `--concurrent` runs the cells as parallel tasks: the same rows in the same order, the same
/// answers (only the speeds may differ).
#[test]
fn concurrent_cells_give_the_same_rows() {
    if !model_present() {
        return;
    }
    let answers = |extra: &[&str]| {
        rows(&small_grid("0.2,0.8", "8", &[&["--json"], extra].concat()))
            .iter()
            .map(|r| {
                let keys = ["alloc", "context", "depth", "answer", "prompt_tokens"];
                keys.map(|k| r[k].to_string())
            })
            .collect::<Vec<_>>()
    };
    let one_at_a_time = answers(&[]);
    assert_eq!(one_at_a_time.len(), 2 * 2);
    assert_eq!(answers(&["--concurrent"]), one_at_a_time);
}

#[test]
fn demo_prints_one_row_per_allocation() {
    if !model_present() {
        return;
    }
    let (ok, stdout, stderr) = tq(&["demo", "--context", "300"]);
    assert!(ok, "{stderr}");
    for preset in ["f16", "k5v4", "tq3.5"] {
        assert!(
            stdout.lines().any(|l| l.trim_start().starts_with(preset)),
            "{stdout}"
        );
    }
    assert!(stdout.contains("cache bytes/token"), "{stdout}");
}

#[test]
fn a_literal_two_fact_spec_file_is_scored_per_fact() {
    if !model_present() {
        return;
    }
    // The seed's two-fact test: no {key}, so the needle and facts are literal.
    let spec = "filler = \"The grass is green. The sky is blue.\"\n\
                needle = \"The vault code is FROSTBLOCK-7 and the tag is VcMYB4.\"\n\
                question = \"What are the vault code and the tag?\"\n\
                facts = [\"FROSTBLOCK-7\", \"VcMYB4\"]\n\
                comment = \"extra keys are allowed\"\n";
    let path = std::env::temp_dir().join(format!("tq-needle-spec-{}.toml", std::process::id()));
    std::fs::write(&path, spec).expect("temp file");
    let (ok, stdout, stderr) = tq(&[
        "needle",
        "--spec",
        path.to_str().unwrap(),
        "--contexts",
        "300",
        "--depths",
        "0.5",
        "--alloc",
        "f16",
        "--max-tokens",
        "16",
        "--json",
    ]);
    let _ = std::fs::remove_file(&path);
    assert!(ok, "{stderr}");
    let rows: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
    let row = &rows[0];
    assert_eq!(row["facts_total"], 2);
    assert_eq!(
        row["expected"],
        serde_json::json!(["FROSTBLOCK-7", "VcMYB4"])
    );
    let answer = row["answer"].as_str().unwrap();
    let found = ["FROSTBLOCK-7", "VcMYB4"]
        .iter()
        .filter(|f| answer.contains(*f))
        .count();
    assert_eq!(row["facts_found"], found, "{row}");
}
