//! GPU decode attention against the CPU reference (`tq_cache::attention::reference_attention`:
//! every visible key and value decoded to f32, softmax and sums in f64), and GPU scores
//! against `scale·⟨q, decode(k)⟩` in f64.
//!
//! Both sides compute the same quantity from the same stored records, so they differ by f32
//! rounding only: scores by ~√d·ε·scale·‖q‖‖k‖ (rotated-domain dot products, a d×d query
//! rotation), outputs by ~(√d + √T)·ε·max|v|. The tolerances — 1e-4 relative to the row's
//! largest |score|, 1e-4 relative to the largest |output| — hold with a wide margin at
//! d ≤ 256 and T ≤ a few thousand, and any wrong code, sign, scale, rotation, mask or GQA
//! mapping moves results by > 1e-2.

mod common;

use common::{CODECS, codec, context, fill, growing, sliding, vectors};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};
use tq_attention_wgpu::{GpuError, GpuKvCache};
use tq_cache::CodecSpec;
use tq_cache::allocation::Allocation;
use tq_cache::attention::{AttentionKernel, AttentionShape, reference_attention};
use tq_cache::basis::RopePairs;
use tq_cache::codec::CodecScratch;
use tq_cache::kv_cache::{KvCache, KvLayout};
use tq_cache::rope_center::RopeBase;

fn config(cases: u32) -> Config {
    Config {
        cases,
        rng_seed: RngSeed::Fixed(0x6B0_A77E),
        failure_persistence: None,
        ..Config::default()
    }
}

/// `scale·⟨q, decode(k)⟩·correction` for every visible token, as the reference scores.
fn cpu_scores(
    cache: &KvCache,
    queries: &[f32],
    positions: &[u32],
    shape: AttentionShape,
) -> Vec<Vec<(usize, f64)>> {
    let d = cache.layout().head_dim;
    let group = shape.q_heads / cache.layout().kv_heads;
    let mut scratch = CodecScratch::new(d);
    let mut k = vec![0.0f32; d];
    let mut rows = Vec::new();
    for (i, &p) in positions.iter().enumerate() {
        for h in 0..shape.q_heads {
            let q = &queries[(i * shape.q_heads + h) * d..][..d];
            let keys = cache.keys(h / group);
            let mut row = Vec::new();
            for t in cache.visible(p) {
                keys.decode(t, &mut scratch, &mut k).unwrap();
                // A RoPE center is added back per block (a fixed key mean is not: it shifts
                // every score of a row alike, and the kernels leave it out).
                if keys.center().turns_with_position() {
                    keys.add_center(t, &mut k);
                }
                let correction = f64::from(keys.codec().score_correction());
                let dot: f64 = q
                    .iter()
                    .zip(&k)
                    .map(|(a, b)| f64::from(*a) * f64::from(*b))
                    .sum();
                row.push((t, f64::from(shape.scale) * dot * correction));
            }
            rows.push(row);
        }
    }
    rows
}

/// Compares GPU scores and outputs with the CPU reference for queries at `positions`.
fn compare(gpu: &mut GpuKvCache, cpu: &KvCache, q_heads: usize, positions: &[u32], seed: u64) {
    let d = cpu.layout().head_dim;
    let queries = vectors(positions.len() * q_heads, d, seed);
    let shape = AttentionShape {
        q_heads,
        scale: 1.0 / (d as f32).sqrt(),
    };
    let mut expected = vec![0.0f32; queries.len()];
    reference_attention(cpu, &queries, positions, shape, &mut expected).unwrap();
    let mut got = vec![0.0f32; queries.len()];
    gpu.attend(&queries, positions, shape, &mut got).unwrap();
    let scale = expected
        .iter()
        .fold(0.0f32, |m, v| m.max(v.abs()))
        .max(1e-3);
    for (i, (a, b)) in got.iter().zip(&expected).enumerate() {
        assert!(
            (a - b).abs() <= 1e-4 * scale,
            "output {i}: gpu {a} vs reference {b} (scale {scale})"
        );
    }

    let scores = gpu.scores(&queries, positions, shape).unwrap();
    let slots = scores.len() / (positions.len() * q_heads);
    for (r, row) in cpu_scores(cpu, &queries, positions, shape)
        .iter()
        .enumerate()
    {
        let gpu_row = &scores[r * slots..(r + 1) * slots];
        let visible: Vec<usize> = row.iter().map(|&(t, _)| gpu.slot_of(t).unwrap()).collect();
        // Exactly the visible slots carry a score.
        let finite = gpu_row.iter().filter(|s| s.is_finite()).count();
        assert_eq!(finite, row.len(), "row {r}: visible slots");
        let top = row.iter().fold(1e-3f64, |m, &(_, s)| m.max(s.abs()));
        for (&(t, s), &slot) in row.iter().zip(&visible) {
            let g = f64::from(gpu_row[slot]);
            assert!(
                (g - s).abs() <= 1e-4 * top,
                "row {r} token {t}: gpu score {g} vs reference {s} (top {top})"
            );
        }
    }
}

proptest! {
    #![proptest_config(config(10))]

    /// Decode (and a short prefill chunk) on growing caches: every codec family for keys and
    /// values, b = 2..5, GQA 1–8, token counts that are not multiples of the block or page.
    #[test]
    fn gpu_attention_matches_reference(
        dim in prop_oneof![Just(64usize), Just(128), Just(256)],
        kv_heads in 1usize..=2,
        ratio in 1usize..=8,
        tokens in 1usize..400,
        query_len in 1usize..=2,
        key_codec in 0usize..CODECS,
        value_codec in 0usize..CODECS,
        bits in 2u8..=5,
        seed in any::<u64>(),
    ) {
        let Some(ctx) = context() else { return Ok(()) };
        let mut cpu = KvCache::uniform(
            growing(kv_heads, dim),
            codec(key_codec, dim, bits, seed),
            codec(value_codec, dim, bits, seed ^ 1),
        ).unwrap();
        fill(&mut cpu, 0, tokens, seed);
        let mut gpu = GpuKvCache::from_cache(&ctx, &cpu).unwrap();
        let first = tokens.saturating_sub(query_len) as u32;
        let positions: Vec<u32> = (first..tokens as u32).collect();
        compare(&mut gpu, &cpu, kv_heads * ratio, &positions, seed ^ 7);
    }
}

/// Token `t`'s compressed record (`Stream::token` would name a sink's full-precision copy) —
/// for a token still in an 8-bit window, which has no codes yet, the record the stream will
/// write when it leaves: its window copy decoded, then encoded (`Stream::push`).
fn body_record(stream: &tq_cache::stream::Stream, t: usize) -> Vec<u32> {
    if t < stream.body_tokens(stream.len()) {
        // A copy: a fast-scan body (the recommended presets') gathers it from its block.
        return stream
            .body()
            .record_copy(stream.body_slot(t))
            .unwrap()
            .0
            .into_owned();
    }
    let (window, copy, step) = stream.recent_copy(t).unwrap();
    let d = stream.layout().head_dim();
    let mut scratch = CodecScratch::new(d);
    let mut decoded = vec![0.0f32; d];
    window
        .decode_into(copy, step, &mut scratch, &mut decoded)
        .unwrap();
    let codec = stream.codec();
    let mut record = vec![0u32; codec.record_words()];
    let mut scales = vec![half::f16::ZERO; codec.scales_per_token()];
    codec
        .encode_into(&decoded, &mut scratch, &mut record, &mut scales)
        .unwrap();
    record
}

