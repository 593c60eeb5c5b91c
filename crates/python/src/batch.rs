//! Batch loops over the Rust API, with no Python in them.
//!
//! Every function here takes row-major `[n, d]` slices and caller-owned outputs, and calls the
//! library crates' per-vector API (`encode_into`, `decode_into`, `inner_product`, ...) once per
//! row — nothing is re-implemented, so a row's result is the Rust API's bit for bit. Rows are
//! split into fixed chunks of [`CHUNK`] vectors run on rayon; each vector's result depends on
//! that vector alone, so neither the chunking nor the thread count can change a bit.
//!
//! The Python classes call these with slices borrowed from numpy arrays, with the GIL
//! released; `_bench_rust_encode` and the Rust tests call them directly, so the benchmark's
//! "Rust API" side and the Python side run the same code.

use std::fmt;

use half::f16;
use rayon::prelude::*;
use tq_cache::codec::{CodecScratch, DebiasedMse, MseCode, PreparedQuery, ProdCode, TqMse, TqProd};
use tq_lloyd_max::LloydMaxCodebook;
use tq_qjl::QjlSketch;

/// Vectors per rayon task: large enough that a task (and its scratch buffers) costs far more
/// than scheduling it, small enough that 4096 vectors still spread over every core.
pub const CHUNK: usize = 64;

/// A batch operation failed: a buffer of the wrong length, or the Rust API rejected one row
/// (the message then starts with `row {i}:`, the first failing row).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchError(pub String);

impl fmt::Display for BatchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BatchError {}

fn row_error(row: usize, error: impl fmt::Display) -> BatchError {
    BatchError(format!("row {row}: {error}"))
}

/// Checks that `buffer` holds `rows · width` elements.
fn check_len(what: &str, len: usize, rows: usize, width: usize) -> Result<(), BatchError> {
    match rows.checked_mul(width) {
        Some(expected) if expected == len => Ok(()),
        _ => Err(BatchError(format!(
            "{what}: expected {rows} × {width} elements, got {len}"
        ))),
    }
}

/// The number of `width`-element rows in `data` (an error if `width` is 0 or does not divide).
fn rows_of(what: &str, data: &[f32], width: usize) -> Result<usize, BatchError> {
    if width == 0 || !data.len().is_multiple_of(width) {
        return Err(BatchError(format!(
            "{what}: length {} is not a multiple of the dimension {width}",
            data.len()
        )));
    }
    Ok(data.len() / width)
}

/// Keeps the first (lowest-chunk) error: rayon's `reduce` combines in order.
fn first_error(a: Result<(), BatchError>, b: Result<(), BatchError>) -> Result<(), BatchError> {
    a.and(b)
}

/// TQ_mse encode of every row of `x` (`[n, d]`) into `words` (`[n, words_per_vector]`) and
/// `norms` (`[n]`), in parallel; each row is [`TqMse::encode_into`].
pub fn mse_encode(
    codec: &TqMse,
    x: &[f32],
    words: &mut [u32],
    norms: &mut [f16],
) -> Result<(), BatchError> {
    let (d, w) = (codec.dim(), codec.words_per_vector());
    let n = rows_of("input", x, d)?;
    check_len("words", words.len(), n, w)?;
    check_len("norms", norms.len(), n, 1)?;
    x.par_chunks(CHUNK * d)
        .zip(words.par_chunks_mut(CHUNK * w))
        .zip(norms.par_chunks_mut(CHUNK))
        .enumerate()
        .map(|(chunk, ((xs, ws), ns))| {
            let mut scratch = CodecScratch::new(d);
            for (i, ((x, w), norm)) in xs
                .chunks_exact(d)
                .zip(ws.chunks_exact_mut(w))
                .zip(ns.iter_mut())
                .enumerate()
            {
                *norm = codec
                    .encode_into(x, &mut scratch, w)
                    .map_err(|e| row_error(chunk * CHUNK + i, e))?;
            }
            Ok(())
        })
        .reduce(|| Ok(()), first_error)
}

