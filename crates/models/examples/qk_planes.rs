//! Research probe behind the plane basis (`basis = "planes"`): how the energy of SmolLM2's
//! post-RoPE queries and keys splits over the rotary planes, and what bit allocations over
//! them would save in score error against TurboQuant's plain random rotation.
//!
//! ```text
//! CENTER=1 cargo run --release -p tq-models --example qk_planes -- \
//!     MODEL.gguf /usr/share/common-licenses/GPL-3 [TOKENS=2048] [FIT=256] [BITS=5]
//! ```
//!
//! Runs the first TOKENS tokens (f16 cache, prefill pieces of 256) and records every layer's
//! queries and keys; `CENTER=1` centers the keys on the mean of the first 256 (as
//! `center = "first-chunk"` does). Per layer and KV head it prints the predicted score error
//! `Σ_i E[q_i²]·E[e_i²]` (queries of the second half, keys of the whole run) of allocations
//! fitted on the first FIT tokens, in dB against the plain rotation at BITS bits: per-plane bits
//! without the packing rule (`qa-in`, `qa-fit`), then, with the real allocator
//! (`tq_cache::basis::allocate_bits`, rotation inside equal-bit groups), weights `κ·ρ` (what
//! `fit_planes` uses: `grouped`), the keys' `κ` alone and `κ²`, and per-coordinate `κ_i·ρ_i`
//! without planes. The totals (last lines) are the figures quoted in
//! `crates/cache/presets/README.md`. Distortions are the Gaussian Lloyd-Max ones, a model: the
//! KL divergence of `tq perplexity` is the measurement.

/// Lloyd-Max Gaussian distortion over 4^-b, b = 0..=8 (b = 0: the variance itself).
mod common;

use tq_models::llama::Llama;
const C: [f64; 9] = [1.0, 1.4535, 1.8800, 2.2106, 2.4311, 2.56, 2.64, 2.68, 2.70];

fn dist(bits: usize) -> f64 {
    C[bits] * 4f64.powi(-(bits as i32))
}

/// Per plane energies (mean squared norm) of rows [from, to) of `x` = [tokens, heads*d],
/// for head `h`.
fn plane_energy(x: &[f32], heads: usize, d: usize, h: usize, from: usize, to: usize) -> Vec<f64> {
    let mut e = vec![0.0; d / 2];
    for t in from..to {
        let row = &x[(t * heads + h) * d..(t * heads + h + 1) * d];
        for p in 0..d / 2 {
            e[p] += f64::from(row[2 * p]).powi(2) + f64::from(row[2 * p + 1]).powi(2);
        }
    }
    e.iter_mut().for_each(|v| *v /= (to - from) as f64);
    e
}

/// Greedy integer bit allocation over planes minimizing sum w_p * dist(b_p), total 2*sum b_p =
/// budget (bits over the head's d dims). Returns bits per plane.
fn allocate(w: &[f64], budget: usize) -> Vec<usize> {
    let mut b = vec![0usize; w.len()];
    let mut left = budget / 2; // one bit for a plane costs 2 dims
    while left > 0 {
        let (best, _) = w
            .iter()
            .enumerate()
            .filter(|(p, _)| b[*p] < 8)
            .map(|(p, &wp)| (p, wp * (dist(b[p]) - dist(b[p] + 1))))
            .fold((usize::MAX, -1.0), |a, c| if c.1 > a.1 { c } else { a });
        b[best] += 1;
        left -= 1;
    }
    b
}