fn preset_cache(name: &str, layout: KvLayout) -> KvCache {
    KvCache::with_allocation(layout, &Allocation::preset(name).unwrap(), 3, 8).unwrap()
}

/// The presets the GPU must run, with per-head seeds (each KV head its own Π and S).
#[test]
fn presets_on_gpu_match_reference() {
    let Some(ctx) = context() else { return };
    for name in [
        "mse-k4v4",
        "k5v4",
        "f16",
        "tq3.5",
        "tq2.5",
        "mse-k4v4-c",
        "rec4.25-global",
        "k6v5-global",
        "k5v3-c",
        // The fast-scan order on both streams: bases of 2- to 7-bit groups as bit planes.
        "rec4.25",
        "rec2.5",
    ] {
        for dim in [64usize, 128] {
            let mut cpu = preset_cache(name, growing(2, dim));
            fill(&mut cpu, 0, 333, 5);
            let mut gpu = GpuKvCache::from_cache(&ctx, &cpu).unwrap();
            compare(&mut gpu, &cpu, 8, &[332], 11);
        }
    }
}

/// Decode steps: the CPU cache appends (CPU encode) while the GPU copy either encodes the same
/// vectors itself or receives the CPU's records; the GPU pages then equal the CPU records and
/// attention matches after every step.
#[test]
fn decode_steps_stay_in_step_with_the_cpu_cache() {
    let Some(ctx) = context() else { return };
    // tq3.5 "encodes" on the host (two tiers): its records must equal the CPU's too.
    for (name, gpu_encodes) in [
        ("k5v4", true),
        ("k5v4", false),
        ("mse-k4v4", true),
        ("tq3.5", true),
    ] {
        let mut cpu = preset_cache(name, growing(2, 64));
        fill(&mut cpu, 0, 250, 21);
        let mut gpu = GpuKvCache::from_cache(&ctx, &cpu).unwrap();
        for step in 0..8u32 {
            let p = 250 + step;
            let (k, v, pos) = fill(&mut cpu, p, 1, 100 + u64::from(step));
            if gpu_encodes {
                gpu.encode_and_append(&k, &v, &pos).unwrap();
            } else {
                gpu.sync_from(&cpu).unwrap();
            }
            assert_eq!(gpu.len(), cpu.len());
            if step % 3 == 0 {
                compare(&mut gpu, &cpu, 4, &[p], u64::from(step));
            }
        }
        let down = gpu.download().unwrap();
        let (mut kr, mut ks, mut vr, mut vs) = (vec![], vec![], vec![], vec![]);
        for t in 0..cpu.len() {
            for h in 0..2 {
                let (_, r, s) = cpu.keys(h).token(t).unwrap();
                kr.extend_from_slice(&r);
                ks.extend_from_slice(s);
                let (_, r, s) = cpu.values(h).token(t).unwrap();
                vr.extend_from_slice(&r);
                vs.extend_from_slice(s);
            }
        }
        let expected_positions: Vec<u32> =
            (0..cpu.len()).map(|t| cpu.position(t).unwrap()).collect();
        assert_eq!(down.positions, expected_positions, "{name}");
        // GPU-encoded records are bit-identical to the CPU's on IEEE hardware (see encode.rs
        // for the tolerance); here lavapipe and real GPUs alike are held to equality.
        assert_eq!(down.key_records, kr, "{name}");
        assert_eq!(down.key_scales, ks, "{name}");
        assert_eq!(down.value_records, vr, "{name}");
        assert_eq!(down.value_scales, vs, "{name}");
    }
}

/// A two-tier or centered GPU cache built empty chooses its outlier channels and means from
/// its first batch, per head, exactly as the CPU cache does (same records; value means added
/// back), and chooses again after a rewind to empty; attention matches the reference after each.
#[test]
fn host_encoded_caches_calibrate_like_the_cpu_cache() {
    let Some(ctx) = context() else { return };
    // A centered two-tier allocation: the mean first, the channels from the centered batch.
    let centered_tiers = Allocation::from_toml_str(
        "name = \"c-tiers\"\nkey = { codec = \"mse\", bits = 3, center = \"first-chunk\" }\n\
         value = { codec = \"mse\", bits = 2, center = \"first-chunk\" }\n\
         [outliers]\nfraction = 0.25\nkey = { bits = 4 }\nvalue = { bits = 3 }\n",
    )
    .unwrap();
    // Attention sinks on TQ_prod keys: their copies are scored with `scale·q`, which the
    // prepared row holds after the query and its sketch.
    let prod_sinks = Allocation::from_toml_str(
        "name = \"prod-sinks\"\nsink_tokens = 3\nkey = { codec = \"prod\", bits = 5 }\n\
         value = { codec = \"mse\", bits = 4 }\n",
    )
    .unwrap();
    let cases = [
        (
            preset_cache("rec3.25-global", growing(2, 64)),
            "rec3.25-global",
        ),
        (
            KvCache::with_allocation(growing(2, 64), &prod_sinks, 3, 8).unwrap(),
            "prod keys with sinks",
        ),
        (preset_cache("tq3.5", growing(2, 64)), "tq3.5"),
        (preset_cache("tq2.5", sliding(2, 128, 60, 3)), "tq2.5"),
        (preset_cache("k5v3-c", growing(2, 64)), "k5v3-c"),
        (
            KvCache::with_allocation(growing(2, 64), &centered_tiers, 3, 8).unwrap(),
            "centered two tiers",
        ),
    ];
    for (mut cpu, name) in cases {
        let mut gpu = GpuKvCache::new(&ctx, &cpu).unwrap();
        let mut follower = GpuKvCache::new(&ctx, &cpu).unwrap();
        for round in 0..2u64 {
            let (k, v, pos) = fill(&mut cpu, 0, 50, 31 + round);
            gpu.encode_and_append(&k, &v, &pos).unwrap();
            for step in 0..3u32 {
                let (k, v, pos) = fill(&mut cpu, 50 + step, 1, 40 + u64::from(step));
                gpu.encode_and_append(&k, &v, &pos).unwrap();
            }
            follower.sync_from(&cpu).unwrap();
            compare(&mut follower, &cpu, 4, &[52], round);
            let down = gpu.download().unwrap();
            let (mut kr, mut vr) = (vec![], vec![]);
            for t in cpu.first_stored()..cpu.len() {
                for h in 0..2 {
                    kr.extend_from_slice(&body_record(cpu.keys(h), t));
                    vr.extend_from_slice(&body_record(cpu.values(h), t));
                }
            }
            assert_eq!(down.key_records, kr, "{name} round {round}");
            assert_eq!(down.value_records, vr, "{name} round {round}");
            compare(&mut gpu, &cpu, 4, &[52], round);
            cpu.truncate(0).unwrap();
            gpu.truncate(0).unwrap();
            follower.truncate(0).unwrap();
        }
    }
}

/// `KvCache::forward` (reference kernel) on `cpu` and `GpuKvCache::forward` on `gpu` with the
/// same `n` new tokens at `start..` (two KV heads of d = 64, four query heads): the outputs
/// agree within 1e-4 of the largest.
fn forward_both(cpu: &mut KvCache, gpu: &mut GpuKvCache, start: u32, n: usize, seed: u64) {
    forward_both_with_keys(cpu, gpu, start, &vectors(n, 2 * 64, seed), seed, "");
}