/// [`mse_encode`] on the calling thread only: the plain Rust-API loop (one scratch, one
/// `encode_into` per row), the per-core baseline of the benchmark.
pub fn mse_encode_sequential(
    codec: &TqMse,
    x: &[f32],
    words: &mut [u32],
    norms: &mut [f16],
) -> Result<(), BatchError> {
    let (d, w) = (codec.dim(), codec.words_per_vector());
    let n = rows_of("input", x, d)?;
    check_len("words", words.len(), n, w)?;
    check_len("norms", norms.len(), n, 1)?;
    let mut scratch = CodecScratch::new(d);
    for (i, ((x, w), norm)) in x
        .chunks_exact(d)
        .zip(words.chunks_exact_mut(w))
        .zip(norms.iter_mut())
        .enumerate()
    {
        *norm = codec
            .encode_into(x, &mut scratch, w)
            .map_err(|e| row_error(i, e))?;
    }
    Ok(())
}

/// TQ_mse decode of every row ([`TqMse::decode_into`]) into `out` (`[n, d]`).
pub fn mse_decode(
    codec: &TqMse,
    words: &[u32],
    norms: &[f16],
    out: &mut [f32],
) -> Result<(), BatchError> {
    let (d, w) = (codec.dim(), codec.words_per_vector());
    let n = norms.len();
    check_len("words", words.len(), n, w)?;
    check_len("output", out.len(), n, d)?;
    words
        .par_chunks(CHUNK * w)
        .zip(norms.par_chunks(CHUNK))
        .zip(out.par_chunks_mut(CHUNK * d))
        .enumerate()
        .map(|(chunk, ((ws, ns), os))| {
            let mut scratch = CodecScratch::new(d);
            for (i, ((w, &norm), o)) in ws
                .chunks_exact(w)
                .zip(ns)
                .zip(os.chunks_exact_mut(d))
                .enumerate()
            {
                codec
                    .decode_into(w, norm, &mut scratch, o)
                    .map_err(|e| row_error(chunk * CHUNK + i, e))?;
            }
            Ok(())
        })
        .reduce(|| Ok(()), first_error)
}

/// The stored vectors as the owned codes the scoring API takes.
fn mse_codes(words: &[u32], norms: &[f16], w: usize) -> Vec<MseCode> {
    words
        .chunks_exact(w)
        .zip(norms)
        .map(|(words, &norm)| MseCode {
            words: words.to_vec(),
            norm,
        })
        .collect()
}

/// Every query (`[m, d]`) against every stored TQ_mse vector: `out[i·n + j] = ⟨q_i, x̃_j⟩`
/// by [`TqMse::rotate_query`] and [`TqMse::inner_product`], or, with `debiased`, by
/// [`DebiasedMse::inner_product`] (`codec` must then be `debiased.codec()`).
pub fn mse_inner_products(
    codec: &TqMse,
    debiased: Option<&DebiasedMse>,
    queries: &[f32],
    words: &[u32],
    norms: &[f16],
    out: &mut [f32],
) -> Result<(), BatchError> {
    let (d, w) = (codec.dim(), codec.words_per_vector());
    let m = rows_of("queries", queries, d)?;
    let n = norms.len();
    check_len("words", words.len(), n, w)?;
    check_len("output", out.len(), m, n)?;
    if n == 0 {
        return Ok(());
    }
    let codes = mse_codes(words, norms, w);
    queries
        .par_chunks(d)
        .zip(out.par_chunks_mut(n))
        .enumerate()
        .map(|(i, (q, row))| {
            let mut scratch = CodecScratch::new(d);
            let mut rotated = vec![0.0f32; d];
            codec
                .rotate_query(q, &mut rotated)
                .map_err(|e| BatchError(format!("query {i}: {e}")))?;
            for (j, (code, o)) in codes.iter().zip(row.iter_mut()).enumerate() {
                let score = match debiased {
                    Some(estimator) => estimator.inner_product(&rotated, code, &mut scratch),
                    None => codec.inner_product(&rotated, code, &mut scratch),
                };
                *o = score.map_err(|e| row_error(j, e))?;
            }
            Ok(())
        })
        .reduce(|| Ok(()), first_error)
}

