//! `tq bench attention`: one decode step (one query token, all query heads of one layer)
//! against a cache of T tokens, with uncompressed (f32, f16) and TurboQuant caches through the
//! same fused kernel, measured side by side, against this machine's streaming-read bandwidth.
//!
//! Every cache of a shape holds the same random tokens (keys with outlier channels, like real
//! keys); a step at T tokens is the query at position `T − 1`, which sees exactly the first T
//! tokens. Configurations of one (shape, T) run interleaved in rounds and report medians.
//! Small caches stay in the CPU caches across repeats (a real model's other layers would evict
//! them), so the bandwidth figures mean most at T ≥ 16K.
//!
//! `--backend wgpu` prints the same table from the GPU kernels of `tq-attention-wgpu` (see
//! `attention/gpu.rs`): the same caches, uploaded once, and one more column, the GPU output's
//! difference from the CPU kernel's on the same records.

use clap::Args;
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use rand_distr::{Distribution, StandardNormal};
use rayon::prelude::*;
use serde::Serialize;
use tq_cache::CodecSpec;
use tq_cache::allocation::Allocation;
use tq_cache::attention::AttentionShape;
use tq_cache::attention::simd::{Isa, fused_attention_on};
use tq_cache::kv_cache::{KvCache, KvKind, KvLayout};
use tq_cache::stream::{Stream, TokenSource};
use tq_cache::token_store::Growth;

use super::timing::interleaved_medians;
use crate::output::table;

mod gpu;

/// Where the benchmark runs attention.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Backend {
    /// The cache crate's fused kernel on the CPU.
    Cpu,
    /// The WGSL kernels through wgpu on the first adapter found (on a software adapter such as
    /// lavapipe: a correctness run, not a speed figure).
    Wgpu,
}

/// Arguments of `tq bench attention`.
#[derive(Args, Debug)]
pub struct AttentionBenchArgs {
    /// Print JSON rows instead of a table.
    #[arg(long)]
    json: bool,
    /// Cached tokens T of the decode steps (comma separated). Default 1024,4096,16384,65536;
    /// with `--backend wgpu` 1024..131072 on a GPU and 256,1024 on a software adapter.
    #[arg(long, value_delimiter = ',')]
    tokens: Option<Vec<usize>>,
    /// Timed rounds per configuration (the median is reported).
    #[arg(long, default_value_t = 21)]
    repeats: usize,
    /// Shapes to run (comma separated): `smollm2` (9 query heads, 3 KV heads, d = 64) and/or
    /// `d128` (32 query heads, 8 KV heads, d = 128).
    #[arg(long, value_delimiter = ',', default_value = "smollm2,d128")]
    shapes: Vec<String>,
    /// Configurations to run (comma separated; f16 is always run, as the ratio's baseline):
    /// f32, f16, k5v4, mse-k4v4, tq3.5.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "f32,f16,k5v4,mse-k4v4,tq3.5"
    )]
    configs: Vec<String>,
    /// Instruction set of the kernel (`scalar`, `avx2`, `avx512`, `neon`); default: the best
    /// available (or `TQ_SIMD`).
    #[arg(long)]
    isa: Option<String>,
    /// Attention backend: `cpu` (the fused kernel) or `wgpu` (the GPU kernels).
    #[arg(long, value_enum, default_value_t = Backend::Cpu)]
    backend: Backend,
    /// The device's memory bandwidth in GB/s, for the "of bw" column of `--backend wgpu`
    /// (H200: 4800); the CPU backend measures its own.
    #[arg(long)]
    bandwidth_gbs: Option<f64>,
}

