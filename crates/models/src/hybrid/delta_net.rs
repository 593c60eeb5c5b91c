//! A gated-DeltaNet layer (the linear-attention half of Qwen3.5-style hybrids) whose memory
//! is two fixed f32 states instead of a growing KV cache:
//!
//! - a causal depthwise convolution over the projected `q|k|v` channels, whose state is the
//!   last `kernel − 1` inputs, `[kernel − 1, channels]`;
//! - the delta-rule recurrence, one `[d_k, d_v]` matrix per head, `[heads, d_k, d_v]`:
//!   `S ← α·S`, `S ← S + k ⊗ β(v − Sᵀk)`, output `o = Sᵀq`, with
//!   `α = exp(−e^{A}·softplus(a + dt))` a learned per-head decay and `β = sigmoid(b)` the
//!   write strength; `q`, `k` are
//!   L2-normalized and `q` scaled by `1/√d_k`, and the output passes a gated RMSNorm
//!   (`rmsnorm(o) ⊙ silu(z)`).
//!
//! Both states are updated token by token in sequence order, so any chunking of a prompt
//! performs the same floating-point operations in the same order as one pass or decode: the
//! results are bit-identical. Neither state can give a token back, which is why
//! [`ModelCache::truncate`] refuses to rewind them.

use rand::Rng;
use rand_chacha::ChaCha20Rng;
use serde::Serialize;
use tq_cache::states::ModelCache;

use super::dense::Dense;
use super::scratch::HybridScratch;
use crate::llama::ModelError;
use crate::llama::ops::rms_norm;

/// Shape of a gated-DeltaNet layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct DeltaNetGeometry {
    /// Heads (each with its own recurrent matrix).
    pub heads: usize,
    /// Key (and query) dimension per head.
    pub key_dim: usize,
    /// Value dimension per head.
    pub value_dim: usize,
    /// Causal convolution width (at least 2: the state keeps `kernel − 1` inputs).
    pub conv_kernel: usize,
}

impl DeltaNetGeometry {
    /// Convolved channels: queries, keys and values of every head.
    pub fn channels(&self) -> usize {
        self.heads * (2 * self.key_dim + self.value_dim)
    }

    /// Shape of the convolution state, `[kernel − 1, channels]`.
    pub fn conv_shape(&self) -> Vec<usize> {
        vec![self.conv_kernel - 1, self.channels()]
    }

    /// Shape of the recurrent state, `[heads, d_k, d_v]`.
    pub fn recurrent_shape(&self) -> Vec<usize> {
        vec![self.heads, self.key_dim, self.value_dim]
    }

