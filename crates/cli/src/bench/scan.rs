//! `tq bench scan`: key scoring alone, one thread, the three ways a decode step can score a
//! GQA group's query heads against T cached keys, side by side:
//!
//! - `f16`: uncompressed f16 keys, `score_plain` (the fused kernel's f16 scoring);
//! - `coded`: TurboQuant_mse records of b bits as the cache stores them, `score_coded` (the
//!   fused kernel's compressed scoring: unpack, centroid look-up, multiply-add, reduce per
//!   token);
//! - `fast-scan`: the same codes in the token-parallel layout
//!   (`tq_cache::attention::fast_scan`), scored by byte shuffles summed in integers.
//!
//! With `--attention`, three more rows per (shape, T, b) time a whole decode step of one KV
//! head's group (scores, softmax, values): the fused kernel over an f16 cache (`f16-attend`)
//! and over a TurboQuant_mse b/b cache (`coded-attend`), and `fast_scan::attend` over the same
//! widths in the fast-scan layout (`fast-scan-attend`, and `fast-scan-int-attend` with the
//! values summed in integers); bytes read count keys and values.
//!
//! Every round scores `--copies` independent key sets (round-robin, so the sets' bytes
//! together exceed the last-level cache and come from memory, as a model's layers do) and the
//! rows report seconds per set. "of bw" is the row's GB/s over a one-thread streaming read
//! measured in the same run. Scores only: softmax and values are not in these figures.

use clap::Args;
use half::f16;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use serde::Serialize;
use tq_cache::CodecSpec;
use tq_cache::attention::AttentionShape;
use tq_cache::attention::fast_scan::{
    AttendScratch, FastScanBlocks, FastScanStream, ScoreTable, ValueSums, attend_with, scores_heads,
};
use tq_cache::attention::simd::{
    CodedRun, Isa, KeyQueries, PlainKind, PlainRun, fused_attention_on, score_coded, score_plain,
};
use tq_cache::codec::{MseSpec, TqMse};
use tq_cache::kv_cache::{KvCache, KvKind, KvLayout};
use tq_cache::token_store::Growth;

use super::attention::streaming_read_seconds;
use super::timing::interleaved_medians;
use crate::output::table;

/// Arguments of `tq bench scan`.
#[derive(Args, Debug)]
pub struct ScanBenchArgs {
    /// Print JSON rows instead of a table.
    #[arg(long)]
    json: bool,
    /// Cached tokens T per key set (comma separated).
    #[arg(long, value_delimiter = ',', default_value = "16384,65536")]
    tokens: Vec<usize>,
    /// Code widths b of the compressed rows (1 to 4, comma separated).
    #[arg(long, value_delimiter = ',', default_value = "4,2")]
    bits: Vec<u8>,
    /// Independent key sets scored round-robin per timed round.
    #[arg(long, default_value_t = 16)]
    copies: usize,
    /// Timed rounds (the median is reported).
    #[arg(long, default_value_t = 11)]
    repeats: usize,
    /// Also time whole decode steps (scores, softmax, values): fused kernel and fast scan.
    #[arg(long)]
    attention: bool,
}

/// One JSON row of `tq bench scan --json`.
#[derive(Serialize, Debug)]
struct ScanRow {
    /// `smollm2` (d = 64, 3 query heads per KV head) or `d128` (d = 128, 4).
    shape: &'static str,
    tokens: usize,
    /// `f16`, `coded` or `fast-scan` (scores only), or `f16-attend`, `coded-attend`,
    /// `fast-scan-attend`, `fast-scan-int-attend` (whole steps, `--attention`; the last with
    /// the values summed in integers, `ValueSums::Int8`).
    kernel: &'static str,
    /// Code width (`null` for f16).
    bits: Option<u8>,
    /// Median seconds to score one key set against the group's heads.
    seconds: f64,
    /// f16 seconds / this row's, same run.
    ratio_vs_f16: f64,
    /// Key bytes one set's scoring reads (codes and norms, or f16 vectors).
    bytes_read: u64,
    gb_per_s: f64,
    /// `gb_per_s` over the one-thread streaming read of the same run.
    bandwidth_fraction: f64,
}

struct Shape {
    name: &'static str,
    dim: usize,
    heads: usize,
}