/// One JSON row of `tq bench attention --json`.
#[derive(Serialize, Debug, Clone)]
struct AttentionRow {
    shape: String,
    tokens: usize,
    config: String,
    /// Median seconds per decode step (`null` when the configuration is not available).
    seconds: Option<f64>,
    /// f16 seconds / this configuration's seconds, same run.
    ratio_vs_f16: Option<f64>,
    /// Cache bytes the step reads (records and scales of every visible token of every KV
    /// head), by formula.
    bytes_read: Option<u64>,
    /// `bytes_read / seconds / 1e9`.
    gb_per_s: Option<f64>,
    /// `‖out − out_f32‖ / ‖out_f32‖` of the attention output (the f32 cache is the reference).
    rel_error_vs_f32: Option<f64>,
    /// `‖out_gpu − out_cpu‖ / ‖out_cpu‖` on the same records (`--backend wgpu` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    rel_diff_vs_cpu: Option<f64>,
    /// Why the configuration has no figures.
    #[serde(skip_serializing_if = "Option::is_none")]
    note: Option<String>,
}

impl AttentionRow {
    /// A configuration without figures, and why.
    fn unmeasured(shape: &str, tokens: usize, config: &str, note: String) -> Self {
        Self {
            shape: shape.to_string(),
            tokens,
            config: config.to_string(),
            seconds: None,
            ratio_vs_f16: None,
            bytes_read: None,
            gb_per_s: None,
            rel_error_vs_f32: None,
            rel_diff_vs_cpu: None,
            note: Some(note),
        }
    }

    /// Table cells shared by the CPU and GPU tables: shape, tokens, config, ms, × f16, MB
    /// read, GB/s, share of `bandwidth` (`-` when unknown), relative error, then the difference
    /// from the CPU kernel when `vs_cpu`, then the note.
    fn cells(&self, bandwidth: Option<f64>, vs_cpu: bool) -> Vec<String> {
        let opt = |v: Option<f64>, f: &dyn Fn(f64) -> String| v.map_or("-".to_string(), f);
        let mut cells = vec![
            self.shape.clone(),
            self.tokens.to_string(),
            self.config.clone(),
            opt(self.seconds, &|s| format!("{:.3}", s * 1e3)),
            opt(self.ratio_vs_f16, &|x| format!("{x:.2}")),
            self.bytes_read
                .map_or("-".to_string(), |b| format!("{:.2}", b as f64 / 1e6)),
            opt(self.gb_per_s, &|x| format!("{x:.1}")),
            match (self.gb_per_s, bandwidth) {
                (Some(x), Some(bw)) => format!("{:.0}%", 100.0 * x / bw),
                _ => "-".to_string(),
            },
            opt(self.rel_error_vs_f32, &|x| format!("{x:.1e}")),
        ];
        if vs_cpu {
            cells.push(opt(self.rel_diff_vs_cpu, &|x| format!("{x:.1e}")));
        }
        cells.push(self.note.clone().unwrap_or_default());
        cells
    }
}

struct BenchShape {
    name: &'static str,
    q_heads: usize,
    kv_heads: usize,
    head_dim: usize,
}

const SHAPES: [BenchShape; 2] = [
    BenchShape {
        name: "smollm2",
        q_heads: 9,
        kv_heads: 3,
        head_dim: 64,
    },
    BenchShape {
        name: "d128",
        q_heads: 32,
        kv_heads: 8,
        head_dim: 128,
    },
];

/// Configurations in table order: uncompressed baselines, then allocation presets.
const CONFIGS: [&str; 5] = ["f32", "f16", "k5v4", "mse-k4v4", "tq3.5"];

/// Tokens per `append` call while filling (the first call calibrates two-tier channels).
const FILL_CHUNK: usize = 8192;

/// Gaussian `[n, width]` data from a seed, in parallel chunks (each with its own derived seed,
/// so the data does not depend on the thread count). With `outliers`, every channel
/// `c ≡ 3 (mod 16)` of each head is scaled by 6, like the loud channels of real keys.
fn random_tokens(n: usize, width: usize, head_dim: usize, seed: u64, outliers: bool) -> Vec<f32> {
    const ROWS: usize = 1024;
    let mut data = vec![0.0f32; n * width];
    data.par_chunks_mut(ROWS * width)
        .enumerate()
        .for_each(|(chunk, rows)| {
            let mut rng =
                ChaCha20Rng::seed_from_u64(seed ^ (chunk as u64).wrapping_mul(0x9E37_79B9));
            for (i, v) in rows.iter_mut().enumerate() {
                let g: f32 = StandardNormal.sample(&mut rng);
                *v = if outliers && i % head_dim % 16 == 3 {
                    6.0 * g
                } else {
                    g
                };
            }
        });
    data
}