    /// Checks the shapes a layer can run with.
    pub fn validate(&self) -> Result<(), ModelError> {
        if self.heads == 0 || self.key_dim == 0 || self.value_dim == 0 || self.conv_kernel < 2 {
            return Err(ModelError::Unsupported(format!(
                "DeltaNet layer {self:?}: heads and dims must be positive and the kernel at least 2"
            )));
        }
        Ok(())
    }
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

fn softplus(x: f32) -> f32 {
    // ln(1 + eˣ) without overflow for large x.
    if x > 20.0 { x } else { x.exp().ln_1p() }
}

fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// Scales `x` to unit L2 norm (ε keeps a zero vector at zero).
fn l2_normalize(x: &mut [f32]) {
    let norm = x.iter().map(|v| v * v).sum::<f32>().sqrt();
    let inv = 1.0 / (norm + 1e-6);
    for v in x {
        *v *= inv;
    }
}

/// One gated-DeltaNet layer and the names of its two fixed states.
#[derive(Clone, Debug)]
pub struct DeltaNetBlock {
    geometry: DeltaNetGeometry,
    conv_state: String,
    recurrent_state: String,
    qkv: Dense,
    /// `[kernel, channels]`, the last row weighs the current input.
    conv: Vec<f32>,
    z: Dense,
    beta: Dense,
    decay: Dense,
    a_log: Vec<f32>,
    dt_bias: Vec<f32>,
    norm: Vec<f32>,
    out: Dense,
    rms_eps: f32,
}

impl DeltaNetBlock {
    /// Random weights; the decay `e^{A}·softplus(·)` is drawn small enough that the state
    /// remembers tens of tokens (so chunking and rewind tests see real history).
    pub fn random(
        geometry: DeltaNetGeometry,
        embedding: usize,
        conv_state: String,
        recurrent_state: String,
        rms_eps: f32,
        rng: &mut ChaCha20Rng,
    ) -> Self {
        let (c, h, vd) = (
            geometry.channels(),
            geometry.heads,
            geometry.heads * geometry.value_dim,
        );
        let qkv = Dense::random(c, embedding, rng);
        // Each channel's taps have fan-in `kernel`.
        let conv = Dense::uniform(
            geometry.conv_kernel,
            c,
            (3.0 / geometry.conv_kernel as f32).sqrt(),
            rng,
        )
        .data()
        .to_vec();
        let z = Dense::random(vd, embedding, rng);
        let beta = Dense::random(h, embedding, rng);
        let decay = Dense::random(h, embedding, rng);
        let a_log = (0..h)
            .map(|_| rng.random_range(0.05f32..0.5).ln())
            .collect();
        let dt_bias = (0..h).map(|_| rng.random_range(-1.0f32..0.0)).collect();
        let out = Dense::random(embedding, vd, rng);
        Self {
            geometry,
            conv_state,
            recurrent_state,
            qkv,
            conv,
            z,
            beta,
            decay,
            a_log,
            dt_bias,
            norm: vec![1.0; geometry.value_dim],
            out,
            rms_eps,
        }
    }

    /// The layer's shape.
    pub fn geometry(&self) -> &DeltaNetGeometry {
        &self.geometry
    }

