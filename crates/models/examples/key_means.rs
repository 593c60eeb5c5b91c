//! Research probe: how much of SmolLM2's key and value energy each choice of mean removes.
//!
//! ```text
//! cargo run --release -p tq-models --example key_means -- MODEL.gguf TEXT [TOKENS=2048]
//! ```
//!
//! Per stream kind, the share `Σ‖x − μ‖² / Σ‖x‖²` over all layers, KV heads and tokens for:
//! the first chunk's mean (256 tokens, `center = "first-chunk"`), the in-sample mean of all
//! tokens, per-block means (each block its own), per-block means of the block before (what a
//! decode could use), the mean of all tokens before the block, and for keys the RoPE-aware
//! mean `R(t)·m` (`m` the mean of the un-rotated keys of the first chunk, or of all), turned
//! per token or to the middle of each block (`R(φ)·m`, the planes limited by their speed or
//! chosen on the first chunk: what `center = "rope"` does, `tq_cache::rope_center`, with
//! blocks of 16). Printed as dB (10·log10 of the share); the figures in docs/results.md
//! ("RoPE-aware key centering") come from it.
mod common;

use tq_models::llama::Llama;

/// Prefix sums per KV head: `p[h][t·d + i] = Σ_{u<t} x[u][h][i]` (of `x` turned by `f` first).
fn prefix(
    x: &[f32],
    heads: usize,
    d: usize,
    f: &dyn Fn(&[f64], usize) -> Vec<f64>,
) -> Vec<Vec<f64>> {
    let n = x.len() / (heads * d);
    (0..heads)
        .map(|h| {
            let mut p = vec![0.0; (n + 1) * d];
            for t in 0..n {
                let row: Vec<f64> = x[(t * heads + h) * d..(t * heads + h + 1) * d]
                    .iter()
                    .map(|&v| f64::from(v))
                    .collect();
                let row = f(&row, t);
                for i in 0..d {
                    p[(t + 1) * d + i] = p[t * d + i] + row[i];
                }
            }
            p
        })
        .collect()
}