/// [`forward_both`] with the new tokens' keys given (`[n, 2, 64]`); `what` names the case in a
/// failure.
fn forward_both_with_keys(
    cpu: &mut KvCache,
    gpu: &mut GpuKvCache,
    start: u32,
    keys: &[f32],
    seed: u64,
    what: &str,
) {
    let n = keys.len() / (2 * 64);
    let queries = vectors(n * 4, 64, seed ^ 7);
    forward_both_with(cpu, gpu, start, (keys, &queries), seed, what);
}

/// [`forward_both_with_keys`] with the queries given too (`[n, 4, 64]`).
fn forward_both_with(
    cpu: &mut KvCache,
    gpu: &mut GpuKvCache,
    start: u32,
    (keys, queries): (&[f32], &[f32]),
    seed: u64,
    what: &str,
) {
    let shape = AttentionShape {
        q_heads: 4,
        scale: 0.125,
    };
    let n = keys.len() / (2 * 64);
    let values = vectors(n, 2 * 64, seed ^ 0xFFFF);
    // The CPU call takes every position of the sequence, the GPU call the new ones.
    let all: Vec<u32> = (0..start + n as u32).collect();
    let positions = &all[start as usize..];
    let mut expected = vec![0.0f32; queries.len()];
    cpu.forward(
        queries,
        keys,
        &values,
        &all,
        shape,
        AttentionKernel::Reference,
        &mut expected,
    )
    .unwrap();
    let mut got = vec![0.0f32; queries.len()];
    gpu.forward(queries, keys, &values, positions, shape, &mut got)
        .unwrap();
    let top = expected.iter().fold(1e-3f32, |m, v| m.max(v.abs()));
    for (i, (a, b)) in got.iter().zip(&expected).enumerate() {
        assert!(
            (a - b).abs() <= 1e-4 * top,
            "{what} start {start}: output {i}: gpu {a} vs cpu {b} (top {top})"
        );
    }
}

/// The recommended presets (plane basis on the keys, sinks, 8-bit recent windows of their own
/// per stream, centering, norm-corrected values) and a principal-component basis: a GPU cache built empty fits the
/// same bases from the first batch and its queries as the CPU cache (same records), attends
/// alike through prefill and decode, and a copy uploaded from the fitted CPU cache attends
/// alike too.
#[test]
fn fitted_bases_match_the_cpu_cache() {
    let Some(ctx) = context() else { return };
    let pca = Allocation::from_toml_str(
        "name = \"pca\"\nkey = { codec = \"mse\", bits = 4, basis = \"pca\" }\n\
         value = { codec = \"mse\", bits = 3, basis = \"pca\" }\n",
    )
    .unwrap();
    let cases = [
        ("rec4.25", Allocation::preset("rec4.25").unwrap()),
        ("rec2.5", Allocation::preset("rec2.5").unwrap()),
        ("pca", pca),
    ];
    for (name, allocation) in cases {
        let mut cpu = KvCache::with_allocation(growing(2, 64), &allocation, 3, 8).unwrap();
        let mut gpu = GpuKvCache::new(&ctx, &cpu).unwrap();
        forward_both(&mut cpu, &mut gpu, 0, 100, 3);
        assert!(
            (0..2).all(|h| {
                let fit = &cpu.keys(h).layout().basis_fit;
                fit.as_ref().is_some_and(|f| f.fitted().is_some())
            }),
            "{name}: the keys' basis was fitted (not the identity)"
        );
        for t in 100..103u32 {
            forward_both(&mut cpu, &mut gpu, t, 1, u64::from(t));
        }
        let down = gpu.download().unwrap();
        let (mut kr, mut vr) = (vec![], vec![]);
        for t in 0..cpu.len() {
            for h in 0..2 {
                kr.extend_from_slice(&body_record(cpu.keys(h), t));
                vr.extend_from_slice(&body_record(cpu.values(h), t));
            }
        }
        assert_eq!(down.key_records, kr, "{name}");
        assert_eq!(down.value_records, vr, "{name}");
        compare(&mut gpu, &cpu, 4, &[102], 5);
        let mut uploaded = GpuKvCache::from_cache(&ctx, &cpu).unwrap();
        compare(&mut uploaded, &cpu, 4, &[102], 6);
    }
}

/// A full-precision recent window (with sinks, centering and norm-corrected values, the
/// levers of the recommended presets but the plane basis): `forward` gives every query of a
/// prefill its own window, as `KvCache::forward` does (a prefill longer than one chunk of the
/// GPU's copies ring included), decode steps and stored-cache attention read the stream's
/// window, and rewinds are allowed and refused exactly where the CPU allows and refuses them.
#[test]
fn recent_windows_match_the_cpu_cache() {
    let Some(ctx) = context() else { return };
    let allocation = Allocation::from_toml_str(
        "name = \"window\"\nsink_tokens = 2\nrecent_fp_tokens = 24\n\
         key = { codec = \"mse\", bits = 3, center = \"first-chunk\" }\n\
         value = { codec = \"mse\", bits = 2, center = \"first-chunk\", norm_correction = true }\n",
    )
    .unwrap();
    let mut layout = growing(2, 64);
    layout.max_rewind = 4;
    let mut cpu = KvCache::with_allocation(layout, &allocation, 3, 8).unwrap();
    let mut gpu = GpuKvCache::new(&ctx, &cpu).unwrap();
    forward_both(&mut cpu, &mut gpu, 0, 150, 1);
    for t in 150..155u32 {
        forward_both(&mut cpu, &mut gpu, t, 1, u64::from(t));
    }
    compare(&mut gpu, &cpu, 4, &[154], 9);
    cpu.truncate(151).unwrap();
    gpu.truncate(151).unwrap();
    forward_both(&mut cpu, &mut gpu, 151, 3, 77);
    compare(&mut gpu, &cpu, 4, &[153], 10);
    assert!(cpu.truncate(100).is_err());
    assert!(matches!(gpu.truncate(100), Err(GpuError::Cache(_))));
    assert_eq!(gpu.len(), cpu.len());
    // A copy uploaded from the CPU cache, and one that follows it from far behind, read the
    // window's copies the CPU shows; older ones are not readable, so they refuse to rewind
    // into them (typed) where the CPU cache still could.
    let mut uploaded = GpuKvCache::from_cache(&ctx, &cpu).unwrap();
    compare(&mut uploaded, &cpu, 4, &[153], 11);
    let mut follower = GpuKvCache::new(&ctx, &cpu).unwrap();
    follower.sync_from(&cpu).unwrap();
    compare(&mut follower, &cpu, 4, &[153], 12);
    for copy in [&mut uploaded, &mut follower] {
        assert!(matches!(copy.truncate(152), Err(GpuError::Cache(_))));
        assert_eq!(copy.len(), 154);
    }
}

