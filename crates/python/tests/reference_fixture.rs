//! The reference outputs the Python tests compare the bindings with, bit for bit.
//!
//! `tests/data/reference.json` holds fixed inputs and what the Rust API — the library crates'
//! own per-vector calls, not this crate's batch loops — returns for them: codebooks, both
//! rotation kinds, a QJL sketch, the three codecs (encode, decode, inner products) and a
//! `KvCache` / `ModelCache` over shipped allocations (attention on the `reference` and
//! `fused-scalar` kernels, whose bits do not depend on the CPU). `tests/test_reference.py`
//! feeds the same inputs through `turboquant` and requires identical bits.
//!
//! This test rebuilds the document and requires it to equal the committed file, so a change of
//! the Rust API's output shows up here first. After an intended change, regenerate it with
//!
//! ```sh
//! TQ_WRITE_FIXTURE=1 cargo test --release -p tq-python --test reference_fixture
//! ```
//!
//! Arrays are stored as `{"dtype", "shape", "b64"}`: the little-endian bytes in base64, read in
//! Python with `numpy.frombuffer(base64.b64decode(b64), dtype).reshape(shape)`.

use std::path::PathBuf;

use half::f16;
use serde_json::{Value, json};
use tq_cache::allocation::Allocation;
use tq_cache::attention::simd::Isa;
use tq_cache::attention::{AttentionKernel, AttentionShape, attend};
use tq_cache::codec::{CodecScratch, DebiasedMse, MseSpec, ProdSpec, TqMse, TqProd};
use tq_cache::kv_cache::{KvCache, KvKind, KvLayout};
use tq_cache::states::{ModelCache, StateKind, StateSpec};
use tq_cache::token_store::Growth;
use tq_lloyd_max::{CoordinateDistribution, LloydMaxCodebook};
use tq_qjl::{QjlSpec, SketchKind};
use tq_rotation::{Rotation, RotationKind};
use turboquant::batch::{self, ProdInputs, ProdOutputs};

const PROVENANCE: &str = "Written by crates/python/tests/reference_fixture.rs \
(TQ_WRITE_FIXTURE=1 cargo test --release -p tq-python --test reference_fixture) from the Rust \
API's per-vector calls on the inputs stored here; that test checks on every run that the file \
still equals what the Rust API returns, and crates/python/tests/test_reference.py checks that \
the Python bindings return the same bits.";

fn fixture_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/reference.json")
}

// ---------------------------------------------------------------------------------------------
// Deterministic inputs.

/// splitmix64: a fixed stream, so the inputs never depend on a library's generator.
struct Stream(u64);

impl Stream {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1).
    fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    /// Standard normal (Box–Muller), times `scale`, with a few heavy channels like real keys.
    fn gaussian_rows(&mut self, rows: usize, dim: usize, scale: f64) -> Vec<f32> {
        (0..rows * dim)
            .map(|i| {
                let (u, v) = (self.uniform(), self.uniform());
                let z = (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos();
                let channel = i % dim;
                let boost = if channel % 17 == 3 { 6.0 } else { 1.0 };
                (z * scale * boost) as f32
            })
            .collect()
    }
}

// ---------------------------------------------------------------------------------------------
// Array encoding.

fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for k in 0..4 {
            if k <= chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * k)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn array(dtype: &str, shape: &[usize], bytes: Vec<u8>) -> Value {
    assert_eq!(
        shape.iter().product::<usize>() * dtype_size(dtype),
        bytes.len(),
        "shape and data disagree"
    );
    json!({ "dtype": dtype, "shape": shape, "b64": base64(&bytes) })
}

fn dtype_size(dtype: &str) -> usize {
    match dtype {
        "float64" => 8,
        "float32" | "uint32" => 4,
        "float16" => 2,
        "uint8" => 1,
        other => panic!("no size for {other}"),
    }
}

fn f32s(shape: &[usize], data: &[f32]) -> Value {
    array(
        "float32",
        shape,
        data.iter().flat_map(|v| v.to_le_bytes()).collect(),
    )
}

