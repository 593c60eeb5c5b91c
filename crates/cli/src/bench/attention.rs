//! `tq bench attention`: one decode step (one query token, all query heads of one layer)
//! against a cache of T tokens, with uncompressed (f32, f16) and TurboQuant caches through the
//! same fused kernel, measured side by side, against this machine's streaming-read bandwidth.
//!
//! Every cache of a shape holds the same random tokens (keys with outlier channels, like real
//! keys); a step at T tokens is the query at position `T − 1`, which sees exactly the first T
//! tokens. Configurations of one (shape, T) run interleaved in rounds and report medians.
//! Small caches stay in the CPU caches across repeats (a real model's other layers would evict
//! them), so with `--working-set layer` (the default) the bandwidth figures mean most at
//! T ≥ 16K. `--working-set model` times what a decode step does instead: the same attention
//! over one copy of the cache per layer of the model the shape comes from (30 for SmolLM2, 32
//! for the d = 128 shape), round-robin, so each layer's records were evicted by the others'
//! since it was last read — the working set is beyond the last-level cache, and the step reads
//! memory. Its rows report seconds per layer, comparable with the single-layer rows. Every
//! row's `bandwidth_fraction` is its GB/s over the streaming read measured in the same run.
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
use tq_cache::allocation::{Allocation, ModelShape};
use tq_cache::attention::AttentionShape;
use tq_cache::attention::simd::{Isa, fused_attention_on};
use tq_cache::kv_cache::{KvCache, KvKind, KvLayout};
use tq_cache::stream::{Stream, TokenSource};
use tq_cache::token_store::Growth;
use tq_models::limits::cache_bytes_for;

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
    /// `f32`, `f16`, any allocation preset (`rec4.25`, `tq3.5`, ...) or an allocation TOML file
    /// (to time one lever at a time).
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
    /// What a timed step touches (comma separated): `layer` (one layer's cache, step after
    /// step) and/or `model` (round-robin over a copy per layer of the shape's model, a working
    /// set beyond the last-level cache). With `model` the default `--tokens` is 4096,16384.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "layer")]
    working_set: Vec<WorkingSet>,
}

/// What one timed step of `tq bench attention` touches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkingSet {
    /// One layer's cache, attended step after step: up to a few MiB it stays in the CPU's
    /// caches between steps.
    Layer,
    /// A copy of the cache per layer of the shape's model, attended round-robin as a decode
    /// step attends its layers: every layer's records come from memory.
    Model,
}

/// Caches the model working set may hold at once (all configurations of a shape), so a
/// large `--tokens` is refused up front instead of swapping.
const MODEL_SET_CAP_BYTES: u64 = 16 << 30;

/// One JSON row of `tq bench attention --json`.
#[derive(Serialize, Debug, Clone)]
struct AttentionRow {
    shape: String,
    tokens: usize,
    config: String,
    /// `layer` or `model` (`--working-set`; absent on the streaming-read row).
    #[serde(skip_serializing_if = "Option::is_none")]
    working_set: Option<WorkingSet>,
    /// Layers a timed step attends (1 for `layer`); `seconds` and `bytes_read` are per layer.
    #[serde(skip_serializing_if = "Option::is_none")]
    layers: Option<usize>,
    /// Median seconds per decode step (`null` when the configuration is not available).
    seconds: Option<f64>,
    /// f16 seconds / this configuration's seconds, same run.
    ratio_vs_f16: Option<f64>,
    /// Cache bytes the step reads (records and scales of every visible token of every KV
    /// head), by formula.
    bytes_read: Option<u64>,
    /// `bytes_read / seconds / 1e9`.
    gb_per_s: Option<f64>,
    /// `gb_per_s` over the streaming-read bandwidth measured in the same run (`--backend
    /// wgpu`: over `--bandwidth-gbs`; `null` when that is not given).
    bandwidth_fraction: Option<f64>,
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
    fn unmeasured(
        shape: &str,
        tokens: usize,
        config: &str,
        (working_set, layers): (WorkingSet, usize),
        note: String,
    ) -> Self {
        Self {
            shape: shape.to_string(),
            tokens,
            config: config.to_string(),
            working_set: Some(working_set),
            layers: Some(layers),
            seconds: None,
            ratio_vs_f16: None,
            bytes_read: None,
            gb_per_s: None,
            bandwidth_fraction: None,
            rel_error_vs_f32: None,
            rel_diff_vs_cpu: None,
            note: Some(note),
        }
    }