/// Windows of their own per stream and KV head (an allocation's per-stream
/// `recent_fp_tokens`, with binary16 and with 8-bit copies): each stream of each head reads its
/// own window from the copies — through a prefill longer than one chunk, decode steps, a
/// rewind, and in copies uploaded from or following the CPU cache — as the CPU cache does, the
/// keys' window without sinks or values' windows included. A copy refuses the records of a CPU
/// cache with other windows (`upload_all`, `sync_from`): it would read codes where the CPU reads
/// copies.
#[test]
fn windows_per_stream_and_head_match_the_cpu_cache() {
    let Some(ctx) = context() else { return };
    let text = |sinks: usize, keys: usize, values: usize, head1_values: usize, dtype: &str| {
        format!(
            "name = \"w\"\nsink_tokens = {sinks}\nrecent_dtype = \"{dtype}\"\n\
             key = {{ codec = \"mse\", bits = 3, recent_fp_tokens = {keys} }}\n\
             value = {{ codec = \"mse\", bits = 2, recent_fp_tokens = {values} }}\n\
             [[override]]\nlayers = [0]\nheads = [1]\nvalue = {{ recent_fp_tokens = {head1_values} }}\n"
        )
    };
    let mut layout = growing(2, 64);
    layout.max_rewind = 4;
    let cpu = |sinks, keys, values, head1_values, dtype: &str| {
        let allocation =
            Allocation::from_toml_str(&text(sinks, keys, values, head1_values, dtype)).unwrap();
        KvCache::with_allocation(layout, &allocation, 0, 1).unwrap()
    };
    for dtype in ["f16", "q8"] {
        for (sinks, keys, values, head1_values) in [
            (0, 8, 0, 0),
            (0, 0, 8, 8),
            (2, 8, 4, 4),
            (2, 8, 8, 4),
            (2, 12, 6, 20),
        ] {
            let case = format!("{dtype} {sinks}/{keys}/{values}/{head1_values}");
            eprintln!("case {case}");
            let mut cpu = cpu(sinks, keys, values, head1_values, dtype);
            let mut gpu = GpuKvCache::new(&ctx, &cpu).unwrap();
            forward_both(&mut cpu, &mut gpu, 0, 90, 31);
            for t in 90..93u32 {
                forward_both(&mut cpu, &mut gpu, t, 1, u64::from(t));
            }
            compare(&mut gpu, &cpu, 4, &[92], 32);
            cpu.truncate(90).unwrap();
            gpu.truncate(90).unwrap();
            forward_both(&mut cpu, &mut gpu, 90, 2, 33);
            compare(&mut gpu, &cpu, 4, &[91], 34);
            assert!(cpu.truncate(80).is_err(), "{case}");
            assert!(
                matches!(gpu.truncate(80), Err(GpuError::Cache(_))),
                "{case}"
            );
            // Every token's codes, those still waiting in an 8-bit window included, are the
            // ones the GPU wrote itself.
            let written = gpu.download().unwrap();
            let mut uploaded = GpuKvCache::from_cache(&ctx, &cpu).unwrap();
            compare(&mut uploaded, &cpu, 4, &[91], 35);
            assert_eq!(uploaded.download().unwrap(), written, "{case}: upload_all");
            let mut follower = GpuKvCache::new(&ctx, &cpu).unwrap();
            follower.sync_from(&cpu).unwrap();
            compare(&mut follower, &cpu, 4, &[91], 36);
            assert_eq!(follower.download().unwrap(), written, "{case}: sync_from");
            for copy in [&mut uploaded, &mut follower] {
                assert!(
                    matches!(copy.truncate(90), Err(GpuError::Cache(_))),
                    "{case}"
                );
            }
        }
    }
    let refused = |result: Result<(), GpuError>, case: &str| match result {
        Err(GpuError::Unsupported(what)) => {
            assert!(what.contains("other recent windows"), "{case}: {what}")
        }
        other => panic!("{case}: {other:?}"),
    };
    let mut gpu = GpuKvCache::new(&ctx, &cpu(2, 8, 8, 8, "f16")).unwrap();
    let other = cpu(2, 8, 8, 4, "f16");
    refused(gpu.upload_all(&other), "upload_all");
    refused(gpu.sync_from(&other), "sync_from");
    assert!(gpu.upload_all(&cpu(2, 8, 8, 8, "f16")).is_ok());
}

/// Windows that grow with the context (`recent_fraction`: keys an eighth of the tokens held
/// over a floor of 8, values a quarter over 4 or over none, so the first token leaves the
/// values' window as it arrives; binary16 and 8-bit copies) in a CPU cache that
/// grows in pages: the GPU copy, built when both were empty, grows its ring of copies on the
/// device as the windows grow, and through a prefill longer than one chunk, decode steps, a
/// rewind and stored-cache attention each query reads its own window at its own length, as
/// the CPU cache does; copies uploaded from the CPU cache or following it agree too, with the
/// same codes.
#[test]
fn windows_that_grow_with_the_context_match_the_cpu_cache() {
    let Some(ctx) = context() else { return };
    for (dtype, floor) in [("f16", 4), ("q8", 4), ("q8", 0)] {
        let allocation = Allocation::from_toml_str(&format!(
            "name = \"grow\"\nsink_tokens = 2\nrecent_dtype = \"{dtype}\"\n\
             key = {{ codec = \"mse\", bits = 3, center = \"first-chunk\", recent_fp_tokens = 8, recent_fraction = 0.125 }}\n\
             value = {{ codec = \"mse\", bits = 2, recent_fp_tokens = {floor}, recent_fraction = 0.25 }}\n"
        ))
        .unwrap();
        let mut layout = growing(2, 64);
        layout.max_rewind = 4;
        let mut cpu = KvCache::with_allocation(layout, &allocation, 3, 8).unwrap();
        let built = cpu.values(0).recent_slots();
        let mut gpu = GpuKvCache::new(&ctx, &cpu).unwrap();
        forward_both(&mut cpu, &mut gpu, 0, 150, 41);
        assert_eq!(cpu.keys(0).recent_start(), 150 - 19, "{dtype}");
        assert_eq!(cpu.values(1).recent_start(), 150 - 38, "{dtype}");
        assert!(
            cpu.values(0).recent_slots() > built,
            "{dtype}: the CPU ring grew"
        );
        for t in 150..160u32 {
            forward_both(&mut cpu, &mut gpu, t, 1, u64::from(t));
        }
        compare(&mut gpu, &cpu, 4, &[159], 42);
        cpu.truncate(156).unwrap();
        gpu.truncate(156).unwrap();
        forward_both(&mut cpu, &mut gpu, 156, 3, 43);
        compare(&mut gpu, &cpu, 4, &[158], 44);
        assert!(cpu.truncate(100).is_err(), "{dtype}");
        assert!(
            matches!(gpu.truncate(100), Err(GpuError::Cache(_))),
            "{dtype}"
        );
        let written = gpu.download().unwrap();
        let mut uploaded = GpuKvCache::from_cache(&ctx, &cpu).unwrap();
        compare(&mut uploaded, &cpu, 4, &[158], 45);
        assert_eq!(uploaded.download().unwrap(), written, "{dtype}: upload_all");
        let mut follower = GpuKvCache::new(&ctx, &cpu).unwrap();
        follower.sync_from(&cpu).unwrap();
        compare(&mut follower, &cpu, 4, &[158], 46);
        // Both go on growing with the CPU cache.
        forward_both(&mut cpu, &mut uploaded, 159, 90, 47);
        let mut again = GpuKvCache::from_cache(&ctx, &cpu).unwrap();
        compare(&mut again, &cpu, 4, &[248], 48);
    }
}

