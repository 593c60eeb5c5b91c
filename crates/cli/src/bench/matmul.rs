//! `tq bench matmul`: the weight products of a real model, as stored in its GGUF file — every
//! matrix of block `--layer`, or with `--layer all` every block's and the output head (what a
//! decode step streams from memory) — against `--tokens` activation rows (1: a decode step's
//! matrix–vector products; 256 or 512: a prefill chunk), on each instruction set this CPU runs,
//! timed side by side (interleaved rounds, medians), with a plain read of the same bytes
//! (`read`) as the memory-bandwidth yardstick.
//!
//! Every instruction set gives the same bits (the quantized-matrix tests check it), so the rows
//! differ in time only. The products run in the default summation order (`Q8Order::BlockLanes`):
//! at one token `avx2` and `avx512` run the same 256-bit matrix–vector kernels, so their rows
//! differ by the machine's noise alone — a check of the bench itself; at several tokens
//! `avx512` runs the VNNI matrix products where the CPU has VNNI, `avx2` the AVX2 ones
//! (docs/results.md, "Prefill as matrix products"). It is the bench to show what a new kernel
//! buys. One block fits in the caches, the whole
//! model does not: a kernel change that shows on one block may not show on `--layer all`, and
//! a memory-side change (the kernels' software prefetch) shows only there.

use clap::Args;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};
use serde::Serialize;
use tq_models::fetch::ModelSpec;
use tq_models::gguf::Gguf;
use tq_models::quant::{Isa, MatvecScratch, QuantError, QuantKind, QuantMatrix};

use super::timing::interleaved_medians;
use crate::commands::model::model_path;
use crate::output::table;

/// Arguments of `tq bench matmul`.
#[derive(Args, Debug)]
pub struct MatmulBenchArgs {
    /// Print JSON rows instead of a table.
    #[arg(long)]
    json: bool,
    /// Activation rows per product, comma separated (1 = decode, a prefill chunk otherwise).
    #[arg(long, value_delimiter = ',', default_value = "1,256")]
    tokens: Vec<usize>,
    /// Threads of the pool the products run on.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Timed rounds per instruction set (the median is reported).
    #[arg(long, default_value_t = 7)]
    repeats: usize,
    /// The block whose matrices are multiplied, or `all`: every block's and the output head
    /// (the token embedding where the model ties them), each once, as a decode step streams
    /// them.
    #[arg(long, default_value = "0")]
    layer: LayerChoice,
    /// The model: `smollm2` (the reference model, the default), `gemma3-270m` (fetched on
    /// first use) or a .gguf file.
    #[arg(long)]
    model: Option<ModelSpec>,
}

/// Which weights `tq bench matmul` multiplies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LayerChoice {
    /// One block's matrices.
    Block(usize),
    /// Every block's matrices and the output head.
    All,
}

impl std::str::FromStr for LayerChoice {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "all" => Ok(LayerChoice::All),
            n => n
                .parse()
                .map(LayerChoice::Block)
                .map_err(|_| format!("`{n}` is neither a block index nor `all`")),
        }
    }
}

impl std::fmt::Display for LayerChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LayerChoice::Block(n) => write!(f, "block {n}"),
            LayerChoice::All => f.write_str("every block and the output head"),
        }
    }
}

/// One row of `tq bench matmul --json` (an array of them).
#[derive(Serialize, Debug)]
struct MatmulRow {
    tokens: usize,
    /// The instruction set, or `read` for a plain read of the weight bytes (no products).
    isa: &'static str,
    threads: usize,
    seconds: f64,
    /// Activation rows per second (none for `read`).
    tokens_per_s: Option<f64>,
    /// Multiply-adds per second (weights × tokens / time), in billions.
    gmacs: f64,
    /// Weight bytes per second as a tile of 8 activation rows reads them (bytes × ⌈tokens / 8⌉
    /// / time), in GB/s: what the llama.cpp-order tile streams; the default order's matrix
    /// products read each weight row once per product, so for them it is an upper bound.
    weight_gbs: f64,
    /// This row's speed over the AVX2 row's.
    vs_avx2: Option<f64>,
}

/// The matrices `layer` names: `(name, matrix)` for every two-dimensional weight of
/// `blk.{layer}.`, or for [`LayerChoice::All`] of every block plus the output head (`output`,
/// or the token embedding where the model ties the two), in file order. The bytes are copied
/// out of the file's map, so every run reads the same memory.
fn block_matrices(
    file: &Gguf,
    layer: LayerChoice,
) -> Result<Vec<(String, QuantMatrix)>, Box<dyn std::error::Error>> {
    let tied = !file.tensors().iter().any(|t| t.name == "output.weight");
    let wanted = |name: &str| match layer {
        LayerChoice::Block(n) => name.starts_with(&format!("blk.{n}.")),
        LayerChoice::All => {
            name.starts_with("blk.")
                || name == "output.weight"
                || (tied && name == "token_embd.weight")
        }
    };
    let mut matrices = Vec::new();
    for info in file.tensors() {
        if !wanted(&info.name) || info.dims.len() != 2 {
            continue;
        }
        let view = file.tensor_data(&info.name)?;
        let kind = QuantKind::from_ggml_type(view.ggml_type().id())?;
        let (cols, rows) = (info.dims[0] as usize, info.dims[1] as usize);
        matrices.push((
            info.name.clone(),
            QuantMatrix::new(kind, rows, cols, view.data.to_vec())?,
        ));
    }
    if matrices.is_empty() {
        return Err(format!("the model has no matrices in {layer}").into());
    }
    Ok(matrices)
}