    /// Table cells shared by the CPU and GPU tables: shape, tokens, working set, config, ms, × f16, MB
    /// read, GB/s, share of `bandwidth` (`-` when unknown), relative error, then the difference
    /// from the CPU kernel when `vs_cpu`, then the note.
    fn cells(&self, bandwidth: Option<f64>, vs_cpu: bool) -> Vec<String> {
        let opt = |v: Option<f64>, f: &dyn Fn(f64) -> String| v.map_or("-".to_string(), f);
        let mut cells = vec![
            self.shape.clone(),
            self.tokens.to_string(),
            match (self.working_set, self.layers) {
                (Some(WorkingSet::Layer), _) => "layer".to_string(),
                (Some(WorkingSet::Model), Some(layers)) => format!("model ({layers})"),
                _ => "-".to_string(),
            },
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
    /// Layers of the model the shape comes from (the `--working-set model` round-robin).
    layers: usize,
}

const SHAPES: [BenchShape; 2] = [
    BenchShape {
        name: "smollm2",
        q_heads: 9,
        kv_heads: 3,
        head_dim: 64,
        layers: 30,
    },
    BenchShape {
        name: "d128",
        q_heads: 32,
        kv_heads: 8,
        head_dim: 128,
        // Llama 3 8B's attention: 32 query heads, 8 KV heads, d = 128, 32 layers.
        layers: 32,
    },
];

/// The configurations of `--configs` in table order: the uncompressed baselines (f32 when
/// asked for, f16 always), then the presets and allocation files in the order given, each
/// once; a name that is neither a baseline, a preset nor a readable allocation file is an
/// error.
fn chosen_configs(configs: &[String]) -> Result<Vec<String>, Box<dyn std::error::Error>> {
    let presets: Vec<&str> = Allocation::preset_names().collect();
    for config in configs {
        if matches!(config.as_str(), "f32" | "f16") || presets.contains(&config.as_str()) {
            continue;
        }
        // A file that exists but does not parse says why; anything else is an unknown name.
        if std::path::Path::new(config).is_file() {
            Allocation::load(config.as_str()).map_err(|e| format!("config `{config}`: {e}"))?;
            continue;
        }
        return Err(format!(
            "unknown config `{config}` (f32, f16, an allocation TOML file or a preset: {})",
            presets.join(", ")
        )
        .into());
    }
    let mut chosen: Vec<String> = Vec::new();
    if configs.iter().any(|c| c == "f32") {
        chosen.push("f32".into());
    }
    chosen.push("f16".into());
    for c in configs {
        if !chosen.contains(c) {
            chosen.push(c.clone());
        }
    }
    Ok(chosen)
}

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
        // Llama's base, so `center = "rope"` allocations run (the Gaussian tokens give them
        // a center near zero: what is measured is the correction's cost).
        rope_base: tq_cache::rope_center::RopeBase::new(10_000.0),
    };
    let d = shape.head_dim;
    let mut cache = match config {
        "f32" => KvCache::uniform(layout, CodecSpec::F32 { dim: d }, CodecSpec::F32 { dim: d })?,
        "f16" => KvCache::uniform(layout, CodecSpec::F16 { dim: d }, CodecSpec::F16 { dim: d })?,
        other => KvCache::with_allocation(layout, &Allocation::load(other)?, 0, 1)?,
    };
    let width = shape.kv_heads * d;
    let queries = plane_queries(shape);
    let mut start = 0;
    while start < tokens {
        let end = tokens.min(start + FILL_CHUNK);
        let positions: Vec<u32> = (start as u32..end as u32).collect();
        // The first batch with queries, so a plane-basis stream fits its groups.
        cache.append_with_queries(
            &keys[start * width..end * width],
            &values[start * width..end * width],
            &positions,
            &queries,
            shape.q_heads,
        )?;
        start = end;
    }
    Ok(cache)
}

/// Queries (`[64, q_heads·head_dim]`) whose energy falls geometrically over the RoPE planes
/// (adjacent pairs), 256× from the first plane to the last, as a model's queries concentrate
/// on a few planes: a plane-basis stream (`basis = "planes"`, the recommended presets' keys)
/// fitted with them gives its planes different widths — groups of several widths, the records
/// it holds on a model — where isotropic queries (or none) leave it the plain codec.
fn plane_queries(shape: &BenchShape) -> Vec<f32> {
    let (d, width) = (shape.head_dim, shape.q_heads * shape.head_dim);
    let mut rng = ChaCha20Rng::seed_from_u64(0x51_AE5);
    (0..64 * width)
        .map(|i| {
            let plane = (i % d) / 2;
            let amplitude = 16f32.powf(-(plane as f32) / (d / 2) as f32);
            let g: f32 = StandardNormal.sample(&mut rng);
            amplitude * g
        })
        .collect()
}

