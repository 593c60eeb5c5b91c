//! `tq bench codec`: encode and decode throughput of TQ_mse and TQ_prod.

use clap::Args;
use half::f16;
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use rand_distr::{Distribution, StandardNormal};
use rayon::prelude::*;
use serde::Serialize;
use tq_cache::codec::{CodecError, CodecScratch, MseSpec, ProdSpec, TqMse, TqProd};
use tq_rotation::RotationKind;

use super::timing::interleaved_medians;
use crate::output::table;

/// Arguments of `tq bench codec`.
#[derive(Args, Debug)]
pub struct CodecBenchArgs {
    /// Print JSON rows instead of a table.
    #[arg(long)]
    json: bool,
    /// Vectors per timed batch.
    #[arg(long, default_value_t = 16_384)]
    vectors: usize,
    /// Timed rounds per contender (the median is reported).
    #[arg(long, default_value_t = 5)]
    repeats: usize,
}

/// One JSON row of `tq bench codec --json`.
#[derive(Serialize, Debug)]
struct CodecRow {
    dim: usize,
    bits: u8,
    codec: &'static str,
    rotation: &'static str,
    threads: usize,
    encode_vectors_per_s: f64,
    decode_vectors_per_s: f64,
}

/// A codec under test with buffers for a whole batch of encoded vectors.
// One value per benchmark row: the size difference of the variants costs nothing.
#[allow(clippy::large_enum_variant)]
enum Contender {
    Mse(TqMse),
    Prod(TqProd),
}

/// Encoded storage for a batch: one fixed-size record per vector (packed code words, then sign
/// words for TQ_prod) and its two f16 scales, so threads write disjoint chunks.
struct Batch {
    records: Vec<u32>,
    scales: Vec<[f16; 2]>,
    words_per: usize,
    record_len: usize,
}

impl Contender {
    fn batch(&self, n: usize) -> Batch {
        let (words_per, signs_per) = match self {
            Contender::Mse(c) => (c.words_per_vector(), 0),
            Contender::Prod(c) => (c.mse().words_per_vector(), c.sign_words_per_vector()),
        };
        Batch {
            records: vec![0; n * (words_per + signs_per)],
            scales: vec![[f16::ZERO; 2]; n],
            words_per,
            record_len: words_per + signs_per,
        }
    }

    fn encode_one(
        &self,
        x: &[f32],
        scratch: &mut CodecScratch,
        words_per: usize,
        record: &mut [u32],
    ) -> Result<[f16; 2], CodecError> {
        let (words, signs) = record.split_at_mut(words_per);
        match self {
            Contender::Mse(c) => Ok([c.encode_into(x, scratch, words)?, f16::ZERO]),
            Contender::Prod(c) => {
                let (norm, gamma) = c.encode_into(x, scratch, words, signs)?;
                Ok([norm, gamma])
            }
        }
    }

    fn decode_one(
        &self,
        words_per: usize,
        record: &[u32],
        scales: [f16; 2],
        scratch: &mut CodecScratch,
        out: &mut [f32],
    ) -> Result<(), CodecError> {
        let (words, signs) = record.split_at(words_per);
        match self {
            Contender::Mse(c) => c.decode_into(words, scales[0], scratch, out),
            Contender::Prod(c) => c.decode_into(words, scales[0], signs, scales[1], scratch, out),
        }
    }
}

/// Vectors per parallel task. Each vector's code depends only on the vector, so results are
/// bit-identical to the serial run whatever the thread count (checked by `run`).
const BLOCK: usize = 256;

fn encode_block(
    c: &Contender,
    dim: usize,
    xs: &[f32],
    words_per: usize,
    records: &mut [u32],
    scales: &mut [[f16; 2]],
) {
    let mut scratch = CodecScratch::new(dim);
    let record_len = records.len() / scales.len().max(1);
    for ((x, record), scale) in xs
        .chunks_exact(dim)
        .zip(records.chunks_exact_mut(record_len))
        .zip(scales.iter_mut())
    {
        *scale = c
            .encode_one(x, &mut scratch, words_per, record)
            .expect("benchmark inputs are valid");
    }
}

fn encode_serial(c: &Contender, dim: usize, inputs: &[f32], batch: &mut Batch) {
    encode_block(
        c,
        dim,
        inputs,
        batch.words_per,
        &mut batch.records,
        &mut batch.scales,
    );
}

fn encode_parallel(c: &Contender, dim: usize, inputs: &[f32], batch: &mut Batch) {
    let words_per = batch.words_per;
    inputs
        .par_chunks(dim * BLOCK)
        .zip(batch.records.par_chunks_mut(batch.record_len * BLOCK))
        .zip(batch.scales.par_chunks_mut(BLOCK))
        .for_each(|((xs, records), scales)| encode_block(c, dim, xs, words_per, records, scales));
}

