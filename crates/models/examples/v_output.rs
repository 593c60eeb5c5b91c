//! Research probe: what weighting the value error by the output projection would save.
//!
//! ```text
//! cargo run --release -p tq-models --example v_output -- \
//!     MODEL.gguf /usr/share/common-licenses/GPL-3 [TOKENS=2048] [FIT=256] [BITS=3]
//! ```
//!
//! A value's error `e` reaches the residual stream as `W_h·e` for each query head `h` that reads
//! the KV head, so what the model sees is `Σ_h ‖W_h·e‖² = eᵀ·M·e`, `M = Σ_h W_hᵀ·W_h` (`W_h` the
//! head's `d` columns of the output projection), not `‖e‖²`. `M` is fixed by the weights: its
//! eigenvectors are a basis that does not depend on the data (no drift with the position, values
//! carry no RoPE), and only the value energy along them is estimated from the first FIT tokens.
//!
//! Runs the first TOKENS tokens (f16 cache, prefill pieces of 256), records the values, centers
//! them on the mean of the first 256 (`center = "first-chunk"`) and prints, per layer and KV
//! head and in total, the predicted `E[eᵀ·M·e]` of allocations fitted on the first FIT tokens
//! and evaluated on all TOKENS, in dB against the plain rotation at BITS bits:
//! - `M-basis σ²λ`: the eigenbasis of `M`, bits water-filled (`tq_cache::basis::allocate_bits`,
//!   rotation inside equal-bit groups) on `λ_i·σ_i²`;
//! - `M-basis λ`: the same basis, weights `λ_i` alone (no data);
//! - `PCA σ²`: the PCA of the fitted values, weights `σ_i²` (the existing `basis = "pca"`);
//! - `PCA σ²·λ`: the PCA basis, weights `σ_i²·(u_iᵀ·M·u_i)`.
//!
//! Distortions are the codec's Beta Lloyd-Max ones (`distortion_table`), a model: the KL
//! divergence of `tq perplexity` is the measurement.

mod common;

use nalgebra::{DMatrix, SymmetricEigen};
use tq_cache::basis::{allocate_bits, distortion_table};
use tq_models::llama::Llama;
use tq_models::quant::dequantize_row;

/// Second moment `[d, d]` of rows `[from, to)` of head `h` in `x = [tokens, heads·d]`.
fn moment(x: &[f32], heads: usize, d: usize, h: usize, from: usize, to: usize) -> DMatrix<f64> {
    let mut m = DMatrix::<f64>::zeros(d, d);
    for t in from..to {
        let row = &x[(t * heads + h) * d..(t * heads + h + 1) * d];
        for j in 0..d {
            for i in 0..d {
                m[(i, j)] += f64::from(row[i]) * f64::from(row[j]);
            }
        }
    }
    m / (to - from) as f64
}

/// `uᵀ·A·u` for column `c` of `basis`.
fn along(a: &DMatrix<f64>, basis: &DMatrix<f64>, c: usize) -> f64 {
    let u = basis.column(c);
    (u.transpose() * a * u)[(0, 0)]
}