/// The outputs of [`prod_encode`], one slice per stored field.
pub struct ProdOutputs<'a> {
    /// `[n, mse words]` packed MSE codes.
    pub words: &'a mut [u32],
    /// `[n]` f16 norms.
    pub norms: &'a mut [f16],
    /// `[n, sign words]` packed QJL signs.
    pub signs: &'a mut [u32],
    /// `[n]` f16 residual norms `γ`.
    pub gammas: &'a mut [f16],
}

/// TQ_prod encode of every row of `x` ([`TqProd::encode_into`]).
pub fn prod_encode(codec: &TqProd, x: &[f32], out: ProdOutputs<'_>) -> Result<(), BatchError> {
    let d = codec.spec().dim;
    let (w, s) = (
        codec.mse().words_per_vector(),
        codec.sign_words_per_vector(),
    );
    let n = rows_of("input", x, d)?;
    check_len("words", out.words.len(), n, w)?;
    check_len("norms", out.norms.len(), n, 1)?;
    check_len("signs", out.signs.len(), n, s)?;
    check_len("gammas", out.gammas.len(), n, 1)?;
    x.par_chunks(CHUNK * d)
        .zip(out.words.par_chunks_mut(CHUNK * w))
        .zip(out.norms.par_chunks_mut(CHUNK))
        .zip(out.signs.par_chunks_mut(CHUNK * s))
        .zip(out.gammas.par_chunks_mut(CHUNK))
        .enumerate()
        .map(|(chunk, ((((xs, ws), ns), ss), gs))| {
            let mut scratch = CodecScratch::new(d);
            let rows = xs
                .chunks_exact(d)
                .zip(ws.chunks_exact_mut(w))
                .zip(ns.iter_mut())
                .zip(ss.chunks_exact_mut(s))
                .zip(gs.iter_mut());
            for (i, ((((x, w), norm), signs), gamma)) in rows.enumerate() {
                (*norm, *gamma) = codec
                    .encode_into(x, &mut scratch, w, signs)
                    .map_err(|e| row_error(chunk * CHUNK + i, e))?;
            }
            Ok(())
        })
        .reduce(|| Ok(()), first_error)
}

/// The stored fields of TQ_prod codes, as read by [`prod_decode`] and
/// [`prod_inner_products`].
#[derive(Clone, Copy)]
pub struct ProdInputs<'a> {
    /// `[n, mse words]` packed MSE codes.
    pub words: &'a [u32],
    /// `[n]` f16 norms.
    pub norms: &'a [f16],
    /// `[n, sign words]` packed QJL signs.
    pub signs: &'a [u32],
    /// `[n]` f16 residual norms `γ`.
    pub gammas: &'a [f16],
}

impl ProdInputs<'_> {
    fn check(&self, codec: &TqProd) -> Result<usize, BatchError> {
        let n = self.norms.len();
        check_len("words", self.words.len(), n, codec.mse().words_per_vector())?;
        check_len("signs", self.signs.len(), n, codec.sign_words_per_vector())?;
        check_len("gammas", self.gammas.len(), n, 1)?;
        Ok(n)
    }
}