fn build(
    config: &str,
    shape: &BenchShape,
    tokens: usize,
    keys: &[f32],
    values: &[f32],
) -> Result<KvCache, Box<dyn std::error::Error>> {
    let layout = KvLayout {
        kv_heads: shape.kv_heads,
        head_dim: shape.head_dim,
        kind: KvKind::Growing {
            growth: Growth::Static { capacity: tokens },
        },
        max_rewind: 0,
        rope_pairs: tq_cache::basis::RopePairs::Adjacent,
    };
    let d = shape.head_dim;
    let mut cache = match config {
        "f32" => KvCache::uniform(layout, CodecSpec::F32 { dim: d }, CodecSpec::F32 { dim: d })?,
        "f16" => KvCache::uniform(layout, CodecSpec::F16 { dim: d }, CodecSpec::F16 { dim: d })?,
        preset => KvCache::with_allocation(layout, &Allocation::preset(preset)?, 0, 1)?,
    };
    let width = shape.kv_heads * d;
    let mut start = 0;
    while start < tokens {
        let end = tokens.min(start + FILL_CHUNK);
        let positions: Vec<u32> = (start as u32..end as u32).collect();
        cache.append(
            &keys[start * width..end * width],
            &values[start * width..end * width],
            &positions,
        )?;
        start = end;
    }
    Ok(cache)
}

/// Bytes of the records and scales a step over `range` reads from one stream.
fn stream_bytes(stream: &Stream, range: std::ops::Range<usize>) -> u64 {
    let body = stream.codec().bytes_per_token() as u64;
    let fp = stream.fp_codec().bytes_per_token() as u64;
    range
        .map(|t| match stream.source(t) {
            TokenSource::Body(_) => body,
            TokenSource::Sink(_) | TokenSource::Recent(_) => fp,
        })
        .sum()
}

fn bytes_read(cache: &KvCache, tokens: usize) -> u64 {
    let range = cache.visible(tokens as u32 - 1);
    (0..cache.layout().kv_heads)
        .map(|g| {
            stream_bytes(cache.keys(g), range.clone())
                + stream_bytes(cache.values(g), range.clone())
        })
        .sum()
}

/// Median seconds to sum a 512 MiB f32 array with every thread (8 lanes per chunk).
fn streaming_read_seconds(repeats: usize) -> (f64, u64) {
    const FLOATS: usize = 128 << 20;
    const CHUNK: usize = 1 << 16;
    let mut data = vec![0.0f32; FLOATS];
    data.par_chunks_mut(CHUNK)
        .enumerate()
        .for_each(|(k, c)| c.fill((k % 7) as f32));
    let mut sums = vec![0.0f32; FLOATS / CHUNK];
    let mut read = || {
        sums.par_iter_mut()
            .zip(data.par_chunks(CHUNK))
            .for_each(|(s, c)| {
                let mut lanes = [0.0f32; 16];
                for x in c.chunks_exact(16) {
                    for (l, v) in lanes.iter_mut().zip(x) {
                        *l += v;
                    }
                }
                *s = lanes.iter().sum();
            });
        std::hint::black_box(&sums);
    };
    let seconds = interleaved_medians(repeats, &mut [&mut read])[0];
    (seconds, (FLOATS * 4) as u64)
}

fn relative_error(out: &[f32], reference: &[f32]) -> f64 {
    let (mut diff, mut norm) = (0.0f64, 0.0f64);
    for (a, b) in out.iter().zip(reference) {
        diff += (f64::from(*a) - f64::from(*b)).powi(2);
        norm += f64::from(*b).powi(2);
    }
    (diff / norm.max(f64::MIN_POSITIVE)).sqrt()
}

/// Sorted, deduplicated, positive token counts (`default` when none were given).
fn token_list(
    tokens: &Option<Vec<usize>>,
    default: &[usize],
) -> Result<Vec<usize>, Box<dyn std::error::Error>> {
    let mut list = tokens.clone().unwrap_or_else(|| default.to_vec());
    list.sort_unstable();
    list.dedup();
    if list.first() == Some(&0) || list.is_empty() {
        return Err("--tokens needs positive token counts".into());
    }
    Ok(list)
}

