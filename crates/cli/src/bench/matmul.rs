//! `tq bench matmul`: the weight products of one transformer block of a real model — every
//! matrix of block `--layer`, as stored in its GGUF file — against `--tokens` activation rows
//! (1: a decode step's matrix–vector products; 256 or 512: a prefill chunk), on each
//! instruction set this CPU runs, timed side by side (interleaved rounds, medians).
//!
//! Every instruction set gives the same bits (the quantized-matrix tests check it), so the rows
//! differ in time only. `avx2` and `avx512` run the same 256-bit weight kernels today, so their
//! rows differ by the machine's noise alone — a check of the bench itself. It is the bench to
//! show what a new kernel buys: an
//! AVX-512 VNNI tile (`vpdpbusd` for `vpmaddubsw` + `vpmaddwd`) measured 0.99× and 1.11× the
//! AVX2 tile here (docs/results.md) and was not kept.

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
    /// The block whose matrices are multiplied.
    #[arg(long, default_value_t = 0)]
    layer: usize,
    /// The model: `smollm2` (the reference model, the default), `gemma3-270m` (fetched on
    /// first use) or a .gguf file.
    #[arg(long)]
    model: Option<ModelSpec>,
}

/// One row of `tq bench matmul --json` (an array of them).
#[derive(Serialize, Debug)]
struct MatmulRow {
    tokens: usize,
    isa: &'static str,
    threads: usize,
    seconds: f64,
    tokens_per_s: f64,
    /// Multiply-adds per second (weights × tokens / time), in billions.
    gmacs: f64,
    /// This row's speed over the AVX2 row's (the kernels llama.cpp's numerics follow).
    vs_avx2: Option<f64>,
}

/// The block's matrices: `(name, matrix)` for every two-dimensional weight of `blk.{layer}.`.
fn block_matrices(
    file: &Gguf,
    layer: usize,
) -> Result<Vec<(String, QuantMatrix)>, Box<dyn std::error::Error>> {
    let prefix = format!("blk.{layer}.");
    let mut matrices = Vec::new();
    for info in file.tensors() {
        if !info.name.starts_with(&prefix) || info.dims.len() != 2 {
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
        return Err(format!("the model has no matrices in block {layer}").into());
    }
    Ok(matrices)
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
    eprintln!("block {}: {}", args.layer, kinds.join(", "));
    let weights: usize = matrices.iter().map(|(_, m)| m.rows() * m.cols()).sum();
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
        let mut refs: Vec<&mut dyn FnMut()> =
            contenders.iter_mut().map(|c| c.as_mut() as _).collect();
        let seconds = interleaved_medians(args.repeats, &mut refs);
        drop(refs);
        drop(contenders);
        if let Some(e) = states.into_iter().find_map(|(_, _, error)| error) {
            return Err(e.into());
        }
        let avx2 = isas
            .iter()
            .position(|&isa| isa == Isa::Avx2)
            .map(|i| seconds[i]);
        for (&isa, &s) in isas.iter().zip(&seconds) {
            rows.push(MatmulRow {
                tokens: n,
                isa: isa.name(),
                threads: args.threads,
                seconds: s,
                tokens_per_s: n as f64 / s,
                gmacs: (weights * n) as f64 / s / 1e9,
                vs_avx2: avx2.map(|a| a / s),
            });
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
                r.tokens.to_string(),
                r.isa.to_string(),
                format!("{:.2}", r.seconds * 1e3),
                format!("{:.1}", r.tokens_per_s),
                format!("{:.2}", r.gmacs),
                r.vs_avx2.map_or("-".into(), |v| format!("{v:.2}x")),
            ]
        })
        .collect();
    println!(
        "{}",
        table(
            &["tokens", "isa", "ms", "tokens/s", "GMAC/s", "vs avx2"],
            &body
        )
    );
    println!(
        "({} thread(s), {} rounds interleaved, medians; {} weights in block {})",
        args.threads, args.repeats, weights, args.layer
    );
    Ok(())
}