/// TQ_prod decode of every row ([`TqProd::decode_into`]) into `out` (`[n, d]`).
pub fn prod_decode(
    codec: &TqProd,
    codes: ProdInputs<'_>,
    out: &mut [f32],
) -> Result<(), BatchError> {
    let d = codec.spec().dim;
    let (w, s) = (
        codec.mse().words_per_vector(),
        codec.sign_words_per_vector(),
    );
    let n = codes.check(codec)?;
    check_len("output", out.len(), n, d)?;
    codes
        .words
        .par_chunks(CHUNK * w)
        .zip(codes.norms.par_chunks(CHUNK))
        .zip(codes.signs.par_chunks(CHUNK * s))
        .zip(codes.gammas.par_chunks(CHUNK))
        .zip(out.par_chunks_mut(CHUNK * d))
        .enumerate()
        .map(|(chunk, ((((ws, ns), ss), gs), os))| {
            let mut scratch = CodecScratch::new(d);
            let rows = ws
                .chunks_exact(w)
                .zip(ns)
                .zip(ss.chunks_exact(s))
                .zip(gs)
                .zip(os.chunks_exact_mut(d));
            for (i, ((((w, &norm), signs), &gamma), o)) in rows.enumerate() {
                codec
                    .decode_into(w, norm, signs, gamma, &mut scratch, o)
                    .map_err(|e| row_error(chunk * CHUNK + i, e))?;
            }
            Ok(())
        })
        .reduce(|| Ok(()), first_error)
}

/// Every query (`[m, d]`) against every stored TQ_prod vector: `out[i·n + j]` is
/// [`TqProd::inner_product`] of [`TqProd::prepare_query`]`(q_i)` and code `j`.
pub fn prod_inner_products(
    codec: &TqProd,
    queries: &[f32],
    codes: ProdInputs<'_>,
    out: &mut [f32],
) -> Result<(), BatchError> {
    let d = codec.spec().dim;
    let (w, s) = (
        codec.mse().words_per_vector(),
        codec.sign_words_per_vector(),
    );
    let m = rows_of("queries", queries, d)?;
    let n = codes.check(codec)?;
    check_len("output", out.len(), m, n)?;
    if n == 0 {
        return Ok(());
    }
    let stored: Vec<ProdCode> = (0..n)
        .map(|j| ProdCode {
            mse: MseCode {
                words: codes.words[j * w..(j + 1) * w].to_vec(),
                norm: codes.norms[j],
            },
            signs: codes.signs[j * s..(j + 1) * s].to_vec(),
            gamma: codes.gammas[j],
        })
        .collect();
    queries
        .par_chunks(d)
        .zip(out.par_chunks_mut(n))
        .enumerate()
        .map(|(i, (q, row))| {
            let prepared: PreparedQuery = codec
                .prepare_query(q)
                .map_err(|e| BatchError(format!("query {i}: {e}")))?;
            for (j, (code, o)) in stored.iter().zip(row.iter_mut()).enumerate() {
                *o = codec
                    .inner_product(&prepared, code)
                    .map_err(|e| row_error(j, e))?;
            }
            Ok(())
        })
        .reduce(|| Ok(()), first_error)
}

/// Codes of every element of `xs` ([`LloydMaxCodebook::quantize_slice`], in chunks).
pub fn quantize(
    codebook: &LloydMaxCodebook,
    xs: &[f32],
    codes: &mut [u8],
) -> Result<(), BatchError> {
    check_len("codes", codes.len(), xs.len(), 1)?;
    xs.par_chunks(CHUNK * 64)
        .zip(codes.par_chunks_mut(CHUNK * 64))
        .map(|(x, c)| {
            codebook
                .quantize_slice(x, c)
                .map_err(|e| BatchError(e.to_string()))
        })
        .reduce(|| Ok(()), first_error)
}

/// QJL encode of every row of `r` (`[n, d]`): packed signs `[n, words]` and `γ` `[n]`
/// ([`QjlSketch::encode`]).
pub fn qjl_encode(
    sketch: &QjlSketch,
    r: &[f32],
    bits: &mut [u32],
    gammas: &mut [f32],
) -> Result<(), BatchError> {
    let (d, w) = (sketch.dim(), sketch.words());
    let n = rows_of("input", r, d)?;
    check_len("bits", bits.len(), n, w)?;
    check_len("gammas", gammas.len(), n, 1)?;
    r.par_chunks(CHUNK * d)
        .zip(bits.par_chunks_mut(CHUNK * w))
        .zip(gammas.par_chunks_mut(CHUNK))
        .enumerate()
        .map(|(chunk, ((rs, bs), gs))| {
            let mut scratch = vec![0.0f32; sketch.rows()];
            for (i, ((r, b), g)) in rs
                .chunks_exact(d)
                .zip(bs.chunks_exact_mut(w))
                .zip(gs.iter_mut())
                .enumerate()
            {
                *g = sketch
                    .encode(r, &mut scratch, b)
                    .map_err(|e| row_error(chunk * CHUNK + i, e))?;
            }
            Ok(())
        })
        .reduce(|| Ok(()), first_error)
}