fn f16s(shape: &[usize], data: &[f16]) -> Value {
    array(
        "float16",
        shape,
        data.iter()
            .flat_map(|v| v.to_bits().to_le_bytes())
            .collect(),
    )
}

fn u32s(shape: &[usize], data: &[u32]) -> Value {
    array(
        "uint32",
        shape,
        data.iter().flat_map(|v| v.to_le_bytes()).collect(),
    )
}

fn u8s(shape: &[usize], data: &[u8]) -> Value {
    array("uint8", shape, data.to_vec())
}

// ---------------------------------------------------------------------------------------------
// The reference outputs, from the Rust API.

const N: usize = 8;
const D: usize = 64;
const M: usize = 3;

fn codebook_case(law: CoordinateDistribution, law_name: &str, bits: u8, x: &[f32]) -> Value {
    let book = LloydMaxCodebook::new(law, bits).unwrap();
    let codes: Vec<u8> = x.iter().map(|&v| book.quantize(v)).collect();
    let levels: Vec<f32> = codes.iter().map(|&c| book.dequantize(c)).collect();
    json!({
        "dim": law.dim(), "bits": bits, "law": law_name,
        "centroids_f32": f32s(&[book.levels()], book.centroids_f32()),
        "thresholds_f32": f32s(&[book.levels() - 1], book.thresholds_f32()),
        "unit_vector_distortion": book.unit_vector_distortion(),
        "codes": u8s(&[x.len()], &codes),
        "dequantized": f32s(&[x.len()], &levels),
    })
}

fn rotation_case(kind: RotationKind, kind_name: &str, dim: usize, seed: u64, x: &[f32]) -> Value {
    let rotation = Rotation::new(kind, dim, seed).unwrap();
    let n = x.len() / dim;
    let (mut applied, mut inverse) = (vec![0.0f32; x.len()], vec![0.0f32; x.len()]);
    for ((row, a), b) in x
        .chunks_exact(dim)
        .zip(applied.chunks_exact_mut(dim))
        .zip(inverse.chunks_exact_mut(dim))
    {
        rotation.apply(row, a).unwrap();
        rotation.apply_inverse(row, b).unwrap();
    }
    json!({
        "kind": kind_name, "dim": dim, "seed": seed,
        "x": f32s(&[n, dim], x),
        "apply": f32s(&[n, dim], &applied),
        "apply_inverse": f32s(&[n, dim], &inverse),
    })
}

fn qjl_case(x: &[f32], q: &[f32]) -> Value {
    let sketch = QjlSpec::new(SketchKind::Haar, D, 11).build().unwrap();
    let w = sketch.words();
    let mut bits = vec![0u32; N * w];
    let mut gammas = vec![0.0f32; N];
    let mut scratch = vec![0.0f32; D];
    for i in 0..N {
        gammas[i] = sketch
            .encode(
                &x[i * D..(i + 1) * D],
                &mut scratch,
                &mut bits[i * w..(i + 1) * w],
            )
            .unwrap();
    }
    // Row-wise estimates: query i % M against stored vector i.
    let queries: Vec<f32> = (0..N)
        .flat_map(|i| q[(i % M) * D..(i % M + 1) * D].to_vec())
        .collect();
    let mut projected = vec![0.0f32; N * D];
    let mut estimates = vec![0.0f32; N];
    let mut reconstructed = vec![0.0f32; N * D];
    for i in 0..N {
        sketch
            .project(
                &queries[i * D..(i + 1) * D],
                &mut projected[i * D..(i + 1) * D],
            )
            .unwrap();
        estimates[i] = sketch.estimate_inner_product(
            &projected[i * D..(i + 1) * D],
            &bits[i * w..(i + 1) * w],
            gammas[i],
        );
        sketch
            .reconstruct(
                &bits[i * w..(i + 1) * w],
                gammas[i],
                &mut scratch,
                &mut reconstructed[i * D..(i + 1) * D],
            )
            .unwrap();
    }
    json!({
        "kind": "haar", "dim": D, "seed": 11,
        "queries": f32s(&[N, D], &queries),
        "bits": u32s(&[N, w], &bits),
        "gamma": f32s(&[N], &gammas),
        "projected": f32s(&[N, D], &projected),
        "estimates": f32s(&[N], &estimates),
        "reconstructed": f32s(&[N, D], &reconstructed),
    })
}