/// An 8-bit window (`recent_dtype = "q8"`, with sinks, centering and a plane basis: the
/// levers of the `-q8` lever files): the GPU scores its copies against the query rotated once
/// and sums them in the window rotation's coordinates, and writes each token's codes when it
/// arrives — those the CPU writes when the token leaves the window, from the copy — so through
/// a prefill longer than one chunk, decode steps, a rewind and stored-cache attention it
/// attends as the CPU cache does, and its records of the tokens outside the window are the
/// CPU's bit for bit. A copy uploaded from the CPU cache, or following it, computes the
/// window's codes from the CPU's copies and agrees too. A copy built with binary16 windows
/// refuses the records of a cache with 8-bit ones (and the reverse), naming the option.
#[test]
fn eight_bit_windows_match_the_cpu_cache() {
    let Some(ctx) = context() else { return };
    let text = |dtype: &str| {
        format!(
            "name = \"w8\"\nsink_tokens = 2\nrecent_fp_tokens = 24\nrecent_dtype = \"{dtype}\"\n\
             key = {{ codec = \"mse\", bits = 3, basis = \"planes\", center = \"first-chunk\" }}\n\
             value = {{ codec = \"mse\", bits = 2, center = \"first-chunk\", norm_correction = true }}\n"
        )
    };
    let allocation = |dtype: &str| Allocation::from_toml_str(&text(dtype)).unwrap();
    let mut layout = growing(2, 64);
    layout.max_rewind = 4;
    let mut cpu = KvCache::with_allocation(layout, &allocation("q8"), 3, 8).unwrap();
    assert!(
        cpu.keys(0).defers_codes(),
        "the CPU stream writes codes on leaving"
    );
    let mut gpu = GpuKvCache::new(&ctx, &cpu).unwrap();
    forward_both(&mut cpu, &mut gpu, 0, 150, 21);
    for t in 150..155u32 {
        forward_both(&mut cpu, &mut gpu, t, 1, u64::from(t));
    }
    compare(&mut gpu, &cpu, 4, &[154], 22);
    // The records of the tokens that left the window are the CPU's (its body holds no others).
    let body = cpu.keys(0).body_tokens(cpu.len());
    assert_eq!(body, 155 - 24);
    let down = gpu.download().unwrap();
    let (mut kr, mut vr) = (vec![], vec![]);
    for t in 0..body {
        for h in 0..2 {
            kr.extend_from_slice(&body_record(cpu.keys(h), t));
            vr.extend_from_slice(&body_record(cpu.values(h), t));
        }
    }
    let (kw, vw) = (kr.len() / body, vr.len() / body);
    assert_eq!(down.key_records[..body * kw], kr[..]);
    assert_eq!(down.value_records[..body * vw], vr[..]);
    cpu.truncate(151).unwrap();
    gpu.truncate(151).unwrap();
    forward_both(&mut cpu, &mut gpu, 151, 3, 77);
    compare(&mut gpu, &cpu, 4, &[153], 23);
    // The codes of the tokens that re-entered the window and left it again are the same.
    for t in 154..160u32 {
        forward_both(&mut cpu, &mut gpu, t, 1, u64::from(t) ^ 5);
    }
    let body = cpu.keys(0).body_tokens(cpu.len());
    let down = gpu.download().unwrap();
    for h in 0..2 {
        for t in 0..body {
            let at = (t * 2 + h) * kw / 2;
            assert_eq!(
                down.key_records[at..at + kw / 2],
                body_record(cpu.keys(h), t)[..],
                "token {t} head {h} after the rewind"
            );
        }
    }
    let mut uploaded = GpuKvCache::from_cache(&ctx, &cpu).unwrap();
    compare(&mut uploaded, &cpu, 4, &[159], 24);
    assert_eq!(
        uploaded.download().unwrap(),
        down,
        "upload_all writes the same codes"
    );
    let mut follower = GpuKvCache::new(&ctx, &cpu).unwrap();
    follower.sync_from(&cpu).unwrap();
    compare(&mut follower, &cpu, 4, &[159], 25);
    // Decode steps on the CPU, synced one at a time.
    for t in 160..163u32 {
        let keys = vectors(1, 2 * 64, u64::from(t));
        let values = vectors(1, 2 * 64, u64::from(t) ^ 9);
        cpu.append(&keys, &values, &[t]).unwrap();
        follower.sync_from(&cpu).unwrap();
        compare(&mut follower, &cpu, 4, &[t], u64::from(t));
    }
    // One ring layout per layer: binary16 and 8-bit windows do not mix.
    let refused = |result: Result<(), GpuError>, case: &str| match result {
        Err(GpuError::Unsupported(what)) => {
            assert!(what.contains("recent_dtype"), "{case}: {what}")
        }
        other => panic!("{case}: {other:?}"),
    };
    let f16_cpu = KvCache::with_allocation(layout, &allocation("f16"), 3, 8).unwrap();
    let mut f16_gpu = GpuKvCache::new(&ctx, &f16_cpu).unwrap();
    refused(f16_gpu.upload_all(&cpu), "upload_all into binary16");
    refused(f16_gpu.sync_from(&cpu), "sync_from into binary16");
    let mut q8_gpu = GpuKvCache::new(
        &ctx,
        &KvCache::with_allocation(layout, &allocation("q8"), 3, 8).unwrap(),
    )
    .unwrap();
    refused(q8_gpu.upload_all(&f16_cpu), "upload_all into 8-bit");
}

/// Keys and queries that lean on one shared direction (every seventh token's keys far more),
/// so that some tokens draw several times their uniform share of attention: `[n, 2, 64]` keys
/// of the tokens from `start` on and `[n, 4, 64]` queries.
fn leaning(n: usize, start: u32, seed: u64) -> (Vec<f32>, Vec<f32>) {
    let mut keys: Vec<f32> = vectors(n, 2 * 64, seed).iter().map(|v| 0.5 * v).collect();
    for (i, k) in keys.chunks_exact_mut(64).enumerate() {
        if (start as usize + i / 2) % 7 == 3 {
            k[0] += 4.0;
        }
    }
    let mut queries: Vec<f32> = vectors(n * 4, 64, seed ^ 7)
        .iter()
        .map(|v| 0.5 * v)
        .collect();
    for q in queries.chunks_exact_mut(64) {
        q[0] += 3.0;
    }
    (keys, queries)
}

/// [`forward_both_with`] on [`leaning`] tokens.
fn forward_leaning(cpu: &mut KvCache, gpu: &mut GpuKvCache, start: u32, n: usize, seed: u64) {
    let (keys, queries) = leaning(n, start, seed);
    forward_both_with(cpu, gpu, start, (&keys, &queries), seed, "leaning");
}

/// Both caches keep the same heavy hitters in every stream, at the same cost (an 8-bit copy's
/// step takes a whole word on the device: 2 bytes more per copy).
fn same_kept(cpu: &KvCache, gpu: &GpuKvCache, when: &str) {
    let mut entries = 0;
    for h in 0..cpu.layout().kv_heads {
        for (s, stream) in [(0, cpu.keys(h)), (1, cpu.values(h))] {
            let expected = stream.heavy_hitters().map_or(&[][..], |k| k.kept());
            assert_eq!(
                gpu.kept_tokens(s, h),
                expected,
                "{when}: stream {s} of head {h}"
            );
            entries += expected.len();
        }
    }
    let q8 = matches!(cpu.keys(0).layout().recent, Some(CodecSpec::Q8 { .. }));
    let step = if q8 { 2 * entries } else { 0 };
    assert_eq!(gpu.kept_bytes(), cpu.kept_bytes() + step, "{when}");
}

