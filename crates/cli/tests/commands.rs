//! The `tq` commands' JSON contracts and error behaviour, run as a user would run them.

mod common;

use common::{json, tq};

#[test]
fn codebook_json_has_the_contract_keys_and_values() {
    let v = json(&["codebook", "--dim", "128", "--bits", "2", "--json"]);
    assert_eq!(v["dim"], 128);
    assert_eq!(v["bits"], 2);
    assert_eq!(v["distribution"], "beta");
    assert_eq!(v["centroids"].as_array().unwrap().len(), 4);
    assert_eq!(v["thresholds"].as_array().unwrap().len(), 3);
    // d·C of the exact law at d = 128, b = 2 (reference: 0.11600007).
    assert!((v["distortion"].as_f64().unwrap() - 0.116_000_07).abs() < 1e-7);
    let g = json(&[
        "codebook",
        "--dim",
        "1",
        "--bits",
        "1",
        "--distribution",
        "gaussian",
        "--json",
    ]);
    // N(0,1), one bit: ±√(2/π), distortion 1 − 2/π.
    assert!(
        (g["centroids"][1].as_f64().unwrap() - (2.0 / std::f64::consts::PI).sqrt()).abs() < 1e-12
    );
    assert!((g["distortion"].as_f64().unwrap() - (1.0 - 2.0 / std::f64::consts::PI)).abs() < 1e-12);
}