/// `S·y` for every row of `y` ([`QjlSketch::project`]).
pub fn qjl_project(sketch: &QjlSketch, y: &[f32], out: &mut [f32]) -> Result<(), BatchError> {
    let (d, m) = (sketch.dim(), sketch.rows());
    let n = rows_of("input", y, d)?;
    check_len("output", out.len(), n, m)?;
    y.par_chunks(CHUNK * d)
        .zip(out.par_chunks_mut(CHUNK * m))
        .enumerate()
        .map(|(chunk, (ys, os))| {
            for (i, (y, o)) in ys.chunks_exact(d).zip(os.chunks_exact_mut(m)).enumerate() {
                sketch
                    .project(y, o)
                    .map_err(|e| row_error(chunk * CHUNK + i, e))?;
            }
            Ok(())
        })
        .reduce(|| Ok(()), first_error)
}

/// `r̂ = α·γ·s·Sᵀz` for every row ([`QjlSketch::reconstruct`]).
pub fn qjl_reconstruct(
    sketch: &QjlSketch,
    bits: &[u32],
    gammas: &[f32],
    out: &mut [f32],
) -> Result<(), BatchError> {
    let (d, w) = (sketch.dim(), sketch.words());
    let n = gammas.len();
    check_len("bits", bits.len(), n, w)?;
    check_len("output", out.len(), n, d)?;
    bits.par_chunks(CHUNK * w)
        .zip(gammas.par_chunks(CHUNK))
        .zip(out.par_chunks_mut(CHUNK * d))
        .enumerate()
        .map(|(chunk, ((bs, gs), os))| {
            let mut scratch = vec![0.0f32; sketch.rows()];
            for (i, ((b, &g), o)) in bs
                .chunks_exact(w)
                .zip(gs)
                .zip(os.chunks_exact_mut(d))
                .enumerate()
            {
                sketch
                    .reconstruct(b, g, &mut scratch, o)
                    .map_err(|e| row_error(chunk * CHUNK + i, e))?;
            }
            Ok(())
        })
        .reduce(|| Ok(()), first_error)
}

/// Row-wise estimates `α·γ_i·s·⟨S·y_i, z_i⟩` from projected queries `[n, m]`, signs
/// `[n, words]` and `γ` `[n]` ([`QjlSketch::estimate_inner_product`]).
pub fn qjl_estimate(
    sketch: &QjlSketch,
    projected: &[f32],
    bits: &[u32],
    gammas: &[f32],
    out: &mut [f32],
) -> Result<(), BatchError> {
    let (m, w) = (sketch.rows(), sketch.words());
    let n = gammas.len();
    check_len("projected queries", projected.len(), n, m)?;
    check_len("bits", bits.len(), n, w)?;
    check_len("output", out.len(), n, 1)?;
    for (i, &g) in gammas.iter().enumerate() {
        if !(g.is_finite() && g >= 0.0) {
            return Err(row_error(
                i,
                format!("gamma must be finite and >= 0, got {g}"),
            ));
        }
    }
    projected
        .par_chunks(m)
        .zip(bits.par_chunks(w))
        .zip(gammas.par_iter())
        .zip(out.par_iter_mut())
        .for_each(|(((p, b), &g), o)| *o = sketch.estimate_inner_product(p, b, g));
    Ok(())
}