/// Bytes of the records and scales a step over `range` reads from one stream.
fn stream_bytes(stream: &Stream, range: std::ops::Range<usize>) -> u64 {
    let body = stream.codec().bytes_per_token() as u64;
    let sink = stream.fp_codec().bytes_per_token() as u64;
    let recent = stream.recent_codec().bytes_per_token() as u64;
    range
        .map(|t| match stream.source(t) {
            TokenSource::Body(_) => body,
            TokenSource::Sink(_) => sink,
            TokenSource::Recent(_) => recent,
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
pub(super) fn streaming_read_seconds(repeats: usize) -> (f64, u64) {
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

/// Refuses a model working set whose caches (every configuration run on `shape`, a copy per
/// layer, `tokens` tokens each, by the cache-size formula) would exceed
/// [`MODEL_SET_CAP_BYTES`], before any data is generated.
fn check_model_set(
    shape: &BenchShape,
    configs: &[String],
    tokens: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let model = ModelShape {
        num_layers: shape.layers,
        num_kv_heads: shape.kv_heads,
        head_dim: shape.head_dim,
    };
    let mut total = 0u64;
    for config in configs {
        let allocation = Allocation::load(if config == "f32" { "f16" } else { config })?;
        let bytes = cache_bytes_for(&allocation, &model, tokens)?;
        total += if config == "f32" { 2 * bytes } else { bytes };
    }
    if total > MODEL_SET_CAP_BYTES {
        return Err(format!(
            "the model working set of `{}` at {tokens} tokens would hold {:.1} GiB of caches \
             ({} layers, every configuration), over the {} GiB this benchmark allows: fewer \
             --tokens or --configs",
            shape.name,
            total as f64 / f64::from(1u32 << 30),
            shape.layers,
            MODEL_SET_CAP_BYTES >> 30
        )
        .into());
    }
    Ok(())
}

/// For each built cache, `layers − 1` more copies of it: each layer of the model working set
/// reads its own memory.
fn layer_copies(caches: &[(&str, Result<KvCache, String>)], layers: usize) -> Vec<Vec<KvCache>> {
    caches
        .iter()
        .map(|(_, c)| match c {
            Ok(cache) => (1..layers).map(|_| cache.clone()).collect(),
            Err(_) => Vec::new(),
        })
        .collect()
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
    let default_tokens: &[usize] = if args.working_set.contains(&WorkingSet::Model) {
        &[4096, 16384]
    } else {
        &[1024, 4096, 16384, 65536]
    };
    let tokens_list = token_list(&args.tokens, default_tokens)?;
    let max_tokens = *tokens_list.last().unwrap_or(&1);
    let shapes = chosen_shapes(&args.shapes)?;
    let configs = chosen_configs(&args.configs)?;
    let mut sets = args.working_set.clone();
    sets.dedup();
    let threads = rayon::current_num_threads();
    let (read_seconds, read_bytes) = streaming_read_seconds(args.repeats.clamp(3, 9));
    let bandwidth = read_bytes as f64 / read_seconds / 1e9;
    let mut rows = Vec::new();
    for shape in shapes {
        if sets.contains(&WorkingSet::Model) {
            check_model_set(shape, &configs, max_tokens)?;
        }
        let width = shape.kv_heads * shape.head_dim;
        let keys = random_tokens(max_tokens, width, shape.head_dim, 11, true);
        let values = random_tokens(max_tokens, width, shape.head_dim, 12, false);
        let caches: Vec<(&str, Result<KvCache, String>)> = configs
            .iter()
            .map(|c| {
                let c = c.as_str();
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
        for &set in &sets {
            let layers = match set {
                WorkingSet::Layer => 1,
                WorkingSet::Model => shape.layers,
            };
            let copies = layer_copies(&caches, layers);
            let ready: Vec<(&str, Vec<&KvCache>)> = caches
                .iter()
                .zip(&copies)
                .filter_map(|((c, cache), extra)| {
                    let first = cache.as_ref().ok()?;
                    Some((*c, std::iter::once(first).chain(extra).collect()))
                })
                .collect();
            for &tokens in &tokens_list {
                let position = [tokens as u32 - 1];
                let mut outputs = vec![vec![0.0f32; queries.len()]; ready.len()];
                let mut closures: Vec<Box<dyn FnMut() + '_>> = ready
                    .iter()
                    .zip(outputs.iter_mut())
                    .map(|((_, layer_caches), out)| {
                        let queries = &queries;
                        Box::new(move || {
                            for cache in layer_caches {
                                fused_attention_on(isa, cache, queries, &position, attention, out)
                                    .expect("benchmark caches and queries are valid");
                            }
                        }) as Box<dyn FnMut() + '_>
                    })
                    .collect();
                let mut refs: Vec<&mut dyn FnMut()> = closures
                    .iter_mut()
                    .map(|c| &mut **c as &mut dyn FnMut())
                    .collect();
                // Seconds per layer: a round attends every layer of the working set once.
                let seconds: Vec<f64> = interleaved_medians(args.repeats, &mut refs)
                    .into_iter()
                    .map(|s| s / layers as f64)
                    .collect();
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
                            let gb_per_s = bytes as f64 / seconds[i] / 1e9;
                            AttentionRow {
                                shape: shape.name.to_string(),
                                tokens,
                                config: config.to_string(),
                                working_set: Some(set),
                                layers: Some(layers),
                                seconds: Some(seconds[i]),
                                ratio_vs_f16: f16_seconds.map(|f| f / seconds[i]),
                                bytes_read: Some(bytes),
                                gb_per_s: Some(gb_per_s),
                                bandwidth_fraction: Some(gb_per_s / bandwidth),
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
                            (set, layers),
                            format!("not yet available: {reason}"),
                        ),
                    };
                    rows.push(row);
                }
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
            working_set: None,
            layers: None,
            seconds: Some(read_seconds),
            ratio_vs_f16: None,
            bytes_read: Some(read_bytes),
            gb_per_s: Some(bandwidth),
            bandwidth_fraction: Some(1.0),
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
                "shape",
                "tokens",
                "working set",
                "config",
                "ms",
                "x f16",
                "MB read",
                "GB/s",
                "of bw",
                "rel err",
                "note"
            ],
            &body
        )
    );
    println!("streaming read (sum of a 512 MiB f32 array, {threads} threads): {bandwidth:.1} GB/s");
    println!("{check}");
    Ok(())
}

/// Ratio to the f16 kernel every TurboQuant configuration should reach at T ≥ 16K.
const TARGET_RATIO: f64 = 2.5;

/// Share of the streaming-read bandwidth every TurboQuant configuration should reach there.
const TARGET_SHARE: f64 = 0.5;

/// The target as a check line, with the measured values (informative, not asserted).
fn target_check(rows: &[AttentionRow], bandwidth: f64) -> String {
    let head = format!(
        "target (T ≥ 16K: every TurboQuant config ≥ {TARGET_RATIO}× f16 and ≥ {:.0}% of {bandwidth:.1} GB/s)",
        100.0 * TARGET_SHARE
    );
    let candidates: Vec<&AttentionRow> = rows
        .iter()
        .filter(|r| r.tokens >= 16_384 && !matches!(r.config.as_str(), "f32" | "f16"))
        .collect();
    if candidates.is_empty() {
        return format!("{head}: no row at T ≥ 16K");
    }
    let mut met = true;
    let mut details = Vec::new();
    for r in &candidates {
        let set = match r.working_set {
            Some(WorkingSet::Model) => "model",
            _ => "layer",
        };
        match (r.ratio_vs_f16, r.gb_per_s) {
            (Some(ratio), Some(gbs)) => {
                let share = gbs / bandwidth;
                met &= ratio >= TARGET_RATIO && share >= TARGET_SHARE;
                details.push(format!(
                    "{} T={} {set} {}: {ratio:.2}× f16, {:.0}% bw",
                    r.shape,
                    r.tokens,
                    r.config,
                    100.0 * share
                ));
            }
            _ => {
                met = false;
                details.push(format!(
                    "{} T={} {set} {}: not available",
                    r.shape, r.tokens, r.config
                ));
            }
        }
    }
    format!(
        "{head}: {} — {}",
        if met { "MET" } else { "NOT MET" },
        details.join("; ")
    )
}