/// The shapes named by `--shapes`.
fn chosen_shapes(names: &[String]) -> Result<Vec<&'static BenchShape>, Box<dyn std::error::Error>> {
    Ok(names
        .iter()
        .map(|name| {
            SHAPES
                .iter()
                .find(|s| s.name == name)
                .ok_or_else(|| format!("unknown shape `{name}` (smollm2, d128)"))
        })
        .collect::<Result<_, _>>()?)
}

/// Runs `tq bench attention`.
pub fn run(args: &AttentionBenchArgs) -> Result<(), Box<dyn std::error::Error>> {
    if args.backend == Backend::Wgpu {
        return gpu::run(args);
    }
    let isa = match args.isa.as_deref() {
        None => Isa::detect(),
        Some("scalar") => Isa::Scalar,
        Some("avx2") => Isa::Avx2,
        Some("avx512") => Isa::Avx512,
        Some("neon") => Isa::Neon,
        Some(other) => return Err(format!("unknown instruction set `{other}`").into()),
    };
    if !isa.is_available() {
        return Err(format!("this CPU cannot run `{}`", isa.name()).into());
    }
    let tokens_list = token_list(&args.tokens, &[1024, 4096, 16384, 65536])?;
    let max_tokens = *tokens_list.last().unwrap_or(&1);
    let shapes = chosen_shapes(&args.shapes)?;
    if let Some(unknown) = args.configs.iter().find(|c| !CONFIGS.contains(&c.as_str())) {
        return Err(format!("unknown config `{unknown}` ({})", CONFIGS.join(", ")).into());
    }
    let threads = rayon::current_num_threads();
    let (read_seconds, read_bytes) = streaming_read_seconds(args.repeats.clamp(3, 9));
    let bandwidth = read_bytes as f64 / read_seconds / 1e9;
    let mut rows = Vec::new();
    for shape in shapes {
        let width = shape.kv_heads * shape.head_dim;
        let keys = random_tokens(max_tokens, width, shape.head_dim, 11, true);
        let values = random_tokens(max_tokens, width, shape.head_dim, 12, false);
        let caches: Vec<(&str, Result<KvCache, String>)> = CONFIGS
            .iter()
            .filter(|&&c| c == "f16" || args.configs.iter().any(|a| a == c))
            .map(|&c| {
                let cache = build(c, shape, max_tokens, &keys, &values).map_err(|e| e.to_string());
                (c, cache)
            })
            .collect();
        drop((keys, values));
        let queries = random_tokens(1, shape.q_heads * shape.head_dim, shape.head_dim, 13, false);
        let attention = AttentionShape {
            q_heads: shape.q_heads,
            scale: 1.0 / (shape.head_dim as f32).sqrt(),
        };
        for &tokens in &tokens_list {
            let position = [tokens as u32 - 1];
            let ready: Vec<(&str, &KvCache)> = caches
                .iter()
                .filter_map(|(c, cache)| cache.as_ref().ok().map(|k| (*c, k)))
                .collect();
            let mut outputs = vec![vec![0.0f32; queries.len()]; ready.len()];
            let mut closures: Vec<Box<dyn FnMut() + '_>> = ready
                .iter()
                .zip(outputs.iter_mut())
                .map(|(&(_, cache), out)| {
                    let queries = &queries;
                    Box::new(move || {
                        fused_attention_on(isa, cache, queries, &position, attention, out)
                            .expect("benchmark caches and queries are valid");
                    }) as Box<dyn FnMut() + '_>
                })
                .collect();
            let mut refs: Vec<&mut dyn FnMut()> = closures
                .iter_mut()
                .map(|c| &mut **c as &mut dyn FnMut())
                .collect();
            let seconds = interleaved_medians(args.repeats, &mut refs);
            drop(refs);
            drop(closures);
            let f16_seconds = ready
                .iter()
                .position(|(c, _)| *c == "f16")
                .map(|i| seconds[i]);
            let f32_out = ready
                .iter()
                .position(|(c, _)| *c == "f32")
                .map(|i| outputs[i].clone());
            for (config, cache) in &caches {
                let row = match cache {
                    Ok(cache) => {
                        let i = ready
                            .iter()
                            .position(|(c, _)| c == config)
                            .expect("every built cache is timed");
                        let bytes = bytes_read(cache, tokens);
                        AttentionRow {
                            shape: shape.name.to_string(),
                            tokens,
                            config: config.to_string(),
                            seconds: Some(seconds[i]),
                            ratio_vs_f16: f16_seconds.map(|f| f / seconds[i]),
                            bytes_read: Some(bytes),
                            gb_per_s: Some(bytes as f64 / seconds[i] / 1e9),
                            rel_error_vs_f32: f32_out
                                .as_ref()
                                .map(|r| relative_error(&outputs[i], r)),
                            rel_diff_vs_cpu: None,
                            note: None,
                        }
                    }
                    Err(reason) => AttentionRow::unmeasured(
                        shape.name,
                        tokens,
                        config,
                        format!("not yet available: {reason}"),
                    ),
                };
                rows.push(row);
            }
        }
    }
    let check = target_check(&rows, bandwidth);
    if args.json {
        let mut all = rows.clone();
        all.push(AttentionRow {
            shape: "machine".into(),
            tokens: 0,
            config: "stream-read".into(),
            seconds: Some(read_seconds),
            ratio_vs_f16: None,
            bytes_read: Some(read_bytes),
            gb_per_s: Some(bandwidth),
            rel_error_vs_f32: None,
            rel_diff_vs_cpu: None,
            note: Some(format!("sum of a 512 MiB f32 array, {threads} threads")),
        });
        println!("{}", serde_json::to_string_pretty(&all)?);
        eprintln!("{check}");
        return Ok(());
    }
    let body: Vec<Vec<String>> = rows
        .iter()
        .map(|r| r.cells(Some(bandwidth), false))
        .collect();
    println!(
        "decode attention, one query token, fused kernel on {} with {threads} threads, median of {} rounds",
        isa.name(),
        args.repeats
    );
    println!(
        "{}",
        table(
            &[
                "shape", "tokens", "config", "ms", "x f16", "MB read", "GB/s", "of bw", "rel err",
                "note"
            ],
            &body
        )
    );
    println!("streaming read (sum of a 512 MiB f32 array, {threads} threads): {bandwidth:.1} GB/s");
    println!("{check}");
    Ok(())
}