/// Heavy hitters (binary16 and 8-bit windows): a GPU cache given the same tokens and queries
/// as the CPU cache keeps the same tokens — through a prefill longer than one chunk of the
/// GPU's ring, decode steps, a rewind and an append without queries longer than the ring — and
/// reads their kept copies as the CPU cache does (outputs and scores); copies uploaded from or
/// following the CPU cache take its decisions and tallies and go on deciding alike. (The
/// weights differ by f32 rounding from the CPU's f64 ones: these tokens' decisions are not
/// that close to the threshold.)
#[test]
fn heavy_hitters_match_the_cpu_cache() {
    let Some(ctx) = context() else { return };
    for dtype in ["q8", "f16"] {
        let allocation = Allocation::from_toml_str(&format!(
            "name = \"hh\"\nsink_tokens = 2\nrecent_fp_tokens = 16\nrecent_dtype = \"{dtype}\"\n\
             key = {{ codec = \"mse\", bits = 4, heavy_hitters = 2.0 }}\n\
             value = {{ codec = \"mse\", bits = 3, heavy_hitters = 2.0 }}\n"
        ))
        .unwrap();
        let mut layout = growing(2, 64);
        layout.max_rewind = 4;
        let mut cpu = KvCache::with_allocation(layout, &allocation, 3, 8).unwrap();
        let mut gpu = GpuKvCache::new(&ctx, &cpu).unwrap();
        forward_leaning(&mut cpu, &mut gpu, 0, 150, 1);
        same_kept(&cpu, &gpu, &format!("{dtype} prefill"));
        for t in 150..160u32 {
            forward_leaning(&mut cpu, &mut gpu, t, 1, u64::from(t));
        }
        same_kept(&cpu, &gpu, &format!("{dtype} decode"));
        for h in 0..2 {
            for s in 0..2 {
                let kept = gpu.kept_tokens(s, h).len();
                assert!(
                    kept > 0 && kept < 160 - 16 - 2,
                    "{dtype}: stream {s} of head {h} kept {kept} tokens"
                );
            }
        }
        compare(&mut gpu, &cpu, 4, &[159], 31);
        // A rewind drops the kept tokens past it; decisions go on alike.
        cpu.truncate(156).unwrap();
        gpu.truncate(156).unwrap();
        same_kept(&cpu, &gpu, &format!("{dtype} rewind"));
        for t in 156..162u32 {
            forward_leaning(&mut cpu, &mut gpu, t, 1, u64::from(t) ^ 3);
        }
        same_kept(&cpu, &gpu, &format!("{dtype} after the rewind"));
        // An append without queries, longer than the GPU's ring.
        let (keys, _) = leaning(100, 162, 5);
        let values = vectors(100, 2 * 64, 6);
        let positions: Vec<u32> = (162..262).collect();
        cpu.append(&keys, &values, &positions).unwrap();
        gpu.encode_and_append(&keys, &values, &positions).unwrap();
        forward_leaning(&mut cpu, &mut gpu, 262, 1, 7);
        same_kept(&cpu, &gpu, &format!("{dtype} append"));
        compare(&mut gpu, &cpu, 4, &[262], 32);
        let mut uploaded = GpuKvCache::from_cache(&ctx, &cpu).unwrap();
        same_kept(&cpu, &uploaded, &format!("{dtype} upload"));
        compare(&mut uploaded, &cpu, 4, &[262], 33);
        let mut follower = GpuKvCache::new(&ctx, &cpu).unwrap();
        follower.sync_from(&cpu).unwrap();
        same_kept(&cpu, &follower, &format!("{dtype} sync"));
        for t in 263..270u32 {
            forward_leaning(&mut cpu, &mut uploaded, t, 1, u64::from(t));
        }
        same_kept(&cpu, &uploaded, &format!("{dtype} uploaded, then decoding"));
        follower.sync_from(&cpu).unwrap();
        same_kept(&cpu, &follower, &format!("{dtype} synced again"));
        compare(&mut follower, &cpu, 4, &[269], 34);
    }
}

/// A batch that fails (a position gap, a non-finite value) changes nothing, calibration
/// included, on a host-encoded cache: the next good batch calibrates as the CPU cache's first
/// batch does. Records from the CPU cannot go into a copy that has not calibrated.
#[test]
fn failed_batches_leave_no_calibration() {
    let Some(ctx) = context() else { return };
    for name in ["k5v3-c", "tq3.5", "rec4.25"] {
        let mut cpu = preset_cache(name, growing(2, 64));
        let mut gpu = GpuKvCache::new(&ctx, &cpu).unwrap();
        let shape = AttentionShape {
            q_heads: 4,
            scale: 0.125,
        };
        let keys = vectors(70, 2 * 64, 90);
        let queries = vectors(70 * 4, 64, 91);
        let mut out = vec![0.0f32; queries.len()];
        let mut gap: Vec<u32> = (0..70).collect();
        gap[40] = 3;
        assert!(
            gpu.forward(&queries, &keys, &keys, &gap, shape, &mut out)
                .is_err()
        );
        let mut bad = keys.clone();
        bad[5000] = f32::NAN;
        let positions: Vec<u32> = (0..70).collect();
        assert!(
            gpu.forward(&queries, &bad, &keys, &positions, shape, &mut out)
                .is_err()
        );
        assert_eq!(gpu.len(), 0, "{name}");
        forward_both(&mut cpu, &mut gpu, 0, 70, 5);
        forward_both(&mut cpu, &mut gpu, 70, 1, 6);
        let (records, scales) = (vec![0u32; 2 * cpu.keys(0).codec().record_words()], vec![]);
        let mut fresh = GpuKvCache::new(&ctx, &preset_cache(name, growing(2, 64))).unwrap();
        let tokens = tq_attention_wgpu::EncodedTokens {
            records: &records,
            scales: &scales,
        };
        assert!(
            matches!(
                fresh.append_encoded(tokens, tokens, &[0]),
                Err(GpuError::Unsupported(_))
            ),
            "{name}"
        );
    }
}

/// Sliding layers: a ring that wrapped, the window mask, a prefill chunk, and a rewind.
#[test]
fn sliding_window_rings_match_reference() {
    let Some(ctx) = context() else { return };
    for (key, value) in [(5usize, 2usize), (2, 8), (1, 0)] {
        let spec_k = codec(key, 64, 4, 3);
        let spec_v = codec(value, 64, 4, 4);
        let mut cpu = KvCache::uniform(sliding(2, 64, 50, 3), spec_k, spec_v).unwrap();
        fill(&mut cpu, 0, 130, 9);
        let mut gpu = GpuKvCache::from_cache(&ctx, &cpu).unwrap();
        compare(&mut gpu, &cpu, 4, &[129], 1);
        // Three decode steps on both, then a rewind of two tokens and one more step.
        for p in 130..133u32 {
            let (k, v, pos) = fill(&mut cpu, p, 1, u64::from(p));
            gpu.encode_and_append(&k, &v, &pos).unwrap();
        }
        compare(&mut gpu, &cpu, 4, &[132], 2);
        cpu.truncate(131).unwrap();
        gpu.truncate(131).unwrap();
        let (k, v, pos) = fill(&mut cpu, 131, 1, 77);
        gpu.encode_and_append(&k, &v, &pos).unwrap();
        compare(&mut gpu, &cpu, 4, &[131], 3);
        // One batch longer than the ring (53 slots): only its last 53 tokens stay.
        let (k, v, pos) = fill(&mut cpu, 132, 60, 78);
        gpu.encode_and_append(&k, &v, &pos).unwrap();
        compare(&mut gpu, &cpu, 4, &[191], 4);
    }
}