fn mse_case(spec: MseSpec, rotation: &str, x: &[f32], q: &[f32], debias: bool) -> Value {
    let codec = TqMse::new(spec).unwrap();
    let w = codec.words_per_vector();
    let codes: Vec<_> = x
        .chunks_exact(D)
        .map(|row| codec.encode(row).unwrap())
        .collect();
    let words: Vec<u32> = codes.iter().flat_map(|c| c.words.clone()).collect();
    let norms: Vec<f16> = codes.iter().map(|c| c.norm).collect();
    let decoded: Vec<f32> = codes
        .iter()
        .flat_map(|c| codec.decode(c).unwrap())
        .collect();
    let debiased = DebiasedMse::new(spec).ok().filter(|_| debias);
    let mut scores = Vec::with_capacity(M * N);
    let mut scratch = CodecScratch::new(D);
    for query in q.chunks_exact(D) {
        let mut rotated = vec![0.0f32; D];
        codec.rotate_query(query, &mut rotated).unwrap();
        for code in &codes {
            scores.push(match &debiased {
                Some(estimator) => estimator
                    .inner_product(&rotated, code, &mut scratch)
                    .unwrap(),
                None => codec.inner_product(&rotated, code, &mut scratch).unwrap(),
            });
        }
    }
    json!({
        "dim": spec.dim, "bits": spec.bits, "seed": spec.seed, "rotation": rotation,
        "norm_correction": spec.norm_correction, "debiased": debias,
        "words": u32s(&[N, w], &words),
        "norms": f16s(&[N], &norms),
        "decoded": f32s(&[N, D], &decoded),
        "inner_products": f32s(&[M, N], &scores),
    })
}

fn prod_case(spec: ProdSpec, sketch: &str, x: &[f32], q: &[f32]) -> Value {
    let codec = TqProd::new(spec).unwrap();
    let (w, s) = (
        codec.mse().words_per_vector(),
        codec.sign_words_per_vector(),
    );
    let codes: Vec<_> = x
        .chunks_exact(D)
        .map(|row| codec.encode(row).unwrap())
        .collect();
    let words: Vec<u32> = codes.iter().flat_map(|c| c.mse.words.clone()).collect();
    let norms: Vec<f16> = codes.iter().map(|c| c.mse.norm).collect();
    let signs: Vec<u32> = codes.iter().flat_map(|c| c.signs.clone()).collect();
    let gammas: Vec<f16> = codes.iter().map(|c| c.gamma).collect();
    let decoded: Vec<f32> = codes
        .iter()
        .flat_map(|c| codec.decode(c).unwrap())
        .collect();
    let mut scores = Vec::with_capacity(M * N);
    for query in q.chunks_exact(D) {
        let prepared = codec.prepare_query(query).unwrap();
        for code in &codes {
            scores.push(codec.inner_product(&prepared, code).unwrap());
        }
    }
    json!({
        "dim": spec.dim, "bits": spec.bits, "seed": spec.seed, "sketch": sketch,
        "shrinkage": spec.sketch.shrinkage,
        "words": u32s(&[N, w], &words),
        "norms": f16s(&[N], &norms),
        "signs": u32s(&[N, s], &signs),
        "gammas": f16s(&[N], &gammas),
        "decoded": f32s(&[N, D], &decoded),
        "inner_products": f32s(&[M, N], &scores),
    })
}

/// The layout the Python `KvCache` builds by default (growing, pages from 256 tokens).
fn growing(kv_heads: usize, head_dim: usize) -> KvLayout {
    KvLayout {
        kv_heads,
        head_dim,
        kind: KvKind::Growing {
            growth: Growth::Doubling { initial: 256 },
        },
        max_rewind: 0,
        rope_pairs: tq_cache::basis::RopePairs::Adjacent,
        rope_base: Default::default(),
    }
}