const SHAPES: [Shape; 2] = [
    Shape {
        name: "smollm2",
        dim: 64,
        heads: 3,
    },
    Shape {
        name: "d128",
        dim: 128,
        heads: 4,
    },
];

/// One key set in the three layouts.
struct KeySet {
    f16_words: Vec<u32>,
    coded_words: Vec<u32>,
    norms: Vec<f32>,
    fast: FastScanBlocks,
}

fn key_set(
    dim: usize,
    bits: u8,
    tokens: usize,
    seed: u64,
) -> Result<KeySet, Box<dyn std::error::Error>> {
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    let mut f16_words = Vec::with_capacity(tokens * dim / 2);
    for _ in 0..tokens * dim / 2 {
        let lo = f16::from_f32(rng.random_range(-2.0f32..2.0)).to_bits();
        let hi = f16::from_f32(rng.random_range(-2.0f32..2.0)).to_bits();
        f16_words.push(u32::from(lo) | (u32::from(hi) << 16));
    }
    let words_per = (dim * usize::from(bits)).div_ceil(32);
    let mut coded_words = vec![0u32; tokens * words_per];
    let mut norms = Vec::with_capacity(tokens);
    let mut fast = FastScanBlocks::new(dim, bits)?;
    let mut codes = vec![0u8; dim];
    for t in 0..tokens {
        for c in codes.iter_mut() {
            *c = rng.random_range(0..1u8 << bits);
        }
        tq_cache::codec::packing::pack(
            &codes,
            bits,
            &mut coded_words[t * words_per..(t + 1) * words_per],
        )?;
        let norm = rng.random_range(0.5f32..2.0);
        norms.push(norm);
        fast.push(&codes, norm)?;
    }
    Ok(KeySet {
        f16_words,
        coded_words,
        norms,
        fast,
    })
}