#[test]
fn codebook_errors_are_messages_not_panics() {
    for args in [
        vec!["codebook", "--dim", "64", "--bits", "9"],
        vec!["codebook", "--dim", "2", "--bits", "3"],
    ] {
        let (ok, _, stderr) = tq(&args);
        assert!(!ok, "{args:?} should fail");
        assert!(stderr.starts_with("tq: error:"), "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

#[test]
fn bench_codec_json_rows() {
    let rows = json(&[
        "bench",
        "codec",
        "--json",
        "--vectors",
        "256",
        "--repeats",
        "1",
    ]);
    let rows = rows.as_array().unwrap();
    // d ∈ {64, 128} × rotation ∈ {haar, hadamard} × 6 codecs × 2 thread settings.
    assert_eq!(rows.len(), 2 * 2 * 6 * 2);
    for row in rows {
        for key in [
            "dim",
            "bits",
            "codec",
            "rotation",
            "threads",
            "encode_vectors_per_s",
            "decode_vectors_per_s",
        ] {
            assert!(!row[key].is_null(), "missing {key} in {row}");
        }
        assert!(row["encode_vectors_per_s"].as_f64().unwrap() > 0.0);
    }
}

#[test]
fn bench_estimators_json_rows() {
    let rows = json(&[
        "bench",
        "estimators",
        "--json",
        "--samples",
        "300",
        "--dim",
        "64",
    ]);
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 4 * 4);
    let mse_b2 = rows
        .iter()
        .find(|r| r["estimator"] == "mse" && r["bits"] == 2)
        .unwrap();
    // Plain MSE shrinks by D_mse(2) ≈ 0.1145 at d = 64: visible even with 300 samples.
    assert!(mse_b2["bias"].as_f64().unwrap() < -0.09);
}

/// `--working-set model` times the same steps over one cache copy per layer of the shape's
/// model: per-layer rows that read the same bytes as the single-layer rows, and every row's
/// `bandwidth_fraction` is its GB/s over the streaming read of the same run.
#[test]
fn bench_attention_model_working_set_rows() {
    let rows = json(&[
        "bench",
        "attention",
        "--json",
        "--tokens",
        "256",
        "--shapes",
        "smollm2",
        "--configs",
        "f16,k5v4",
        "--working-set",
        "layer,model",
        "--repeats",
        "3",
    ]);
    let rows = rows.as_array().unwrap();
    let machine = rows.iter().find(|r| r["config"] == "stream-read").unwrap();
    let bandwidth = machine["gb_per_s"].as_f64().unwrap();
    let timed: Vec<_> = rows.iter().filter(|r| r["shape"] == "smollm2").collect();
    assert_eq!(timed.len(), 2 * 2, "{rows:?}");
    for config in ["f16", "k5v4"] {
        let pick = |set: &str| {
            *timed
                .iter()
                .find(|r| r["config"] == config && r["working_set"] == set)
                .unwrap_or_else(|| panic!("no {set} row for {config}"))
        };
        let (layer, model) = (pick("layer"), pick("model"));
        assert_eq!(layer["layers"], 1);
        assert_eq!(model["layers"], 30);
        assert_eq!(layer["bytes_read"], model["bytes_read"]);
        for row in [layer, model] {
            let fraction = row["bandwidth_fraction"].as_f64().unwrap();
            let gbs = row["gb_per_s"].as_f64().unwrap();
            assert!(
                fraction > 0.0 && (fraction - gbs / bandwidth).abs() <= 1e-9 * fraction,
                "{row}"
            );
        }
    }
}

/// `tq bench scan` rows: f16 once per (shape, T), then the coded and fast-scan kernels per
/// width, with the bytes each layout reads.
#[test]
fn bench_scan_json_rows() {
    let rows = json(&[
        "bench",
        "scan",
        "--json",
        "--tokens",
        "256",
        "--bits",
        "4,2",
        "--copies",
        "2",
        "--repeats",
        "3",
    ]);
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 2 * (1 + 2 * 2), "{rows:?}");
    let find = |shape: &str, kernel: &str, bits: Option<u64>| {
        rows.iter()
            .find(|r| r["shape"] == shape && r["kernel"] == kernel && r["bits"].as_u64() == bits)
            .unwrap_or_else(|| panic!("no {shape} {kernel} {bits:?} row"))
    };
    // d = 64: f16 2 bytes per coordinate; 4-bit records 8 words + an f32 norm; fast scan a
    // nibble per 4-bit coordinate (per two 2-bit ones) + an f32 norm; 2-bit records 4 words +
    // norm.
    assert_eq!(find("smollm2", "f16", None)["bytes_read"], 256 * 128);
    assert_eq!(find("smollm2", "coded", Some(4))["bytes_read"], 256 * 36);
    assert_eq!(
        find("smollm2", "fast-scan", Some(4))["bytes_read"],
        256 * 36
    );
    assert_eq!(find("smollm2", "coded", Some(2))["bytes_read"], 256 * 20);
    assert_eq!(find("d128", "fast-scan", Some(2))["bytes_read"], 256 * 36);
    for row in rows {
        assert!(row["seconds"].as_f64().unwrap() > 0.0, "{row}");
        assert!(row["bandwidth_fraction"].as_f64().unwrap() > 0.0, "{row}");
    }
    let with_steps = json(&[
        "bench",
        "scan",
        "--json",
        "--tokens",
        "64",
        "--bits",
        "4,2",
        "--copies",
        "1",
        "--repeats",
        "1",
        "--attention",
    ]);
    let with_steps = with_steps.as_array().unwrap();
    // Per shape and width four whole-step rows more: f16, coded and fast-scan attention, the
    // last with f32 and with integer value sums.
    assert_eq!(with_steps.len(), 2 * (1 + 2 * 2 + 2 * 4), "{with_steps:?}");
    for kernel in ["fast-scan-attend", "fast-scan-int-attend"] {
        assert!(
            with_steps
                .iter()
                .any(|r| r["kernel"] == kernel && r["bytes_read"].as_u64() > Some(0)),
            "{kernel}"
        );
    }
    let (ok, _, stderr) = tq(&["bench", "scan", "--bits", "5"]);
    assert!(!ok && stderr.contains("1 to 4 bits"), "{stderr}");
}

#[test]
fn bench_attention_refuses_a_model_working_set_beyond_its_memory_cap() {
    let (ok, _, stderr) = tq(&[
        "bench",
        "attention",
        "--tokens",
        "1048576",
        "--shapes",
        "d128",
        "--configs",
        "f16",
        "--working-set",
        "model",
        "--repeats",
        "1",
    ]);
    assert!(!ok);
    assert!(
        stderr.contains("model working set") && stderr.contains("GiB"),
        "{stderr}"
    );
}

#[test]
fn bench_attention_times_an_allocation_file() {
    // One lever at a time: an allocation TOML file is a config like a preset, named by its
    // path; a path that is neither is refused with the list of what is accepted.
    let dir = std::env::temp_dir().join(format!("tq-bench-attention-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("k3v2.toml");
    std::fs::write(
        &file,
        "name = \"k3v2\"\ndescription = \"3-bit keys, 2-bit values\"\n\
         key = { codec = \"mse\", bits = 3 }\nvalue = { codec = \"mse\", bits = 2 }\n",
    )
    .unwrap();
    let path = file.to_str().unwrap();
    let rows = json(&[
        "bench",
        "attention",
        "--json",
        "--tokens",
        "256",
        "--shapes",
        "smollm2",
        "--configs",
        path,
        "--repeats",
        "1",
    ]);
    let rows = rows.as_array().unwrap();
    let row = rows.iter().find(|r| r["config"] == path);
    assert!(
        row.is_some_and(|r| r["seconds"].as_f64().unwrap() > 0.0),
        "{rows:?}"
    );
    let missing = dir.join("absent.toml");
    let (ok, _, stderr) = tq(&[
        "bench",
        "attention",
        "--configs",
        missing.to_str().unwrap(),
        "--repeats",
        "1",
    ]);
    assert!(!ok && stderr.contains("allocation TOML file"), "{stderr}");
    // A file that does not parse names its problem, not "unknown config".
    let broken = dir.join("broken.toml");
    std::fs::write(
        &broken,
        "name = \"b\"\nkey = { codec = \"mse\", bits = 4, record_order = \"columns\" }\n\
         value = { codec = \"mse\", bits = 4 }\n",
    )
    .unwrap();
    let (ok, _, stderr) = tq(&[
        "bench",
        "attention",
        "--configs",
        broken.to_str().unwrap(),
        "--repeats",
        "1",
    ]);
    assert!(
        !ok && stderr.contains("record_order") && !stderr.contains("unknown config"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn synthetic_needle_runs_on_a_small_context() {
    // The synthetic table that `tq demo` showed before the model ran (the real demo and the
    // model grid are tested in needle_cli.rs).
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