fn kv_cache_case(stream: &mut Stream) -> Value {
    let (heads, q_heads, dim, tokens, queries) = (2, 4, 64, 12, 3);
    let allocation = Allocation::preset("k5v4").unwrap();
    let (layer, num_layers) = (1, 4);
    let mut cache =
        KvCache::with_allocation(growing(heads, dim), &allocation, layer, num_layers).unwrap();
    let keys = stream.gaussian_rows(tokens * heads, dim, 1.0);
    let values = stream.gaussian_rows(tokens * heads, dim, 0.5);
    let positions: Vec<u32> = (0..tokens as u32).collect();
    cache.append(&keys, &values, &positions).unwrap();
    let q = stream.gaussian_rows(queries * q_heads, dim, 1.0);
    let query_positions = [4u32, 9, 11];
    let shape = AttentionShape {
        q_heads,
        scale: 0.125,
    };
    let mut outputs = serde_json::Map::new();
    for (name, kernel) in [
        ("reference", AttentionKernel::Reference),
        ("fused-scalar", AttentionKernel::FusedOn(Isa::Scalar)),
    ] {
        let mut out = vec![0.0f32; q.len()];
        attend(&cache, &q, &query_positions, shape, kernel, &mut out).unwrap();
        outputs.insert(name.into(), f32s(&[queries, q_heads, dim], &out));
    }
    json!({
        "allocation": "k5v4", "kv_heads": heads, "head_dim": dim, "layer": layer,
        "num_layers": num_layers, "scale": 0.125,
        "keys": f32s(&[tokens, heads, dim], &keys),
        "values": f32s(&[tokens, heads, dim], &values),
        "positions": u32s(&[tokens], &positions),
        "queries": f32s(&[queries, q_heads, dim], &q),
        "query_positions": u32s(&[queries], &query_positions),
        "bytes_per_token": cache.bytes_per_token(),
        "outputs": outputs,
    })
}

/// Two layers of the two-tier `tq3.5` allocation (outlier channels chosen from the first
/// chunk), fed in two chunks through `forward_layer`.
fn model_cache_case(stream: &mut Stream) -> Value {
    let (layers, heads, q_heads, dim) = (2, 1, 2, 64);
    let chunks = [5usize, 3];
    let allocation = Allocation::preset("tq3.5").unwrap();
    let specs: Vec<StateSpec> = (0..layers)
        .map(|layer| StateSpec {
            name: format!("blk.{layer}.kv"),
            kind: StateKind::Kv {
                layer,
                layout: growing(heads, dim),
            },
        })
        .collect();
    let mut cache = ModelCache::with_allocation(specs, &allocation).unwrap();
    let shape = AttentionShape {
        q_heads,
        scale: 0.125,
    };
    let kernel = AttentionKernel::FusedOn(Isa::Scalar);
    let mut steps = Vec::new();
    let mut positions: Vec<u32> = Vec::new();
    for &n in &chunks {
        let start = positions.len() as u32;
        positions.extend(start..start + n as u32);
        for layer in 0..layers {
            let q = stream.gaussian_rows(n * q_heads, dim, 1.0);
            let k = stream.gaussian_rows(n * heads, dim, 1.0);
            let v = stream.gaussian_rows(n * heads, dim, 1.0);
            let mut out = vec![0.0f32; q.len()];
            cache
                .forward_layer(
                    layer,
                    &q,
                    Some((&k, &v)),
                    &positions,
                    shape,
                    kernel,
                    &mut out,
                )
                .unwrap();
            steps.push(json!({
                "layer": layer,
                "queries": f32s(&[n, q_heads, dim], &q),
                "keys": f32s(&[n, heads, dim], &k),
                "values": f32s(&[n, heads, dim], &v),
                "positions": u32s(&[n], &positions[positions.len() - n..]),
                "output": f32s(&[n, q_heads, dim], &out),
            }));
        }
    }
    json!({
        "allocation": "tq3.5", "num_layers": layers, "kv_heads": heads, "head_dim": dim,
        "scale": 0.125, "kernel": "fused-scalar",
        "bytes_per_token": cache.memory().iter().map(|m| m.bytes_per_token).sum::<usize>(),
        "steps": steps,
    })
}