/// Whole decode steps over one KV head: the fused kernel on f16 and TurboQuant_mse b/b caches
/// and `fast_scan::attend` on the same widths, `--copies` caches round-robin, one thread.
fn attention_rows(
    shape: &Shape,
    tokens: usize,
    bits: u8,
    args: &ScanBenchArgs,
    isa: Isa,
    one: &rayon::ThreadPool,
    bandwidth: f64,
) -> Result<Vec<ScanRow>, Box<dyn std::error::Error>> {
    let d = shape.dim;
    let layout = KvLayout {
        kv_heads: 1,
        head_dim: d,
        kind: KvKind::Growing {
            growth: Growth::Static { capacity: tokens },
        },
        max_rewind: 0,
        rope_pairs: tq_cache::basis::RopePairs::Adjacent,
        rope_base: Default::default(),
    };
    let (key_spec, value_spec) = (MseSpec::new(d, bits, 1), MseSpec::new(d, bits, 2));
    let (key_codec, value_codec) = (TqMse::new(key_spec)?, TqMse::new(value_spec)?);
    let mut f16_caches = Vec::new();
    let mut coded_caches = Vec::new();
    let mut fast = Vec::new();
    let mut codes = vec![0u8; d];
    for c in 0..args.copies {
        let mut rng = ChaCha20Rng::seed_from_u64(500 + c as u64);
        let keys: Vec<f32> = (0..tokens * d)
            .map(|_| rng.random_range(-1.0f32..1.0))
            .collect();
        let values: Vec<f32> = (0..tokens * d)
            .map(|_| rng.random_range(-1.0f32..1.0))
            .collect();
        let positions: Vec<u32> = (0..tokens as u32).collect();
        let mut f16_cache =
            KvCache::uniform(layout, CodecSpec::F16 { dim: d }, CodecSpec::F16 { dim: d })?;
        f16_cache.append(&keys, &values, &positions)?;
        let mut coded_cache =
            KvCache::uniform(layout, CodecSpec::Mse(key_spec), CodecSpec::Mse(value_spec))?;
        coded_cache.append(&keys, &values, &positions)?;
        let mut k_blocks = FastScanBlocks::new(d, bits)?;
        let mut v_blocks = FastScanBlocks::new(d, bits)?;
        for (data, codec, blocks) in [
            (&keys, &key_codec, &mut k_blocks),
            (&values, &value_codec, &mut v_blocks),
        ] {
            for x in data.chunks_exact(d) {
                let code = codec.encode(x)?;
                tq_cache::codec::packing::unpack(&code.words, bits, &mut codes)?;
                blocks.push(&codes, code.norm.to_f32())?;
            }
        }
        f16_caches.push(f16_cache);
        coded_caches.push(coded_cache);
        fast.push((k_blocks, v_blocks));
    }
    let mut rng = ChaCha20Rng::seed_from_u64(6);
    let queries: Vec<f32> = (0..shape.heads * d)
        .map(|_| rng.random_range(-1.0f32..1.0))
        .collect();
    let scale = 1.0 / (d as f32).sqrt();
    let attention = AttentionShape {
        q_heads: shape.heads,
        scale,
    };
    let position = [tokens as u32 - 1];
    let mut outs = vec![vec![0.0f32; queries.len()]; 4];
    let [o1, o2, o3, o4] = &mut outs[..] else {
        unreachable!("four outputs")
    };
    let mut scratch = AttendScratch::default();
    let mut int_scratch = AttendScratch::default();
    let mut f16_step = || {
        for cache in &f16_caches {
            fused_attention_on(isa, cache, &queries, &position, attention, o1).expect("valid");
        }
    };
    let mut coded_step = || {
        for cache in &coded_caches {
            fused_attention_on(isa, cache, &queries, &position, attention, o2).expect("valid");
        }
    };
    // One decode step per fast-scan cache, the values summed as `sums` says.
    let fast_steps = |sums: ValueSums, out: &mut [f32], scratch: &mut AttendScratch| {
        for (k, v) in &fast {
            let stream = |blocks, codec| FastScanStream { blocks, codec };
            attend_with(
                isa,
                stream(k, &key_codec),
                stream(v, &value_codec),
                &queries,
                scale,
                out,
                scratch,
                sums,
            )
            .expect("valid");
        }
    };
    let mut fast_step = || fast_steps(ValueSums::Float, o3, &mut scratch);
    let mut int_step = || fast_steps(ValueSums::Int8, o4, &mut int_scratch);
    let seconds = one.install(|| {
        interleaved_medians(
            args.repeats,
            &mut [
                &mut f16_step,
                &mut coded_step,
                &mut fast_step,
                &mut int_step,
            ],
        )
    });
    let per_set: Vec<f64> = seconds.iter().map(|s| s / args.copies as f64).collect();
    let coded_bytes = 2 * (key_codec.bytes_per_vector() as u64);
    let fast_bytes = (2 * tokens * fast[0].0.bytes_per_token()) as u64;
    let bytes = [
        (tokens * d * 4) as u64,
        tokens as u64 * coded_bytes,
        fast_bytes,
        fast_bytes,
    ];
    Ok([
        "f16-attend",
        "coded-attend",
        "fast-scan-attend",
        "fast-scan-int-attend",
    ]
    .into_iter()
    .enumerate()
    .map(|(k, kernel)| {
        let gb_per_s = bytes[k] as f64 / per_set[k] / 1e9;
        ScanRow {
            shape: shape.name,
            tokens,
            kernel,
            bits: (k > 0).then_some(bits),
            seconds: per_set[k],
            ratio_vs_f16: per_set[0] / per_set[k],
            bytes_read: bytes[k],
            gb_per_s,
            bandwidth_fraction: gb_per_s / bandwidth,
        }
    })
    .collect())
}