    /// `out = layer(h)` for the `n` newest tokens (`h` is `[n, embedding]`, normalized),
    /// advancing the conv and recurrent states of `cache` token by token.
    pub fn forward(
        &self,
        h: &[f32],
        n: usize,
        cache: &mut ModelCache,
        s: &mut HybridScratch,
        out: &mut [f32],
    ) -> Result<(), ModelError> {
        let g = &self.geometry;
        let (c, heads, dk, dv) = (g.channels(), g.heads, g.key_dim, g.value_dim);
        s.mixed.resize(n * c, 0.0);
        s.conv.resize(n * c, 0.0);
        s.z.resize(n * heads * dv, 0.0);
        s.o.resize(n * heads * dv, 0.0);
        s.beta.resize(n * heads, 0.0);
        s.decay.resize(n * heads, 0.0);
        s.head_q.resize(dk, 0.0);
        s.head_k.resize(dk, 0.0);
        s.head_delta.resize(dv.max(dk), 0.0);
        self.qkv.matmul(h, n, &mut s.mixed)?;
        self.z.matmul(h, n, &mut s.z)?;
        self.beta.matmul(h, n, &mut s.beta)?;
        self.decay.matmul(h, n, &mut s.decay)?;

        // Causal depthwise convolution, one token at a time through the state window.
        let window = cache.fixed_mut(&self.conv_state)?;
        let rows = g.conv_kernel - 1;
        for (x, y) in s.mixed.chunks_exact(c).zip(s.conv.chunks_exact_mut(c)) {
            for ch in 0..c {
                let mut acc = 0.0f32;
                for j in 0..rows {
                    acc += self.conv[j * c + ch] * window[j * c + ch];
                }
                acc += self.conv[rows * c + ch] * x[ch];
                y[ch] = silu(acc);
            }
            window.copy_within(c.., 0);
            window[(rows - 1) * c..].copy_from_slice(x);
        }

        // The gated delta rule, token by token, head by head.
        let state = cache.fixed_mut(&self.recurrent_state)?;
        let q_scale = 1.0 / (dk as f32).sqrt();
        for t in 0..n {
            let row = &s.conv[t * c..(t + 1) * c];
            for head in 0..heads {
                let q = &mut s.head_q[..dk];
                q.copy_from_slice(&row[head * dk..(head + 1) * dk]);
                l2_normalize(q);
                q.iter_mut().for_each(|v| *v *= q_scale);
                let k = &mut s.head_k[..dk];
                k.copy_from_slice(&row[(heads + head) * dk..(heads + head + 1) * dk]);
                l2_normalize(k);
                let v = &row[2 * heads * dk + head * dv..2 * heads * dk + (head + 1) * dv];
                let beta = sigmoid(s.beta[t * heads + head]);
                let rate = self.a_log[head].exp()
                    * softplus(s.decay[t * heads + head] + self.dt_bias[head]);
                let alpha = (-rate).exp();
                let m = &mut state[head * dk * dv..(head + 1) * dk * dv];
                m.iter_mut().for_each(|x| *x *= alpha);
                let delta = &mut s.head_delta[..dv];
                for (j, d) in delta.iter_mut().enumerate() {
                    let recalled: f32 = (0..dk).map(|i| m[i * dv + j] * k[i]).sum();
                    *d = beta * (v[j] - recalled);
                }
                for (i, &ki) in k.iter().enumerate() {
                    for (x, &d) in m[i * dv..(i + 1) * dv].iter_mut().zip(delta.iter()) {
                        *x += ki * d;
                    }
                }
                let o = &mut s.o[(t * heads + head) * dv..(t * heads + head + 1) * dv];
                for (j, oj) in o.iter_mut().enumerate() {
                    *oj = (0..dk).map(|i| m[i * dv + j] * q[i]).sum();
                }
            }
        }

        // Gated RMSNorm per head, then the output projection.
        for (o, z) in s.o.chunks_exact_mut(dv).zip(s.z.chunks_exact(dv)) {
            let normed = &mut s.head_delta[..dv];
            rms_norm(o, &self.norm, self.rms_eps, normed);
            for ((oj, &nj), &zj) in o.iter_mut().zip(normed.iter()).zip(z) {
                *oj = nj * silu(zj);
            }
        }
        self.out.matmul(&s.o, n, out)
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use tq_cache::states::{StateKind, StateSpec};

    use super::*;

    fn cache_for(g: &DeltaNetGeometry) -> ModelCache {
        let fixed = |name: &str, shape| StateSpec {
            name: name.into(),
            kind: StateKind::Fixed { shape },
        };
        let specs = vec![
            fixed("conv", g.conv_shape()),
            fixed("rec", g.recurrent_shape()),
        ];
        ModelCache::new(specs, |_, _| unreachable!("no KV state")).unwrap()
    }

    /// The layer against a direct transcription of its definition, in f64 and in matrix
    /// form: `y_t = silu(Σ_j w_j x_{t−K+1+j})` (zeros before the first token) and
    /// `S_t = α_t (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ`. Fed in two calls (3 + 4 tokens) to
    /// cross the state boundary. Tolerance: f32 accumulation over ≤ 64 terms of O(1) values,
    /// relative error ≲ 64·2⁻²⁴ ≈ 4e-6 per step; 1e-4 absolute leaves room for 7 steps.
    #[test]
    fn matches_the_definition() {
        let g = DeltaNetGeometry {
            heads: 2,
            key_dim: 4,
            value_dim: 3,
            conv_kernel: 3,
        };
        let (e, c, k_len) = (6, g.channels(), g.conv_kernel);
        let mut rng = ChaCha20Rng::seed_from_u64(9);
        let block = DeltaNetBlock::random(g, e, "conv".into(), "rec".into(), 1e-6, &mut rng);
        let h = Dense::uniform(7, e, 1.0, &mut rng);
        let mut cache = cache_for(&g);
        let mut s = HybridScratch::default();
        let mut out = vec![0.0; 7 * e];
        let mut conv_rows = Vec::new();
        let (mut betas, mut decays) = (Vec::new(), Vec::new());
        for (start, n) in [(0, 3), (3, 4)] {
            let x = &h.data()[start * e..(start + n) * e];
            block
                .forward(
                    x,
                    n,
                    &mut cache,
                    &mut s,
                    &mut out[start * e..(start + n) * e],
                )
                .unwrap();
            conv_rows.extend_from_slice(&s.conv);
            betas.extend_from_slice(&s.beta);
            decays.extend_from_slice(&s.decay);
        }
        // Convolution.
        let mut mixed = vec![0.0; 7 * c];
        block.qkv.matmul(h.data(), 7, &mut mixed).unwrap();
        for t in 0..7 {
            for ch in 0..c {
                let mut acc = 0.0f64;
                for j in 0..k_len {
                    if let Some(src) = (t + j + 1).checked_sub(k_len) {
                        acc += f64::from(block.conv[j * c + ch]) * f64::from(mixed[src * c + ch]);
                    }
                }
                let want = acc / (1.0 + (-acc).exp());
                let got = f64::from(conv_rows[t * c + ch]);
                assert!(
                    (got - want).abs() < 1e-4,
                    "conv t={t} ch={ch}: {got} vs {want}"
                );
            }
        }
        // The conv state holds the last K − 1 projected inputs.
        let window = cache.fixed("conv").unwrap();
        assert_eq!(window, &mixed[(7 - (k_len - 1)) * c..]);
        // Recurrence.
        let (dk, dv) = (g.key_dim, g.value_dim);
        let norm = |x: &[f32]| -> Vec<f64> {
            let n = x.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>().sqrt();
            x.iter().map(|&v| f64::from(v) / (n + 1e-6)).collect()
        };
        for head in 0..g.heads {
            let mut state = vec![0.0f64; dk * dv];
            for t in 0..7 {
                let row = &conv_rows[t * c..(t + 1) * c];
                let k = norm(&row[(g.heads + head) * dk..(g.heads + head + 1) * dk]);
                let v = &row[2 * g.heads * dk + head * dv..2 * g.heads * dk + (head + 1) * dv];
                let beta = 1.0 / (1.0 + (-f64::from(betas[t * g.heads + head])).exp());
                let x = f64::from(decays[t * g.heads + head] + block.dt_bias[head]);
                let alpha = (-f64::from(block.a_log[head]).exp() * x.exp().ln_1p()).exp();
                // (I − β k kᵀ) S, then scale and add β k vᵀ.
                let ks: Vec<f64> = (0..dv)
                    .map(|j| (0..dk).map(|i| k[i] * state[i * dv + j]).sum())
                    .collect();
                for i in 0..dk {
                    for j in 0..dv {
                        let projected = state[i * dv + j] - beta * k[i] * ks[j];
                        state[i * dv + j] = alpha * projected + beta * k[i] * f64::from(v[j]);
                    }
                }
            }
            let got = &cache.fixed("rec").unwrap()[head * dk * dv..(head + 1) * dk * dv];
            for (a, b) in got.iter().zip(&state) {
                assert!((f64::from(*a) - b).abs() < 1e-4, "state {a} vs {b}");
            }
        }
    }

    #[test]
    fn scalar_pieces() {
        assert!((sigmoid(0.0) - 0.5).abs() < 1e-7);
        assert!((softplus(0.0) - 2f32.ln()).abs() < 1e-7);
        assert_eq!(softplus(50.0), 50.0);
        let mut x = [3.0, 4.0];
        l2_normalize(&mut x);
        assert!((x[0] - 0.6).abs() < 1e-6 && (x[1] - 0.8).abs() < 1e-6);
    }

    #[test]
    fn geometry_shapes() {
        let g = DeltaNetGeometry {
            heads: 2,
            key_dim: 8,
            value_dim: 4,
            conv_kernel: 4,
        };
        assert_eq!(g.channels(), 2 * (16 + 4));
        assert_eq!(g.conv_shape(), vec![3, 40]);
        assert_eq!(g.recurrent_shape(), vec![2, 8, 4]);
        assert!(g.validate().is_ok());
        assert!(
            DeltaNetGeometry {
                conv_kernel: 1,
                ..g
            }
            .validate()
            .is_err()
        );
    }
}