fn allocation_case() -> Value {
    use tq_cache::allocation::{ModelShape, StreamKind};
    let shape = ModelShape {
        num_layers: 30,
        num_kv_heads: 3,
        head_dim: 64,
    };
    let names: Vec<&str> = Allocation::preset_names().collect();
    let bits: serde_json::Map<String, Value> = names
        .iter()
        .map(|&name| {
            let allocation = Allocation::preset(name).unwrap();
            let key = allocation.bits_per_value(&shape, StreamKind::Key).unwrap();
            let value = allocation
                .bits_per_value(&shape, StreamKind::Value)
                .unwrap();
            (name.to_string(), json!({ "key": key, "value": value }))
        })
        .collect();
    json!({ "num_layers": 30, "num_kv_heads": 3, "head_dim": 64, "bits_per_value": bits })
}

fn document() -> Value {
    let mut stream = Stream(0x7155_2D50_5954_484F);
    let x = stream.gaussian_rows(N, D, 0.8);
    let q = stream.gaussian_rows(M, D, 1.0);
    let x48 = stream.gaussian_rows(N, 48, 1.0);
    let mse = |bits, seed, rotation, norm_correction| MseSpec {
        dim: D,
        bits,
        rotation,
        seed,
        norm_correction,
    };
    let mut prod_paper = ProdSpec::paper(D, 3, 5);
    prod_paper.rotation = RotationKind::Haar;
    json!({
        "provenance": PROVENANCE,
        "inputs": { "x": f32s(&[N, D], &x), "queries": f32s(&[M, D], &q) },
        "codebooks": [
            codebook_case(CoordinateDistribution::Beta { dim: D }, "beta", 3, &x),
            codebook_case(CoordinateDistribution::Gaussian { dim: D }, "gaussian", 2, &x),
        ],
        "rotations": [
            rotation_case(RotationKind::Haar, "haar", D, 5, &x),
            rotation_case(RotationKind::Hadamard, "hadamard", D, 5, &x),
            rotation_case(RotationKind::Haar, "haar", 48, 9, &x48),
            rotation_case(RotationKind::Hadamard, "hadamard", 48, 9, &x48),
        ],
        "qjl": qjl_case(&x, &q),
        "mse": [
            mse_case(mse(4, 42, RotationKind::Hadamard, false), "hadamard", &x, &q, false),
            mse_case(mse(3, 8, RotationKind::Haar, true), "haar", &x, &q, false),
            mse_case(mse(3, 42, RotationKind::Hadamard, false), "hadamard", &x, &q, true),
        ],
        "prod": [
            prod_case(ProdSpec::orthogonal(D, 5, 7), "haar", &x, &q),
            prod_case(prod_paper, "gaussian", &x, &q),
            prod_case(ProdSpec::orthogonal(D, 4, 3).shrinkage(0.7), "haar", &x, &q),
        ],
        "kv_cache": kv_cache_case(&mut stream),
        "model_cache": model_cache_case(&mut stream),
        "allocations": allocation_case(),
    })
}

#[test]
fn the_committed_fixture_is_what_the_rust_api_returns() {
    let fresh = document();
    let path = fixture_path();
    if std::env::var_os("TQ_WRITE_FIXTURE").is_some_and(|v| v == "1") {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let text = serde_json::to_string_pretty(&fresh).unwrap() + "\n";
        std::fs::write(&path, text).unwrap();
        eprintln!("wrote {}", path.display());
        return;
    }
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "cannot read {}: {e}; write it with TQ_WRITE_FIXTURE=1 cargo test --release -p tq-python --test reference_fixture",
            path.display()
        )
    });
    let committed: Value = serde_json::from_str(&text).unwrap();
    let mut differences = Vec::new();
    differing_paths(&committed, &fresh, String::new(), &mut differences);
    assert!(
        differences.is_empty(),
        "{} differs from what the Rust API returns now at {differences:?}. If the change is \
         intended, regenerate it with TQ_WRITE_FIXTURE=1 cargo test --release -p tq-python \
         --test reference_fixture (and rerun the Python tests)",
        path.display()
    );
}