/// Predicted `E[eᵀ·M·e]` of a basis (columns), its components sorted by `weights` (fitted),
/// with the fitted variances as the group scales and the evaluation moments `c_eval`.
fn weighted_error(
    basis: &DMatrix<f64>,
    weights: &[f64],
    m: &DMatrix<f64>,
    c_eval: &DMatrix<f64>,
    bits: usize,
    dist: &[f64; 9],
) -> f64 {
    let d = basis.ncols();
    let mut order: Vec<usize> = (0..d).collect();
    order.sort_by(|&a, &b| weights[b].total_cmp(&weights[a]).then(a.cmp(&b)));
    let sorted: Vec<f64> = order.iter().map(|&i| weights[i]).collect();
    let groups = allocate_bits(&sorted, bits * d / 32, dist);
    let mut total = 0.0;
    let mut start = 0;
    for g in &groups {
        let idx = &order[start..start + g.len];
        let var = idx.iter().map(|&i| along(c_eval, basis, i)).sum::<f64>() / g.len as f64;
        let lam: f64 = idx.iter().map(|&i| along(m, basis, i)).sum();
        total += var * lam * dist[g.bits as usize];
        start += g.len;
    }
    for &i in &order[start..] {
        total += along(c_eval, basis, i) * along(m, basis, i);
    }
    total
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let model = Llama::load(&args[1])?;
    let text = std::fs::read_to_string(&args[2])?;
    let n: usize = args.get(3).map_or(2048, |s| s.parse().unwrap());
    let fit: usize = args.get(4).map_or(256, |s| s.parse().unwrap());
    let bits: usize = args.get(5).map_or(3, |s| s.parse().unwrap());
    let mut rec = common::record(&model, &text, n)?;
    let c = &model.config;
    let (hq, hk, d) = (c.heads, c.kv_heads, c.head_dim);
    let group = hq / hk;
    let dist = distortion_table(d)?;
    // Totals of the predicted weighted error: plain, M-basis σ²λ, M-basis λ, PCA σ², PCA σ²λ.
    let mut totals = [0.0f64; 5];
    println!(
        "layer head | spread of λ (max/min, AM/GM dB) | dB vs plain: M σ²λ, M λ, PCA σ², PCA σ²λ"
    );
    for layer in 0..c.layers {
        // Center on the first 256 tokens' mean, as `center = "first-chunk"` does.
        let v = &mut rec.v[layer];
        let mut mean = vec![0.0f64; hk * d];
        for t in 0..256.min(n) {
            for (m, &x) in mean.iter_mut().zip(&v[t * hk * d..(t + 1) * hk * d]) {
                *m += f64::from(x) / 256f64.min(n as f64);
            }
        }
        for row in v.chunks_exact_mut(hk * d) {
            for (x, m) in row.iter_mut().zip(&mean) {
                *x -= *m as f32;
            }
        }
        let o = &model.weights.layers[layer].o;
        let q_dim = hq * d;
        let mut wo = vec![0.0f32; o.rows() * q_dim];
        for (r, out) in wo.chunks_exact_mut(q_dim).enumerate() {
            dequantize_row(o.kind(), o.row(r)?, out)?;
        }
        for g in 0..hk {
            let mut m = DMatrix::<f64>::zeros(d, d);
            for h in g * group..(g + 1) * group {
                for row in wo.chunks_exact(q_dim) {
                    let w = &row[h * d..(h + 1) * d];
                    for j in 0..d {
                        for i in 0..d {
                            m[(i, j)] += f64::from(w[i]) * f64::from(w[j]);
                        }
                    }
                }
            }
            let c_fit = moment(v, hk, d, g, 0, fit.min(n));
            let c_eval = moment(v, hk, d, g, 0, n);
            let plain = c_eval.trace() / d as f64 * m.trace() * dist[bits];
            let me = SymmetricEigen::new(m.clone());
            let lam: Vec<f64> = me.eigenvalues.iter().map(|&l| l.max(0.0)).collect();
            let sig: Vec<f64> = (0..d).map(|i| along(&c_fit, &me.eigenvectors, i)).collect();
            let w_sl: Vec<f64> = lam.iter().zip(&sig).map(|(l, s)| l * s).collect();
            let m_sl = weighted_error(&me.eigenvectors, &w_sl, &m, &c_eval, bits, &dist);
            let m_l = weighted_error(&me.eigenvectors, &lam, &m, &c_eval, bits, &dist);
            let pe = SymmetricEigen::new(c_fit.clone());
            let psig: Vec<f64> = pe.eigenvalues.iter().map(|&l| l.max(0.0)).collect();
            let p_s = weighted_error(&pe.eigenvectors, &psig, &m, &c_eval, bits, &dist);
            let w_psl: Vec<f64> = (0..d)
                .map(|i| psig[i] * along(&m, &pe.eigenvectors, i))
                .collect();
            let p_sl = weighted_error(&pe.eigenvectors, &w_psl, &m, &c_eval, bits, &dist);
            let (lmax, lmin) = lam
                .iter()
                .fold((0.0f64, f64::MAX), |(a, b), &l| (a.max(l), b.min(l)));
            let am = lam.iter().sum::<f64>() / d as f64;
            let gm = (lam.iter().map(|l| l.max(1e-30).ln()).sum::<f64>() / d as f64).exp();
            let db = |x: f64| 10.0 * (x / plain).log10();
            println!(
                "{layer:2} {g} | λ {:8.1}× {:5.2} dB | {:+6.2} {:+6.2} {:+6.2} {:+6.2}",
                lmax / lmin.max(1e-30),
                10.0 * (am / gm).log10(),
                db(m_sl),
                db(m_l),
                db(p_s),
                db(p_sl)
            );
            for (t, x) in totals.iter_mut().zip([plain, m_sl, m_l, p_s, p_sl]) {
                *t += x;
            }
        }
    }
    let db = |x: f64| 10.0 * (x / totals[0]).log10();
    println!(
        "total (bits {bits}, fit {fit}, tokens {n}): M σ²λ {:+.2} dB, M λ {:+.2} dB, PCA σ² {:+.2} dB, PCA σ²λ {:+.2} dB",
        db(totals[1]),
        db(totals[2]),
        db(totals[3]),
        db(totals[4])
    );
    Ok(())
}