/// Reads every byte of `bytes` as little-endian words and returns their wrapping sum, so the
/// read cannot be optimized away: the memory-bandwidth yardstick of the products.
fn read_all(bytes: &[u8]) -> u64 {
    let mut lanes = [0u64; 4];
    let mut chunks = bytes.chunks_exact(32);
    for chunk in &mut chunks {
        for (k, lane) in lanes.iter_mut().enumerate() {
            let word: [u8; 8] = chunk[8 * k..8 * k + 8].try_into().expect("8 bytes");
            *lane = lane.wrapping_add(u64::from_le_bytes(word));
        }
    }
    let tail: u64 = chunks.remainder().iter().map(|&b| u64::from(b)).sum();
    lanes.iter().fold(tail, |a, &b| a.wrapping_add(b))
}

/// Runs `tq bench matmul`.
pub fn run(args: &MatmulBenchArgs) -> Result<(), Box<dyn std::error::Error>> {
    if args.tokens.is_empty() || args.tokens.contains(&0) {
        return Err("--tokens needs one or more counts above 0".into());
    }
    let path = model_path(&args.model)?;
    let file = Gguf::open(&path)?;
    let matrices = block_matrices(&file, args.layer)?;
    let kinds: Vec<String> = matrices
        .iter()
        .map(|(name, m)| format!("{name} {} {}×{}", m.kind(), m.rows(), m.cols()))
        .collect();
    if args.layer == LayerChoice::All {
        eprintln!("{}: {} matrices", args.layer, matrices.len());
    } else {
        eprintln!("{}: {}", args.layer, kinds.join(", "));
    }
    let weights: usize = matrices.iter().map(|(_, m)| m.rows() * m.cols()).sum();
    let bytes: usize = matrices.iter().map(|(_, m)| m.storage().len()).sum();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(args.threads)
        .build()?;
    let isas = Isa::available();
    let mut rows = Vec::new();
    for &n in &args.tokens {
        let mut rng = ChaCha8Rng::seed_from_u64(n as u64);
        let widest = matrices.iter().map(|(_, m)| m.cols().max(m.rows())).max();
        let x: Vec<f32> = (0..n * widest.unwrap_or(0))
            .map(|_| StandardNormal.sample(&mut rng))
            .collect();
        // Per instruction set: its scratch, its output and the first error of its runs.
        let mut states: Vec<(MatvecScratch, Vec<f32>, Option<QuantError>)> = isas
            .iter()
            .map(|&isa| {
                let y = vec![0.0; n * widest.unwrap_or(0)];
                (MatvecScratch::with_isa(isa), y, None)
            })
            .collect();
        let mut contenders: Vec<Box<dyn FnMut() + '_>> = states
            .iter_mut()
            .map(|(scratch, y, error)| {
                let (matrices, x, pool) = (&matrices, &x, &pool);
                // One `install` per run: entering the pool wakes its threads, which costs as
                // much as a small matrix-vector product.
                Box::new(move || {
                    pool.install(|| {
                        for (_, m) in matrices {
                            let (input, output) = (&x[..n * m.cols()], &mut y[..n * m.rows()]);
                            if let Err(e) = m.matmul(input, n, output, scratch) {
                                error.get_or_insert(e);
                            }
                        }
                    })
                }) as Box<dyn FnMut() + '_>
            })
            .collect();
        let mut checksum = 0u64;
        {
            let (matrices, checksum) = (&matrices, &mut checksum);
            contenders.push(Box::new(move || {
                for (_, m) in matrices {
                    *checksum = checksum.wrapping_add(read_all(m.storage()));
                }
            }));
        }
        let mut refs: Vec<&mut dyn FnMut()> =
            contenders.iter_mut().map(|c| c.as_mut() as _).collect();
        let seconds = interleaved_medians(args.repeats, &mut refs);
        drop(refs);
        drop(contenders);
        std::hint::black_box(checksum);
        if let Some(e) = states.into_iter().find_map(|(_, _, error)| error) {
            return Err(e.into());
        }
        let avx2 = isas
            .iter()
            .position(|&isa| isa == Isa::Avx2)
            .map(|i| seconds[i]);
        let passes = n.div_ceil(8);
        for (&isa, &s) in isas.iter().zip(&seconds) {
            rows.push(MatmulRow {
                tokens: n,
                isa: isa.name(),
                threads: args.threads,
                seconds: s,
                tokens_per_s: Some(n as f64 / s),
                gmacs: (weights * n) as f64 / s / 1e9,
                weight_gbs: (bytes * passes) as f64 / s / 1e9,
                vs_avx2: avx2.map(|a| a / s),
            });
        }
        // The plain read, once per token count (it does not depend on it).
        let read = seconds[isas.len()];
        rows.push(MatmulRow {
            tokens: n,
            isa: "read",
            threads: 1,
            seconds: read,
            tokens_per_s: None,
            gmacs: 0.0,
            weight_gbs: bytes as f64 / read / 1e9,
            vs_avx2: None,
        });
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    let body: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.tokens.to_string(),
                r.isa.to_string(),
                format!("{:.2}", r.seconds * 1e3),
                r.tokens_per_s.map_or("-".into(), |t| format!("{t:.1}")),
                format!("{:.2}", r.gmacs),
                format!("{:.2}", r.weight_gbs),
                r.vs_avx2.map_or("-".into(), |v| format!("{v:.2}x")),
            ]
        })
        .collect();
    println!(
        "{}",
        table(
            &[
                "tokens",
                "isa",
                "ms",
                "tokens/s",
                "GMAC/s",
                "weight GB/s",
                "vs avx2"
            ],
            &body
        )
    );
    println!(
        "({} thread(s), {} rounds interleaved, medians; {} weights ({} bytes) in {}; `read` reads \
         them once, on one thread)",
        args.threads, args.repeats, weights, bytes, args.layer
    );
    Ok(())
}
