//! Research probe: how much of the value error's weight falls on each query's newest tokens.
//!
//! ```text
//! cargo run --release -p tq-models --example recent_share -- \
//!     MODEL.gguf /usr/share/common-licenses/GPL-3 [TOKENS=2048] [SINKS=4]
//! ```
//!
//! The attention output's error from independent per-token value errors `e_t` is `Σ_t a_t·e_t`,
//! of expected energy `Σ_t a_t²·E‖e_t‖²`, and a codec's `E‖e_t‖²` is proportional to the
//! stored (centered) vector's energy. So a token's share of the value error is
//! `a_t²·‖v_t − μ‖²`. Runs the first TOKENS tokens (f16 cache, prefill pieces of 256), and for
//! every layer and query head of the second half's queries prints the share of
//! `Σ_t a_t²·‖v_t − μ‖²` (sinks excluded: they are stored exactly) held by the query's own
//! newest R tokens `(p − R, p]`, R = 1, 4, 16, 64: what a full-precision window that moves with
//! each query (as a decode step's does) would take off the value error.

mod common;

use tq_models::llama::Llama;
const WINDOWS: [usize; 4] = [1, 4, 16, 64];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let model = Llama::load(&args[1])?;
    let text = std::fs::read_to_string(&args[2])?;
    let n: usize = args.get(3).map_or(2048, |s| s.parse().unwrap());
    let sinks: usize = args.get(4).map_or(4, |s| s.parse().unwrap());
    let rec = common::record(&model, &text, n)?;
    let c = &model.config;
    let (hq, hk, d) = (c.heads, c.kv_heads, c.head_dim);
    let group = hq / hk;
    let scale = 1.0 / (d as f64).sqrt();
    let mut model_share = [0.0f64; WINDOWS.len()];
    let mut model_total = 0.0f64;
    println!(
        "layer | share of Σ a²·‖v − μ‖² in the newest R tokens, R = {WINDOWS:?} (the layer's heads pooled)"
    );
    for layer in 0..c.layers {
        let (q, k, v) = (&rec.q[layer], &rec.k[layer], &rec.v[layer]);
        // Centered value energy per token and KV head (mean of the first 256, as
        // `center = "first-chunk"`).
        let fit = 256.min(n);
        let mut energy = vec![0.0f64; n * hk];
        for g in 0..hk {
            let mut mean = vec![0.0f64; d];
            for t in 0..fit {
                for (m, &x) in mean
                    .iter_mut()
                    .zip(&v[(t * hk + g) * d..(t * hk + g + 1) * d])
                {
                    *m += f64::from(x) / fit as f64;
                }
            }
            for t in 0..n {
                energy[t * hk + g] = v[(t * hk + g) * d..(t * hk + g + 1) * d]
                    .iter()
                    .zip(&mean)
                    .map(|(&x, m)| (f64::from(x) - m).powi(2))
                    .sum();
            }
        }
        let mut share = [0.0f64; WINDOWS.len()];
        let mut total = 0.0f64;
        let mut scores = vec![0.0f64; n];
        for h in 0..hq {
            let g = h / group;
            for p in n / 2..n {
                let qr = &q[(p * hq + h) * d..(p * hq + h + 1) * d];
                let mut max = f64::MIN;
                for (t, s) in scores[..=p].iter_mut().enumerate() {
                    let kr = &k[(t * hk + g) * d..(t * hk + g + 1) * d];
                    *s = qr
                        .iter()
                        .zip(kr)
                        .map(|(&a, &b)| f64::from(a) * f64::from(b))
                        .sum::<f64>()
                        * scale;
                    max = max.max(*s);
                }
                let z: f64 = scores[..=p].iter().map(|s| (s - max).exp()).sum();
                for t in sinks..=p {
                    let a = (scores[t] - max).exp() / z;
                    let w = a * a * energy[t * hk + g];
                    total += w;
                    for (i, &r) in WINDOWS.iter().enumerate() {
                        if t + r > p {
                            share[i] += w;
                        }
                    }
                }
            }
        }
        print!("{layer:2}   |");
        for s in share {
            print!(" {:5.1}%", 100.0 * s / total);
        }
        println!();
        // Layers weigh equally in the summary (their error scales differ).
        for (m, s) in model_share.iter_mut().zip(share) {
            *m += s / total;
        }
        model_total += 1.0;
    }
    print!("mean |");
    for m in model_share {
        print!(" {:5.1}%", 100.0 * m / model_total);
    }
    println!();
    Ok(())
}