/// The JSON paths where two documents differ (the innermost objects or arrays that do).
fn differing_paths(a: &Value, b: &Value, path: String, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) if x.len() == y.len() => {
            for (key, value) in x {
                match y.get(key) {
                    Some(other) => differing_paths(value, other, format!("{path}.{key}"), out),
                    None => out.push(format!("{path}.{key}")),
                }
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (value, other)) in x.iter().zip(y).enumerate() {
                differing_paths(value, other, format!("{path}[{i}]"), out);
            }
        }
        _ if a != b => out.push(if path.is_empty() { ".".into() } else { path }),
        _ => {}
    }
}

#[test]
fn batch_loops_equal_the_per_vector_api() {
    let mut stream = Stream(3);
    // 200 rows: several chunks, the last one partial.
    let n = 200;
    let x = stream.gaussian_rows(n, D, 1.0);
    let q = stream.gaussian_rows(M, D, 1.0);

    let codec = TqMse::new(MseSpec::new(D, 4, 1)).unwrap();
    let w = codec.words_per_vector();
    let (mut words, mut norms) = (vec![0u32; n * w], vec![f16::ZERO; n]);
    batch::mse_encode(&codec, &x, &mut words, &mut norms).unwrap();
    let (mut seq_words, mut seq_norms) = (vec![0u32; n * w], vec![f16::ZERO; n]);
    batch::mse_encode_sequential(&codec, &x, &mut seq_words, &mut seq_norms).unwrap();
    assert_eq!((&words, &norms), (&seq_words, &seq_norms));
    let mut decoded = vec![0.0f32; n * D];
    batch::mse_decode(&codec, &words, &norms, &mut decoded).unwrap();
    for i in 0..n {
        let code = codec.encode(&x[i * D..(i + 1) * D]).unwrap();
        assert_eq!(code.words, words[i * w..(i + 1) * w]);
        assert_eq!(code.norm, norms[i]);
        assert_eq!(codec.decode(&code).unwrap(), decoded[i * D..(i + 1) * D]);
    }

    let prod = TqProd::new(ProdSpec::orthogonal(D, 5, 2)).unwrap();
    let (w, s) = (prod.mse().words_per_vector(), prod.sign_words_per_vector());
    let (mut pw, mut pn, mut ps, mut pg) = (
        vec![0u32; n * w],
        vec![f16::ZERO; n],
        vec![0u32; n * s],
        vec![f16::ZERO; n],
    );
    batch::prod_encode(
        &prod,
        &x,
        ProdOutputs {
            words: &mut pw,
            norms: &mut pn,
            signs: &mut ps,
            gammas: &mut pg,
        },
    )
    .unwrap();
    let codes = ProdInputs {
        words: &pw,
        norms: &pn,
        signs: &ps,
        gammas: &pg,
    };
    let mut scores = vec![0.0f32; M * n];
    batch::prod_inner_products(&prod, &q, codes, &mut scores).unwrap();
    for i in 0..n {
        let code = prod.encode(&x[i * D..(i + 1) * D]).unwrap();
        assert_eq!(code.mse.words, pw[i * w..(i + 1) * w]);
        assert_eq!(code.signs, ps[i * s..(i + 1) * s]);
        assert_eq!((code.mse.norm, code.gamma), (pn[i], pg[i]));
        for (j, query) in q.chunks_exact(D).enumerate() {
            let prepared = prod.prepare_query(query).unwrap();
            assert_eq!(
                prod.inner_product(&prepared, &code).unwrap(),
                scores[j * n + i]
            );
        }
    }
}

#[test]
fn batch_errors_name_the_first_bad_row() {
    let codec = TqMse::new(MseSpec::new(D, 4, 1)).unwrap();
    let n = 300;
    let mut x = Stream(4).gaussian_rows(n, D, 1.0);
    x[150 * D + 3] = f32::NAN;
    x[290 * D] = f32::INFINITY;
    let (mut words, mut norms) = (vec![0u32; n * codec.words_per_vector()], vec![f16::ZERO; n]);
    let error = batch::mse_encode(&codec, &x, &mut words, &mut norms).unwrap_err();
    assert!(error.0.starts_with("row 150: "), "{error}");
    let error = batch::mse_encode(&codec, &x[..10 * D - 1], &mut words, &mut norms).unwrap_err();
    assert!(error.0.contains("not a multiple"), "{error}");
}