fn decode_block(c: &Contender, dim: usize, batch: &Batch, first: usize, out: &mut [f32]) {
    let mut scratch = CodecScratch::new(dim);
    for (i, o) in (first..).zip(out.chunks_exact_mut(dim)) {
        let record = &batch.records[i * batch.record_len..(i + 1) * batch.record_len];
        c.decode_one(batch.words_per, record, batch.scales[i], &mut scratch, o)
            .expect("batch was encoded by this codec");
    }
}

fn decode_parallel(c: &Contender, dim: usize, batch: &Batch, out: &mut [f32]) {
    out.par_chunks_mut(dim * BLOCK)
        .enumerate()
        .for_each(|(block, o)| decode_block(c, dim, batch, block * BLOCK, o));
}

/// Runs `tq bench codec`.
pub fn run(args: &CodecBenchArgs) -> Result<(), Box<dyn std::error::Error>> {
    let threads = rayon::current_num_threads();
    let n = args.vectors.max(256);
    let mut rows = Vec::new();
    for dim in [64usize, 128] {
        let mut rng = ChaCha20Rng::seed_from_u64(dim as u64);
        let inputs: Vec<f32> = (0..n * dim)
            .map(|_| StandardNormal.sample(&mut rng))
            .collect();
        for rotation in [RotationKind::Haar, RotationKind::Hadamard] {
            let contenders = [2u8, 3, 4]
                .map(|b| (b, "mse"))
                .into_iter()
                .chain([3u8, 4, 5].map(|b| (b, "prod")));
            for (bits, name) in contenders {
                let contender = if name == "mse" {
                    let mut spec = MseSpec::new(dim, bits, 1);
                    spec.rotation = rotation;
                    Contender::Mse(TqMse::new(spec)?)
                } else {
                    let mut spec = ProdSpec::orthogonal(dim, bits, 1);
                    spec.rotation = rotation;
                    Contender::Prod(TqProd::new(spec)?)
                };
                let mut serial_batch = contender.batch(n);
                let mut parallel_batch = contender.batch(n);
                let mut decoded_serial = vec![0.0f32; n * dim];
                let mut decoded_parallel = vec![0.0f32; n * dim];
                encode_serial(&contender, dim, &inputs, &mut serial_batch);
                let times = interleaved_medians(
                    args.repeats,
                    &mut [
                        &mut || encode_serial(&contender, dim, &inputs, &mut serial_batch),
                        &mut || encode_parallel(&contender, dim, &inputs, &mut parallel_batch),
                    ],
                );
                if serial_batch.records != parallel_batch.records
                    || serial_batch.scales != parallel_batch.scales
                {
                    return Err("parallel encode differs from serial encode".into());
                }
                let decode_times = interleaved_medians(
                    args.repeats,
                    &mut [
                        &mut || {
                            decode_block(&contender, dim, &serial_batch, 0, &mut decoded_serial)
                        },
                        &mut || {
                            decode_parallel(&contender, dim, &serial_batch, &mut decoded_parallel)
                        },
                    ],
                );
                if decoded_serial != decoded_parallel {
                    return Err("parallel decode differs from serial decode".into());
                }
                let rotation_name = match rotation {
                    RotationKind::Haar => "haar",
                    RotationKind::Hadamard => "hadamard",
                };
                for (i, t) in [1usize, threads].into_iter().enumerate() {
                    rows.push(CodecRow {
                        dim,
                        bits,
                        codec: name,
                        rotation: rotation_name,
                        threads: t,
                        encode_vectors_per_s: n as f64 / times[i],
                        decode_vectors_per_s: n as f64 / decode_times[i],
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
                r.dim.to_string(),
                r.bits.to_string(),
                r.codec.to_string(),
                r.rotation.to_string(),
                r.threads.to_string(),
                format!("{:.3}", r.encode_vectors_per_s / 1e6),
                format!("{:.3}", r.decode_vectors_per_s / 1e6),
            ]
        })
        .collect();
    println!(
        "{}",
        table(
            &[
                "dim",
                "bits",
                "codec",
                "rotation",
                "threads",
                "encode Mvec/s",
                "decode Mvec/s"
            ],
            &body
        )
    );
    if let Some(row) = rows.iter().find(|r| {
        r.dim == 128
            && r.bits == 4
            && r.codec == "mse"
            && r.rotation == "hadamard"
            && r.threads == 1
    }) {
        println!(
            "\ntarget: encode d=128 b=4 hadamard on one core >= 2.0 M vectors/s; measured {:.2} M vectors/s ({:.0} ns/vector)",
            row.encode_vectors_per_s / 1e6,
            1e9 / row.encode_vectors_per_s
        );
    }
    Ok(())
}