fn dim_energy(x: &[f32], heads: usize, d: usize, h: usize, from: usize, to: usize) -> Vec<f64> {
    let mut e = vec![0.0; d];
    for t in from..to {
        let row = &x[(t * heads + h) * d..(t * heads + h + 1) * d];
        for i in 0..d {
            e[i] += f64::from(row[i]).powi(2);
        }
    }
    e.iter_mut().for_each(|v| *v /= (to - from) as f64);
    e
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let model = Llama::load(&args[1])?;
    let text = std::fs::read_to_string(&args[2])?;
    let n: usize = args.get(3).map_or(2048, |s| s.parse().unwrap());
    let fit: usize = args.get(4).map_or(256, |s| s.parse().unwrap());
    let bits: usize = args.get(5).map_or(5, |s| s.parse().unwrap());
    let mut rec = common::record(&model, &text, n)?;
    let c = &model.config;
    let (hq, hk, d) = (c.heads, c.kv_heads, c.head_dim);
    let group = hq / hk;
    if std::env::var("CENTER").is_ok() {
        for layer in 0..c.layers {
            let k = &mut rec.k[layer];
            let mut mean = vec![0.0f64; hk * d];
            for t in 0..256 {
                for (m, &v) in mean.iter_mut().zip(&k[t * hk * d..(t + 1) * hk * d]) {
                    *m += f64::from(v) / 256.0;
                }
            }
            for row in k.chunks_exact_mut(hk * d) {
                for (v, m) in row.iter_mut().zip(&mean) {
                    *v -= *m as f32;
                }
            }
        }
    }
    let budget = bits * d;
    println!(
        "layer head | dB: rotate-all vs planes@b (no rotation) vs query-aware planes (in-sample) vs query-aware fitted on first {fit}"
    );
    let (mut tot_rot, mut tot_in, mut tot_fit) = (0.0, 0.0, 0.0);
    let (mut tot_grp_in, mut tot_grp_fit) = (0.0, 0.0);
    let (mut tot_k1, mut tot_k2) = (0.0, 0.0);
    let mut tot_dim = 0.0;
    for layer in 0..c.layers {
        for h in 0..hk {
            // Evaluation: scored queries (second half) and keys (all).
            let ek = plane_energy(&rec.k[layer], hk, d, h, 0, n);
            let mut eq = vec![0.0; d / 2];
            for g in 0..group {
                let e = plane_energy(&rec.q[layer], hq, d, h * group + g, n / 2, n);
                eq.iter_mut()
                    .zip(&e)
                    .for_each(|(a, b)| *a += b / group as f64);
            }
            // Score error per (query, key) pair ~ sum over dims var(q)·err(k).
            let etot: f64 = ek.iter().sum();
            let qtot: f64 = eq.iter().sum();
            let rot = qtot * etot / d as f64 * dist(bits);
            let score = |b: &[usize]| -> f64 {
                ek.iter()
                    .zip(&eq)
                    .zip(b)
                    .map(|((k, q), &bp)| k * q / 2.0 * dist(bp))
                    .sum()
            };
            let plain = score(&vec![bits; d / 2]);
            let w: Vec<f64> = ek.iter().zip(&eq).map(|(k, q)| k * q).collect();
            let b_in = allocate(&w, budget);
            let in_sample = score(&b_in);
            // Fitted: energies of keys and queries of the first `fit` tokens.
            let fk = plane_energy(&rec.k[layer], hk, d, h, 0, fit);
            let mut fq = vec![0.0; d / 2];
            for g in 0..group {
                let e = plane_energy(&rec.q[layer], hq, d, h * group + g, 0, fit);
                fq.iter_mut()
                    .zip(&e)
                    .for_each(|(a, b)| *a += b / group as f64);
            }
            let wf: Vec<f64> = fk.iter().zip(&fq).map(|(k, q)| k * q).collect();
            let b_fit = allocate(&wf, budget);
            let fitted = score(&b_fit);
            // Under the packing constraint (the real allocator): dims sorted by weight.
            let dist_tab = tq_cache::basis::distortion_table(d).unwrap();
            let grouped = |ek: &[f64], eq: &[f64], wk: &[f64], wq: &[f64]| -> f64 {
                let mut dims: Vec<usize> = (0..d).collect();
                let wd = |i: usize| wk[i / 2] * wq[i / 2];
                dims.sort_by(|&a, &b| wd(b).total_cmp(&wd(a)).then(a.cmp(&b)));
                let ws: Vec<f64> = dims.iter().map(|&i| wd(i)).collect();
                let groups = tq_cache::basis::allocate_bits(&ws, bits * d / 32, &dist_tab);
                let mut start = 0;
                let mut total = 0.0;
                for g in &groups {
                    let idx = &dims[start..start + g.len];
                    let mk: f64 = idx.iter().map(|&i| ek[i / 2] / 2.0).sum::<f64>() / g.len as f64;
                    let sq: f64 = idx.iter().map(|&i| eq[i / 2] / 2.0).sum();
                    total += mk * sq * dist_tab[g.bits as usize];
                    start += g.len;
                }
                // Dropped dims: whole key energy there, weighted by the query's.
                for &i in &dims[start..] {
                    total += ek[i / 2] / 2.0 * eq[i / 2] / 2.0;
                }
                total
            };
            let rot_lm = qtot * etot / d as f64 * dist_tab[bits];
            let g_in = grouped(&ek, &eq, &ek, &eq) / rot_lm;
            let g_fit = grouped(&ek, &eq, &fk, &fq) / rot_lm;
            let ones = vec![1.0; d / 2];
            let g_k1 = grouped(&ek, &eq, &fk, &ones) / rot_lm;
            let g_k2 = grouped(&ek, &eq, &fk, &fk) / rot_lm;
            tot_k1 += g_k1 * rot;
            {
                // Per-dim weights E_k,i^2 fitted on the prefix, evaluated with plane energies.
                let fkd = dim_energy(&rec.k[layer], hk, d, h, 0, fit);
                let mut dims: Vec<usize> = (0..d).collect();
                dims.sort_by(|&a, &b| {
                    (fkd[b] * fkd[b])
                        .total_cmp(&(fkd[a] * fkd[a]))
                        .then(a.cmp(&b))
                });
                let fqd = {
                    let mut e = vec![0.0; d];
                    for g in 0..group {
                        let x = dim_energy(&rec.q[layer], hq, d, h * group + g, 0, fit);
                        e.iter_mut()
                            .zip(&x)
                            .for_each(|(a, b)| *a += b / group as f64);
                    }
                    e
                };
                dims.sort_by(|&a, &b| {
                    (fkd[b] * fqd[b])
                        .total_cmp(&(fkd[a] * fqd[a]))
                        .then(a.cmp(&b))
                });
                let ws: Vec<f64> = dims.iter().map(|&i| fkd[i] * fqd[i]).collect();
                let groups = tq_cache::basis::allocate_bits(&ws, bits * d / 32, &dist_tab);
                let ekd = dim_energy(&rec.k[layer], hk, d, h, 0, n);
                let mut eqd = vec![0.0; d];
                for g in 0..group {
                    let e = dim_energy(&rec.q[layer], hq, d, h * group + g, n / 2, n);
                    eqd.iter_mut()
                        .zip(&e)
                        .for_each(|(a, b)| *a += b / group as f64);
                }
                let mut start = 0;
                let mut total = 0.0;
                for g in &groups {
                    let idx = &dims[start..start + g.len];
                    let mk: f64 = idx.iter().map(|&i| ekd[i]).sum::<f64>() / g.len as f64;
                    let sq: f64 = idx.iter().map(|&i| eqd[i]).sum();
                    total += mk * sq * dist_tab[g.bits as usize];
                    start += g.len;
                }
                for &i in &dims[start..] {
                    total += ekd[i] * eqd[i];
                }
                tot_dim += total / rot_lm * rot;
            }
            tot_k2 += g_k2 * rot;
            println!(
                "      grouped: in {:+6.2} dB fit {:+6.2} dB",
                10.0 * g_in.log10(),
                10.0 * g_fit.log10()
            );
            tot_grp_in += g_in * rot;
            tot_grp_fit += g_fit * rot;
            tot_rot += rot;
            tot_in += in_sample;
            tot_fit += fitted;
            let db = |x: f64| 10.0 * (x / rot).log10();
            println!(
                "{layer:2} {h} | rot {rot:9.4e} planes {:+6.2} dB  qa-in {:+6.2} dB  qa-fit {:+6.2} dB  bits {:?}",
                db(plain),
                db(in_sample),
                db(fitted),
                b_fit
            );
        }
    }
    println!(
        "sum: qa-in {:+.2} dB, qa-fit {:+.2} dB",
        10.0 * (tot_in / tot_rot).log10(),
        10.0 * (tot_fit / tot_rot).log10()
    );
    println!(
        "grouped (packing constraint): in {:+.2} dB, fit {:+.2} dB",
        10.0 * (tot_grp_in / tot_rot).log10(),
        10.0 * (tot_grp_fit / tot_rot).log10()
    );
    println!(
        "key-only proxies (fit): w = E_k {:+.2} dB, w = E_k^2 {:+.2} dB",
        10.0 * (tot_k1 / tot_rot).log10(),
        10.0 * (tot_k2 / tot_rot).log10()
    );
    println!(
        "per-dim E_k*E_q (fit, no pairing): {:+.2} dB",
        10.0 * (tot_dim / tot_rot).log10()
    );
    Ok(())
}