/// The target as a check line, with the measured values (informative, not asserted).
fn target_check(rows: &[AttentionRow], bandwidth: f64) -> String {
    let candidates: Vec<&AttentionRow> = rows
        .iter()
        .filter(|r| r.tokens >= 16_384 && !matches!(r.config.as_str(), "f32" | "f16"))
        .collect();
    if candidates.is_empty() {
        return "target (T ≥ 16K: every TurboQuant config ≥ 1.5× f16 and ≥ 50% of measured \
                bandwidth): no row at T ≥ 16K"
            .to_string();
    }
    let mut met = true;
    let mut details = Vec::new();
    for r in &candidates {
        match (r.ratio_vs_f16, r.gb_per_s) {
            (Some(ratio), Some(gbs)) => {
                let share = gbs / bandwidth;
                met &= ratio >= 1.5 && share >= 0.5;
                details.push(format!(
                    "{} T={} {}: {ratio:.2}× f16, {:.0}% bw",
                    r.shape,
                    r.tokens,
                    r.config,
                    100.0 * share
                ));
            }
            _ => {
                met = false;
                details.push(format!(
                    "{} T={} {}: not available",
                    r.shape, r.tokens, r.config
                ));
            }
        }
    }
    format!(
        "target (T ≥ 16K: every TurboQuant config ≥ 1.5× f16 and ≥ 50% of {bandwidth:.1} GB/s): {} — {}",
        if met { "MET" } else { "NOT MET" },
        details.join("; ")
    )
}