fn mean(p: &[f64], d: usize, from: usize, to: usize) -> Vec<f64> {
    (0..d)
        .map(|i| (p[to * d + i] - p[from * d + i]) / (to - from) as f64)
        .collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let model = Llama::load(&args[1])?;
    let text = std::fs::read_to_string(&args[2])?;
    let n: usize = args.get(3).map_or(2048, |s| s.parse().unwrap());
    let rec = common::record(&model, &text, n)?;
    let c = &model.config;
    let (hk, d) = (c.kv_heads, c.head_dim);
    let n = rec.k[0].len() / (hk * d);
    let theta: Vec<f64> = (0..d / 2)
        .map(|p| f64::from(c.rope_base).powf(-2.0 * p as f64 / c.rope_dims as f64))
        .collect();
    let rotate = |v: &[f64], t: usize, sign: f64| -> Vec<f64> {
        let mut out = vec![0.0; d];
        for p in 0..d / 2 {
            let (s, co) = (sign * theta[p] * t as f64).sin_cos();
            out[2 * p] = v[2 * p] * co - v[2 * p + 1] * s;
            out[2 * p + 1] = v[2 * p] * s + v[2 * p + 1] * co;
        }
        out
    };
    for (kind, xs) in [("keys", &rec.k), ("values", &rec.v)] {
        let mut rows: Vec<(String, f64)> = Vec::new();
        let plain: Vec<Vec<Vec<f64>>> = xs
            .iter()
            .map(|x| prefix(x, hk, d, &|r, _| r.to_vec()))
            .collect();
        let unrotated: Vec<Vec<Vec<f64>>> = if kind == "keys" {
            xs.iter()
                .map(|x| prefix(x, hk, d, &|r, t| rotate(r, t, -1.0)))
                .collect()
        } else {
            Vec::new()
        };
        let mut add = |name: String, f: &dyn Fn(usize, usize, usize) -> Vec<f64>| {
            let (mut num, mut den) = (0.0, 0.0);
            for (layer, x) in xs.iter().enumerate() {
                for h in 0..hk {
                    for t in 0..n {
                        let mu = f(layer, h, t);
                        for i in 0..d {
                            let v = f64::from(x[(t * hk + h) * d + i]);
                            num += (v - mu[i]).powi(2);
                            den += v * v;
                        }
                    }
                }
            }
            rows.push((name, num / den));
        };
        add("none".into(), &|_, _, _| vec![0.0; d]);
        add("first chunk (256)".into(), &|l, h, _| {
            mean(&plain[l][h], d, 0, 256.min(n))
        });
        add("in-sample, all tokens".into(), &|l, h, _| {
            mean(&plain[l][h], d, 0, n)
        });
        for b in [32usize, 64, 128, 256, 512] {
            add(format!("own block of {b}"), &|l, h, t| {
                let s = t / b * b;
                mean(&plain[l][h], d, s, (s + b).min(n))
            });
            add(format!("block of {b} before (first: own)"), &|l, h, t| {
                let s = (t / b * b).saturating_sub(b);
                mean(&plain[l][h], d, s, (s + b).min(n))
            });
            add(
                format!("all tokens before the block (first: own) {b}"),
                &|l, h, t| {
                    let s = t / b * b;
                    if s == 0 {
                        mean(&plain[l][h], d, 0, b.min(n))
                    } else {
                        mean(&plain[l][h], d, 0, s)
                    }
                },
            );
        }
        if kind == "keys" {
            for (name, fit) in [
                ("RoPE-aware, first chunk", 256.min(n)),
                ("RoPE-aware, all", n),
            ] {
                add(name.into(), &|l, h, t| {
                    rotate(&mean(&unrotated[l][h], d, 0, fit), t, 1.0)
                });
            }
            for b in [16usize, 32, 64] {
                for limit in [0.25f64, 0.5, 1.0, 100.0] {
                    add(
                        format!("RoPE at block centers of {b}, θ·{b}/2 < {limit}"),
                        &|l, h, t| {
                            let mut m = mean(&unrotated[l][h], d, 0, 256.min(n));
                            for p in 0..d / 2 {
                                if theta[p] * b as f64 / 2.0 >= limit {
                                    m[2 * p] = 0.0;
                                    m[2 * p + 1] = 0.0;
                                }
                            }
                            rotate(&m, t / b * b + b / 2, 1.0)
                        },
                    );
                }
            }
            for b in [16usize, 32] {
                add(
                    format!("RoPE at block centers of {b}, planes chosen on the first chunk"),
                    &|l, h, t| {
                        let fit = 256.min(n);
                        let mut m = mean(&unrotated[l][h], d, 0, fit);
                        let x = &xs[l];
                        for p in 0..d / 2 {
                            let (mut with, mut without) = (0.0, 0.0);
                            for u in 0..fit {
                                let c = u / b * b + b / 2;
                                let (s, co) = (theta[p] * c as f64).sin_cos();
                                let (m0, m1) = (m[2 * p], m[2 * p + 1]);
                                let (c0, c1) = (m0 * co - m1 * s, m0 * s + m1 * co);
                                let k0 = f64::from(x[(u * hk + h) * d + 2 * p]);
                                let k1 = f64::from(x[(u * hk + h) * d + 2 * p + 1]);
                                with += (k0 - c0).powi(2) + (k1 - c1).powi(2);
                                without += k0 * k0 + k1 * k1;
                            }
                            if with >= without {
                                m[2 * p] = 0.0;
                                m[2 * p + 1] = 0.0;
                            }
                        }
                        rotate(&m, t / b * b + b / 2, 1.0)
                    },
                );
            }
            add("RoPE exact, first chunk, θ < 1/16".into(), &|l, h, t| {
                let mut m = mean(&unrotated[l][h], d, 0, 256.min(n));
                for p in 0..d / 2 {
                    if theta[p] >= 1.0 / 16.0 {
                        m[2 * p] = 0.0;
                        m[2 * p + 1] = 0.0;
                    }
                }
                rotate(&m, t, 1.0)
            });
            add("RoPE-aware, own block of 256".into(), &|l, h, t| {
                let s = t / 256 * 256;
                rotate(&mean(&unrotated[l][h], d, s, (s + 256).min(n)), t, 1.0)
            });
        }
        println!("{kind} ({n} tokens, {} layers x {hk} KV heads):", xs.len());
        for (name, r) in &rows {
            println!("  {name:44} {:+6.2} dB", 10.0 * r.log10());
        }
    }
    Ok(())
}
