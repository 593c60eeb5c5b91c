//! `tq bench compare` against a stand-in for llama.cpp's `llama-bench`: a script that answers
//! the arguments it is given with `-o json` rows of known speeds. The rows this engine prints
//! must carry the ratios to exactly those figures, at the thread counts and depths asked, and
//! `--save` must keep them with the reference build's provenance. A real `llama-bench` is not
//! needed (nor present in CI); `docs/results.md` has a run against one.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use common::{present, tq};
use tq_models::fetch::KnownModel;

/// A `llama-bench` that prints a prefill row of 1000 tok/s when asked for a prompt and a
/// decode row of 500 tok/s, echoing the threads and depth it was given.
const FAKE_LLAMA_BENCH: &str = r#"#!/bin/sh
P=0; N=0; D=0; T=0
while [ $# -gt 0 ]; do
  case "$1" in
    -t) T=$2; shift;; -p) P=$2; shift;; -n) N=$2; shift;; -d) D=$2; shift;;
    -o) [ "$2" = json ] || exit 3; shift;;
  esac
  shift
done
printf '['
if [ "$P" != 0 ]; then
  printf '{"build_commit":"fake01","cpu_info":"test cpu","n_threads":%s,"n_prompt":%s,"n_gen":0,"n_depth":%s,"avg_ts":1000.0},' "$T" "$P" "$D"
fi
printf '{"build_commit":"fake01","cpu_info":"test cpu","n_threads":%s,"n_prompt":0,"n_gen":%s,"n_depth":%s,"avg_ts":500.0}]\n' "$T" "$N" "$D"
"#;

/// Equal up to serde_json's float parsing, which is not always correctly rounded (its
/// `float_roundtrip` feature is off): a last-bit difference, never a different ratio.
fn assert_close(got: f64, want: f64) {
    assert!((got - want).abs() <= 1e-12 * want.abs(), "{got} vs {want}");
}

fn script(name: &str, body: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tq-bench-compare-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, body).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

#[test]
fn ratios_are_against_the_reference_engine_at_the_same_threads_and_depth() {
    if present(KnownModel::SmolLm2).is_none() {
        return;
    }
    let fake = script("llama-bench", FAKE_LLAMA_BENCH);
    let saved = fake.with_file_name("saved.json");
    let args = [
        "bench",
        "compare",
        "--llama-bench",
        fake.to_str().unwrap(),
        "--threads",
        "1,2",
        "--depths",
        "0,64",
        "--alloc",
        "f16,tq3.5",
        "--rounds",
        "1",
        "--prompt-tokens",
        "32",
        "--decode-tokens",
        "2",
        "--json",
        "--save",
        saved.to_str().unwrap(),
    ];
    let (ok, stdout, stderr) = tq(&args);
    assert!(ok, "{args:?}: {stderr}");
    let rows: serde_json::Value = serde_json::from_str(&stdout).expect("a JSON array");
    let rows = rows.as_array().unwrap();
    // Per (threads, depth): the reference row, then one row per allocation.
    assert_eq!(rows.len(), 2 * 2 * 3, "{stdout}");
    for cell in rows.chunks(3) {
        let reference = &cell[0];
        assert_eq!(reference["engine"], "llama.cpp", "{reference}");
        assert_eq!(reference["decode_tokens_per_s"], 500.0);
        let depth = reference["depth"].as_u64().unwrap();
        let prefill = (depth == 0).then_some(1000.0);
        assert_eq!(reference["prefill_tokens_per_s"].as_f64(), prefill);
        for (row, alloc) in cell[1..].iter().zip(["f16", "tq3.5"]) {
            assert_eq!(row["engine"], "tq");
            assert_eq!(row["cache"], alloc);
            assert_eq!(row["threads"], reference["threads"]);
            assert_eq!(row["depth"], depth);
            assert_eq!(row["reference"], "measured");
            let decode = row["decode_tokens_per_s"].as_f64().unwrap();
            assert!(decode > 0.0, "{row}");
            assert_close(row["decode_ratio"].as_f64().unwrap(), decode / 500.0);
            match row["prefill_tokens_per_s"].as_f64() {
                Some(p) => {
                    assert_eq!(depth, 0, "{row}");
                    assert_close(row["prefill_ratio"].as_f64().unwrap(), p / 1000.0);
                }
                None => assert_ne!(depth, 0, "{row}"),
            }
        }
    }
    let threads: Vec<u64> = rows
        .iter()
        .map(|r| r["threads"].as_u64().unwrap())
        .collect();
    assert_eq!(&threads[..6], &[1; 6]);
    assert_eq!(&threads[6..], &[2; 6]);
    let saved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&saved).unwrap()).unwrap();
    assert_eq!(saved["llama_bench_build"], "fake01");
    assert_eq!(saved["cpu"], "test cpu");
    assert_eq!(saved["rows"].as_array().unwrap().len(), rows.len());
}

#[test]
fn a_failing_or_missing_reference_engine_is_an_error() {
    if present(KnownModel::SmolLm2).is_none() {
        return;
    }
    let failing = script("failing-bench", "#!/bin/sh\necho 'no model' >&2\nexit 1\n");
    let base = [
        "bench",
        "compare",
        "--threads",
        "1",
        "--depths",
        "0",
        "--alloc",
        "f16",
        "--rounds",
        "1",
        "--prompt-tokens",
        "16",
        "--decode-tokens",
        "1",
        "--llama-bench",
    ];
    let mut args = base.to_vec();
    args.push(failing.to_str().unwrap());
    let (ok, _, stderr) = tq(&args);
    assert!(!ok && stderr.contains("no model"), "{stderr}");
    let mut args = base.to_vec();
    args.push("/nonexistent/llama-bench");
    let (ok, _, stderr) = tq(&args);
    assert!(!ok && stderr.contains("no such file"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn without_a_reference_binary_the_stored_figures_stand_in() {
    if present(KnownModel::SmolLm2).is_none() {
        return;
    }
    let args = [
        "bench",
        "compare",
        "--threads",
        "1,2",
        "--depths",
        "0",
        "--alloc",
        "f16",
        "--rounds",
        "1",
        "--prompt-tokens",
        "512",
        "--decode-tokens",
        "1",
        "--json",
    ];
    let (ok, stdout, stderr) = tq(&args);
    assert!(ok, "{stderr}");
    let rows: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let rows = rows.as_array().unwrap();
    // No reference rows of its own; one thread has the stored figures, two threads none.
    assert_eq!(rows.len(), 2, "{stdout}");
    assert_eq!(rows[0]["reference"], "stored");
    assert!(rows[0]["prefill_ratio"].as_f64().unwrap() > 0.0);
    assert!(rows[1]["reference"].is_null() && rows[1]["decode_ratio"].is_null());
}