/// Streams in the fast-scan order keep it on the GPU (blocks of 32 slots, codes of 3 and 5–8
/// bits as bit planes; two tiers of TQ_mse and TQ_prod's signs too): uploaded block by block from the CPU store, appended by the GPU's
/// encoder and by the CPU's (the scatter kernel writes nibbles through the planes), across
/// block and page boundaries and around a ring; the records read back equal the CPU's and
/// attention matches the reference after each step.
#[test]
fn fast_scan_streams_match_the_cpu_cache() {
    let Some(ctx) = context() else { return };
    // Two tiers of TQ_mse (4/3-bit keys, 3/2-bit values: a part per tier, each its own norm).
    let tiers = "outliers = { fraction = 0.25, key = { bits = 4 }, value = { bits = 3 } }\n";
    // TQ_prod (QJL signs a run of 1-bit codes after the codes): 5-bit keys, 4-bit values.
    let prod = "qjl = \"haar\", ";
    for (kb, vb, sliding_layer, outliers, codec) in [
        (3u8, 6u8, false, "", ""),
        (5, 7, false, "", ""),
        (8, 4, true, "", ""),
        (7, 3, true, "", ""),
        (3, 2, false, tiers, ""),
        (3, 2, true, tiers, ""),
        (5, 4, false, "", prod),
        (5, 4, true, "", prod),
    ] {
        let kind = if codec.is_empty() { "mse" } else { "prod" };
        let alloc = Allocation::from_toml_str(&format!(
            "name = \"fast-k{kb}v{vb}\"\n{outliers}\
             key = {{ codec = \"{kind}\", bits = {kb}, {codec}record_order = \"fast-scan\" }}\n\
             value = {{ codec = \"{kind}\", bits = {vb}, {codec}record_order = \"fast-scan\" }}"
        ))
        .unwrap();
        let layout = if sliding_layer {
            sliding(2, 64, 50, 3)
        } else {
            growing(2, 64)
        };
        let name = format!("{kind} k{kb}v{vb} sliding {sliding_layer} {outliers}");
        let mut cpu = KvCache::with_allocation(layout, &alloc, 0, 1).unwrap();
        fill(&mut cpu, 0, 100, u64::from(kb));
        for h in 0..2 {
            assert_eq!(
                cpu.keys(h).body().order(),
                tq_cache::record_order::RecordOrder::FastScan,
                "{name}"
            );
            // Planes: codes of 3 and 5–8 bits (TQ_prod's 4-bit values are 3-bit codes).
            let nibbles = outliers.is_empty() && kind == "mse" && vb == 4;
            assert_eq!(cpu.values(h).body().planes().is_some(), !nibbles, "{name}");
        }
        let mut gpu = GpuKvCache::from_cache(&ctx, &cpu).unwrap();
        compare(&mut gpu, &cpu, 4, &[99], 1);
        // 40 steps from token 100: past the block boundary at 128 (and around the ring of 53
        // slots), even steps encoded by the GPU, odd ones by the CPU and uploaded.
        for step in 0..40u32 {
            let p = 100 + step;
            let (k, v, pos) = fill(&mut cpu, p, 1, 1000 + u64::from(step));
            if step % 2 == 0 {
                gpu.encode_and_append(&k, &v, &pos).unwrap();
            } else {
                gpu.sync_from(&cpu).unwrap();
            }
            if step % 13 == 0 || step == 39 {
                compare(&mut gpu, &cpu, 4, &[p], u64::from(step));
            }
        }
        let down = gpu.download().unwrap();
        let (mut kr, mut vr) = (vec![], vec![]);
        for t in cpu.first_stored()..cpu.len() {
            for h in 0..2 {
                kr.extend(body_record(cpu.keys(h), t));
                vr.extend(body_record(cpu.values(h), t));
            }
        }
        assert_eq!(down.key_records, kr, "{name}");
        assert_eq!(down.value_records, vr, "{name}");
        // A fresh upload of the same cache (the CPU blocks copied as they are) reads the same.
        let mut again = GpuKvCache::from_cache(&ctx, &cpu).unwrap();
        assert_eq!(again.download().unwrap(), down, "{name}");
        compare(&mut again, &cpu, 4, &[139], 40);
    }
}

/// A causal prefill chunk: each query sees only the tokens up to its own position.
#[test]
fn prefill_chunks_are_causal() {
    let Some(ctx) = context() else { return };
    let mut cpu = preset_cache("k5v4", growing(1, 64));
    fill(&mut cpu, 0, 40, 13);
    let mut gpu = GpuKvCache::from_cache(&ctx, &cpu).unwrap();
    let positions: Vec<u32> = (0..40).collect();
    compare(&mut gpu, &cpu, 2, &positions, 17);
}

/// Bad input is a typed error, never a panic.
#[test]
fn errors_are_typed() {
    let Some(ctx) = context() else { return };
    let mut cpu = preset_cache("k5v4", growing(2, 64));
    fill(&mut cpu, 0, 10, 1);
    let mut gpu = GpuKvCache::from_cache(&ctx, &cpu).unwrap();
    let shape = AttentionShape {
        q_heads: 4,
        scale: 0.125,
    };
    let mut q = vec![0.5f32; 4 * 64];
    let mut out = vec![0.0f32; 4 * 64];
    q[3] = f32::NAN;
    assert!(matches!(
        gpu.attend(&q, &[9], shape, &mut out),
        Err(GpuError::Codec(_))
    ));
    q[3] = 0.5;
    let bad = AttentionShape {
        q_heads: 3,
        scale: 0.125,
    };
    assert!(
        gpu.attend(&q[..3 * 64], &[9], bad, &mut out[..3 * 64])
            .is_err()
    );
    assert!(matches!(
        gpu.attend(&q, &[9, 9], shape, &mut out),
        Err(GpuError::Shape { .. })
    ));
    let kv = vec![0.1f32; 2 * 64];
    assert!(matches!(
        gpu.encode_and_append(&kv, &kv, &[3]),
        Err(GpuError::Cache(_))
    ));
    let mut huge = kv.clone();
    huge[0] = 1e6;
    assert!(matches!(
        gpu.encode_and_append(&huge, &kv, &[10]),
        Err(GpuError::Codec(_))
    ));
    assert_eq!(gpu.len(), 10, "a rejected append changes nothing");
    // Two tiers are encoded on the host: the encode kernel refuses them.
    let two_tier =
        KvCache::with_allocation(growing(1, 128), &Allocation::preset("tq2.5").unwrap(), 3, 8)
            .unwrap();
    let mut gpu_two_tier = GpuKvCache::new(&ctx, &two_tier).unwrap();
    assert!(matches!(
        gpu_two_tier.encode_records(tq_attention_wgpu::StreamKind::Keys, &vectors(1, 128, 3)),
        Err(GpuError::Unsupported(_))
    ));
    // Two tiers with QJL tiers are not implemented.
    let prod_tiers = Allocation::from_toml_str(
        "name = \"prod-tiers\"\nkey = { codec = \"prod\", bits = 4 }\n\
         value = { codec = \"mse\", bits = 3 }\n\
         [outliers]\nfraction = 0.25\nkey = { bits = 5 }\nvalue = { bits = 4 }\n",
    )
    .unwrap();
    let prod_tiers = KvCache::with_allocation(growing(1, 128), &prod_tiers, 3, 8).unwrap();
    match GpuKvCache::new(&ctx, &prod_tiers) {
        Err(GpuError::Unsupported(what)) => assert!(what.contains("TQ_mse"), "{what}"),
        other => panic!("QJL tiers must be refused, got {other:?}"),
    }
}