/// Runs `tq bench scan`.
pub fn run(args: &ScanBenchArgs) -> Result<(), Box<dyn std::error::Error>> {
    if let Some(b) = args.bits.iter().find(|b| !(1..=4).contains(*b)) {
        return Err(format!("--bits {b}: the fast-scan layout holds 1 to 4 bits").into());
    }
    if args.copies == 0 || args.tokens.contains(&0) {
        return Err("--copies and --tokens need positive values".into());
    }
    let isa = Isa::detect();
    let one = rayon::ThreadPoolBuilder::new().num_threads(1).build()?;
    let (read_seconds, read_bytes) =
        one.install(|| streaming_read_seconds(args.repeats.clamp(3, 9)));
    let bandwidth = read_bytes as f64 / read_seconds / 1e9;
    let mut rows = Vec::new();
    for shape in &SHAPES {
        let d = shape.dim;
        let mut rng = ChaCha20Rng::seed_from_u64(5);
        let queries: Vec<f32> = (0..shape.heads * d)
            .map(|_| rng.random_range(-1.0f32..1.0))
            .collect();
        for &tokens in &args.tokens {
            for &bits in &args.bits {
                let codec = TqMse::new(MseSpec::new(d, bits, 1))?;
                let centroids = codec.codebook().centroids_f32().to_vec();
                let sets: Vec<KeySet> = (0..args.copies)
                    .map(|c| key_set(d, bits, tokens, 100 + c as u64))
                    .collect::<Result<_, _>>()?;
                let prepared = KeyQueries::new(isa, queries.clone(), Vec::new(), d, 0, false);
                let words_per = (d * usize::from(bits)).div_ceil(32);
                let mut out = vec![0.0f32; shape.heads * tokens];
                let mut out2 = out.clone();
                let mut out3 = out.clone();
                let mut plain = || {
                    for s in &sets {
                        out.fill(0.0);
                        let run = PlainRun {
                            words: &s.f16_words,
                            record_words: d / 2,
                            offset: 0,
                            kind: PlainKind::F16,
                            dim: d,
                        };
                        score_plain(isa, &run, &queries, &mut out, tokens);
                    }
                    std::hint::black_box(&out);
                };
                let mut coded = || {
                    for s in &sets {
                        out2.fill(0.0);
                        let run = CodedRun {
                            words: &s.coded_words,
                            record_words: words_per,
                            code_offset: 0,
                            bits,
                            dim: d,
                            centroids: &centroids,
                            sign_offset: 0,
                            sketch_dim: 0,
                            scales: &s.norms,
                            scale_stride: 1,
                        };
                        score_coded(isa, &run, &prepared, &mut out2, tokens);
                    }
                    std::hint::black_box(&out2);
                };
                let mut fast = || {
                    for s in &sets {
                        // The tables are built per query, as a decode step would.
                        let tables: Vec<ScoreTable> = queries
                            .chunks_exact(d)
                            .map(|q| ScoreTable::new(q, &centroids, bits).expect("valid table"))
                            .collect();
                        scores_heads(isa, &tables, &s.fast, &mut out3).expect("valid keys");
                    }
                    std::hint::black_box(&out3);
                };
                let seconds = one.install(|| {
                    interleaved_medians(args.repeats, &mut [&mut plain, &mut coded, &mut fast])
                });
                let copies = args.copies as f64;
                let per_set: Vec<f64> = seconds.iter().map(|s| s / copies).collect();
                let bytes = [
                    (tokens * d * 2) as u64,
                    (tokens * (4 * words_per + 4)) as u64,
                    (tokens * sets[0].fast.bytes_per_token()) as u64,
                ];
                if args.attention {
                    rows.extend(attention_rows(
                        shape, tokens, bits, args, isa, &one, bandwidth,
                    )?);
                }
                for (k, kernel) in ["f16", "coded", "fast-scan"].into_iter().enumerate() {
                    if kernel == "f16" && bits != args.bits[0] {
                        continue;
                    }
                    let gb_per_s = bytes[k] as f64 / per_set[k] / 1e9;
                    rows.push(ScanRow {
                        shape: shape.name,
                        tokens,
                        kernel,
                        bits: (kernel != "f16").then_some(bits),
                        seconds: per_set[k],
                        ratio_vs_f16: per_set[0] / per_set[k],
                        bytes_read: bytes[k],
                        gb_per_s,
                        bandwidth_fraction: gb_per_s / bandwidth,
                    });
                }
            }
        }
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    let body: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.shape.to_string(),
                r.tokens.to_string(),
                r.kernel.to_string(),
                r.bits.map_or("-".into(), |b| b.to_string()),
                format!("{:.3}", r.seconds * 1e3),
                format!("{:.2}", r.ratio_vs_f16),
                format!("{:.2}", r.bytes_read as f64 / 1e6),
                format!("{:.1}", r.gb_per_s),
                format!("{:.0}%", 100.0 * r.bandwidth_fraction),
            ]
        })
        .collect();
    println!(
        "key scoring only, one thread on {}, a GQA group's heads, {} key sets round-robin, median of {} rounds",
        isa.name(),
        args.copies,
        args.repeats
    );
    println!(
        "{}",
        table(
            &[
                "shape", "tokens", "kernel", "bits", "ms", "x f16", "MB read", "GB/s", "of bw"
            ],
            &body
        )
    );
    println!("streaming read (sum of a 512 MiB f32 array, 1 thread): {bandwidth:.1} GB/s");
    Ok(())
}