/// GQA groups larger than one workgroup's eight heads split into equal head chunks (the
/// largest divisor of the group up to eight).
#[test]
fn large_gqa_groups_split_into_head_chunks() {
    let Some(ctx) = context() else { return };
    let mut cpu = preset_cache("k5v4", growing(1, 64));
    fill(&mut cpu, 0, 70, 31);
    let mut gpu = GpuKvCache::from_cache(&ctx, &cpu).unwrap();
    compare(&mut gpu, &cpu, 12, &[69], 5); // chunks of 6
    compare(&mut gpu, &cpu, 11, &[69], 7); // a prime group: chunks of 1
    let mut cpu = KvCache::uniform(
        growing(2, 64),
        CodecSpec::F32 { dim: 64 },
        CodecSpec::F16 { dim: 64 },
    )
    .unwrap();
    fill(&mut cpu, 0, 70, 32);
    let mut gpu = GpuKvCache::from_cache(&ctx, &cpu).unwrap();
    compare(&mut gpu, &cpu, 32, &[69], 6);
}

/// Keys whose un-rotated mean is large and turned by RoPE with the position (what `center =
/// "rope"` removes): `k_t = R(t)·m_h + g_t`, `m_h` of norm ~3·√d per KV head, `g_t` Gaussian;
/// `[n, kv_heads, d]` for stream indices `start..start + n`.
fn turning_keys(n: usize, start: usize, layout: &KvLayout, base: f64, seed: u64) -> Vec<f32> {
    let (heads, d) = (layout.kv_heads, layout.head_dim);
    let mut keys = vectors(n, heads * d, seed);
    let means = vectors(heads, d, 0x3EA9);
    for (i, row) in keys.chunks_exact_mut(heads * d).enumerate() {
        let t = (start + i) as f64;
        for (h, k) in row.chunks_exact_mut(d).enumerate() {
            let m = &means[h * d..(h + 1) * d];
            for p in 0..d / 2 {
                let [a, b] = layout.rope_pairs.plane(p, d);
                let angle = t * base.powf(-2.0 * p as f64 / d as f64);
                let (sin, cos) = angle.sin_cos();
                let (x, y) = (3.0 * f64::from(m[a]), 3.0 * f64::from(m[b]));
                k[a] += (x * cos - y * sin) as f32;
                k[b] += (x * sin + y * cos) as f32;
            }
        }
    }
    keys
}

/// Appends `n` tokens with [`turning_keys`] at positions `start..start + n` to the CPU cache.
fn fill_turning(cpu: &mut KvCache, start: u32, n: usize, seed: u64) -> (Vec<f32>, Vec<f32>) {
    let layout = *cpu.layout();
    let keys = turning_keys(n, start as usize, &layout, 10_000.0, seed);
    let values = vectors(n, layout.kv_heads * layout.head_dim, seed ^ 0xFFFF);
    let positions: Vec<u32> = (start..start + n as u32).collect();
    cpu.append(&keys, &values, &positions).unwrap();
    (keys, values)
}

/// RoPE-aware key centering (`center = "rope"`: f32 keys, plain 4-bit keys, and the
/// recommended presets' lever files with it — plane bases, sinks, 8-bit windows, centered
/// values) with both RoPE pair layouts, on keys whose mean turns with the position: a GPU cache
/// built empty fits the same `m` from the first batch and stores the same records as the CPU
/// cache (each token centered on its block's turn of `m`), attends alike through a prefill and
/// decode steps across center blocks, and a copy uploaded from the CPU cache scores and attends
/// as the reference does (which adds each block's `q·c` back). Without the correction the
/// scores would be off by `q·c(t)`, of the order of the scores themselves here.
#[test]
fn rope_centered_keys_match_the_cpu_cache() {
    let Some(ctx) = context() else { return };
    let lever = |name: &str| {
        let path = format!(
            "{}/../cache/presets/levers/{name}.toml",
            env!("CARGO_MANIFEST_DIR")
        );
        Allocation::load(path).unwrap()
    };
    let f32_keys = Allocation::from_toml_str(
        "name = \"f32-rope\"\nkey = { codec = \"f32\", center = \"rope\" }\n\
         value = { codec = \"mse\", bits = 4 }\n",
    )
    .unwrap();
    let cases = [
        ("f32-rope", f32_keys),
        ("mse-k4v4-rope", lever("mse-k4v4-rope")),
        ("rec4.25-rope", lever("rec4.25-rope")),
        ("rec2.5-rope", lever("rec2.5-rope")),
    ];
    for (name, allocation) in &cases {
        for pairs in [RopePairs::Adjacent, RopePairs::Halves] {
            let mut layout = growing(2, 64);
            layout.rope_pairs = pairs;
            layout.rope_base = RopeBase::new(10_000.0);
            let mut cpu = KvCache::with_allocation(layout, allocation, 3, 8).unwrap();
            let mut gpu = GpuKvCache::new(&ctx, &cpu).unwrap();
            // A prefill of 70 tokens (4 center blocks and a part), then decode steps.
            for (start, n) in [(0u32, 70usize), (70, 1), (71, 1), (72, 9), (81, 1)] {
                let seed = u64::from(start) + 40;
                let keys = turning_keys(n, start as usize, &layout, 10_000.0, seed);
                let what = format!("{name} {pairs:?}");
                forward_both_with_keys(&mut cpu, &mut gpu, start, &keys, seed, &what);
            }
            assert!(
                (0..2).all(|h| cpu
                    .keys(h)
                    .mean()
                    .is_some_and(|m| m.iter().any(|&x| x != 0.0))),
                "{name}: the keys' m was fitted"
            );
            let down = gpu.download().unwrap();
            let mut kr = vec![];
            for t in 0..cpu.len() {
                for h in 0..2 {
                    kr.extend_from_slice(&body_record(cpu.keys(h), t));
                }
            }
            assert_eq!(down.key_records, kr, "{name} {pairs:?}");
            compare(&mut gpu, &cpu, 4, &[81], 5);
            let mut uploaded = GpuKvCache::from_cache(&ctx, &cpu).unwrap();
            compare(&mut uploaded, &cpu, 4, &[40, 81], 6);
        }
    }
}

/// RoPE-centered keys on a sliding layer: the ring's slots hold tokens from ever later center
/// blocks (stream indices far past the ring), through decode steps, a rewind and a batch
/// longer than the ring; scores and outputs match the reference after each.
#[test]
fn rope_centered_rings_match_reference() {
    let Some(ctx) = context() else { return };
    let allocation = Allocation::from_toml_str(
        "name = \"rope\"\nkey = { codec = \"mse\", bits = 4, center = \"rope\" }\n\
         value = { codec = \"mse\", bits = 4 }\n",
    )
    .unwrap();
    let mut layout = sliding(2, 64, 50, 3);
    layout.rope_base = RopeBase::new(10_000.0);
    let mut cpu = KvCache::with_allocation(layout, &allocation, 3, 8).unwrap();
    fill_turning(&mut cpu, 0, 130, 9);
    let mut gpu = GpuKvCache::from_cache(&ctx, &cpu).unwrap();
    compare(&mut gpu, &cpu, 4, &[129], 1);
    for p in 130..133u32 {
        let (k, v) = fill_turning(&mut cpu, p, 1, u64::from(p));
        gpu.encode_and_append(&k, &v, &[p]).unwrap();
    }
    compare(&mut gpu, &cpu, 4, &[132], 2);
    cpu.truncate(131).unwrap();
    gpu.truncate(131).unwrap();
    let (k, v) = fill_turning(&mut cpu, 131, 1, 77);
    gpu.encode_and_append(&k, &v, &[131]).unwrap();
    compare(&mut gpu, &cpu, 4, &[131], 3);
    let (k, v) = fill_turning(&mut cpu, 132, 60, 78);
    let positions: Vec<u32> = (132..192).collect();
    gpu.encode_and_append(&k, &v, &positions).unwrap();
    compare(&mut gpu, &cpu, 4, &[191], 4);
}
