//! The Gemma 3 forward pass, as the reference engine computes it (`llm_build_gemma3_iswa`):
//!
//! 1. `x = embedding row · √embedding`.
//! 2. `h = rmsnorm(x)·attn_norm`; `q = Wq h`, `k = Wk h`, `v = Wv h`.
//! 3. Per-head RMSNorm of `q` and `k` (QK-norm), **before** RoPE; `v` as is.
//! 4. NEOX RoPE with the layer kind's base; `q ×= 1/√head_dim` (attention scale 1).
//! 5. Attention: sliding layers see the last `sliding_window` positions, global ones all.
//! 6. `x += rmsnorm(Wo·attn)·post_attention_norm`.
//! 7. `x += rmsnorm(Wdown(GELU(Wgate f) ⊙ Wup f))·post_ffw_norm` with `f = rmsnorm(x)·ffn_norm`.
//! 8. `logits = output · (rmsnorm(x)·output_norm)` (the output head is the tied embedding),
//!    only for the positions that need them.

use std::path::Path;
use std::sync::Arc;

use tq_cache::attention::{AttentionKernel, AttentionShape};
use tq_cache::kv_cache::{KvKind, KvLayout};
use tq_cache::states::{StateKind, StateSpec};
use tq_cache::token_store::Growth;

use super::ops::{Gelu, rms_norm_heads, rope_neox_with};
use super::weights::Gemma3Weights;
use super::{Gemma3Config, LayerKind};
use crate::causal_lm::{CausalLm, ModelDims};
use crate::forward_scratch::{ForwardScratch, Logits, resize};
use crate::gguf::{Gguf, WeightMemory};
use crate::llama::ops::rms_norm;
use crate::llama::{AttentionBackend, ModelError};
use crate::quant::{KQuantOrder, Q8Order, QuantMatrix};

/// The prefill chunk a Gemma 3 cache is sized for unless told otherwise: the reference
/// engine's default micro-batch.
pub const DEFAULT_MAX_CHUNK: usize = 512;

/// A Gemma 3 model over a memory-mapped GGUF file.
#[derive(Clone, Debug)]
pub struct Gemma3 {
    /// Hyper-parameters.
    pub config: Gemma3Config,
    /// The weights.
    pub weights: Gemma3Weights,
    /// How the MLP evaluates GELU.
    pub gelu: Gelu,
    /// The summation order of the K-format weight products.
    pub k_order: KQuantOrder,
    /// The summation order of the Q4_0/Q4_1/Q5_0/Q8_0 weight products.
    pub q8_order: Q8Order,
    /// RoPE's rotation with the first product of each output fused into the addition, as
    /// the reference engine's compiler contracts it (see [`rope_neox_with`]).
    pub fused_rope: bool,
    max_chunk: usize,
    file: Arc<Gguf>,
}

impl Gemma3 {
    /// Opens a GGUF file held as [`WeightMemory::for_inference`] picks (huge pages on Linux)
    /// and checks it.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, ModelError> {
        Self::from_gguf(Arc::new(Gguf::open_with(
            path,
            WeightMemory::for_inference(),
        )?))
    }

    /// Builds the model over an opened file.
    pub fn from_gguf(file: Arc<Gguf>) -> Result<Self, ModelError> {
        let config = Gemma3Config::from_gguf(&file)?;
        let weights = Gemma3Weights::load(&file, &config)?;
        Ok(Self {
            config,
            weights,
            gelu: Gelu::default(),
            k_order: KQuantOrder::default(),
            q8_order: Q8Order::default(),
            fused_rope: false,
            max_chunk: DEFAULT_MAX_CHUNK,
            file,
        })
    }

    /// Sizes the sliding layers' rings for forward calls of up to `chunk` tokens (a ring
    /// holds `window + chunk − 1` slots, so a chunk's first token still sees its whole
    /// window). Caches made before the change keep their size.
    pub fn with_max_chunk(mut self, chunk: usize) -> Self {
        self.max_chunk = chunk.max(1);
        self
    }

    fn layer_layout(&self, layer: usize, growth: Growth) -> KvLayout {
        let c = &self.config;
        match c.layer_kind(layer) {
            LayerKind::Sliding => KvLayout {
                kv_heads: c.kv_heads,
                head_dim: c.head_dim,
                kind: KvKind::Sliding {
                    window: c.sliding_window,
                },
                max_rewind: self.max_chunk - 1,
                rope_pairs: tq_cache::basis::RopePairs::Halves,
                rope_base: tq_cache::rope_center::RopeBase::new(c.rope_base(layer)),
            },
            LayerKind::Global => KvLayout {
                kv_heads: c.kv_heads,
                head_dim: c.head_dim,
                kind: KvKind::Growing { growth },
                max_rewind: 0,
                rope_pairs: tq_cache::basis::RopePairs::Halves,
                rope_base: tq_cache::rope_center::RopeBase::new(c.rope_base(layer)),
            },
        }
    }
}

impl CausalLm for Gemma3 {
    fn architecture(&self) -> &'static str {
        "gemma3"
    }

    fn dims(&self) -> ModelDims {
        let c = &self.config;
        ModelDims {
            layers: c.layers,
            embedding: c.embedding,
            q_heads: c.heads,
            kv_heads: c.kv_heads,
            head_dim: c.head_dim,
            vocab: c.vocab,
            context_length: c.context_length,
        }
    }

    fn file(&self) -> &Arc<Gguf> {
        &self.file
    }

    /// `blk.{l}.kv` per layer: a ring of `window + max_chunk − 1` slots on sliding layers, a
    /// growing cache on global ones.
    fn state_specs(&self, growth: Growth) -> Vec<StateSpec> {
        (0..self.config.layers)
            .map(|layer| StateSpec {
                name: format!("blk.{layer}.kv"),
                kind: StateKind::Kv {
                    layer,
                    layout: self.layer_layout(layer, growth),
                },
            })
            .collect()
    }

    fn max_chunk(&self) -> usize {
        self.max_chunk
    }

    fn llamacpp_kernel(&self) -> AttentionKernel {
        AttentionKernel::LlamaCppF16Avx512Fp16
    }

    fn set_llamacpp_numerics(&mut self, on: bool) {
        (self.gelu, self.k_order, self.q8_order, self.fused_rope) = if on {
            (
                Gelu::F16Table,
                KQuantOrder::LlamaCppX86,
                Q8Order::LlamaCppAvx2,
                true,
            )
        } else {
            (
                Gelu::Exact,
                KQuantOrder::BlockLanes,
                Q8Order::BlockLanes,
                false,
            )
        };
    }

    fn forward_with<'s>(
        &self,
        tokens: &[u32],
        positions: &[u32],
        backend: &mut dyn AttentionBackend,
        logits: Logits,
        scratch: &'s mut ForwardScratch,
    ) -> Result<&'s [f32], ModelError> {
        let c = &self.config;
        let n = tokens.len();
        if n == 0 || positions.len() < n {
            return Err(ModelError::InvalidCall(format!(
                "{n} tokens with {} positions",
                positions.len()
            )));
        }
        if n > self.max_chunk {
            return Err(ModelError::InvalidCall(format!(
                "a chunk of {n} tokens is longer than the {} the sliding layers' rings were \
                 sized for: split the prompt into chunks of at most {} tokens (--prefill-chunk)",
                self.max_chunk, self.max_chunk
            )));
        }
        let new_positions = &positions[positions.len() - n..];
        if let Some(&p) = new_positions
            .iter()
            .find(|&&p| p as usize >= c.context_length)
        {
            return Err(ModelError::ContextOverflow {
                position: p as usize,
                context: c.context_length,
            });
        }
        let (e, d, f) = (c.embedding, c.head_dim, c.feed_forward);
        let (qd, kvd) = (c.heads * d, c.kv_heads * d);
        let s = scratch;
        s.matvec.set_k_order(self.k_order);
        s.matvec.set_q8_order(self.q8_order);
        for (buffer, width) in [
            (&mut s.x, e),
            (&mut s.h, e.max(d)),
            (&mut s.q, qd),
            (&mut s.k, kvd),
            (&mut s.v, kvd),
            (&mut s.attn, qd),
            (&mut s.delta, e),
            (&mut s.gate, f),
            (&mut s.up, f),
        ] {
            resize(buffer, n * width);
        }
        let scale = c.embedding_scale();
        for (row, &token) in s.x.chunks_exact_mut(e).zip(tokens) {
            if token as usize >= c.vocab {
                return Err(ModelError::TokenOutOfRange {
                    id: token,
                    vocab: c.vocab,
                });
            }
            self.weights.token_embd.embedding_row(token as usize, row)?;
            for v in row.iter_mut() {
                *v *= scale;
            }
        }
        let shape = AttentionShape {
            q_heads: c.heads,
            scale: 1.0,
        };
        let query_scale = c.query_scale();
        // Rows that still matter: every row until the last layer's attention, then only those
        // that get logits (the reference engine drops the others there too, so its last MLP
        // sees the same batch size, which decides its kernels' summation order).
        let mut rows = n;
        let last_layer = c.layers - 1;
        for (layer, w) in self.weights.layers.iter().enumerate() {
            let h = &mut s.h[..n * e];
            for (x, h) in s.x.chunks_exact(e).zip(h.chunks_exact_mut(e)) {
                rms_norm(x, &w.attn_norm, c.rms_eps, h);
            }
            let mut qkv = [
                (&w.q, &mut s.q[..]),
                (&w.k, &mut s.k[..]),
                (&w.v, &mut s.v[..]),
            ];
            QuantMatrix::matmul_each(h, n, &mut qkv, &mut s.matvec)?;
            // `h` is free again: its first head_dim floats serve the per-head norms.
            rms_norm_heads(&mut s.q, &w.q_norm, c.rms_eps, &mut s.h);
            rms_norm_heads(&mut s.k, &w.k_norm, c.rms_eps, &mut s.h);
            let base = c.rope_base(layer);
            for (i, &p) in new_positions.iter().enumerate() {
                rope_neox_with(&mut s.q[i * qd..(i + 1) * qd], d, base, p, self.fused_rope);
                rope_neox_with(
                    &mut s.k[i * kvd..(i + 1) * kvd],
                    d,
                    base,
                    p,
                    self.fused_rope,
                );
            }
            for v in s.q.iter_mut() {
                *v *= query_scale;
            }
            backend.attend(layer, &s.q, &s.k, &s.v, positions, shape, &mut s.attn)?;
            w.o.matmul(&s.attn, n, &mut s.delta, &mut s.matvec)?;
            if layer == last_layer && logits == Logits::Last && n > 1 {
                s.x.copy_within((n - 1) * e..n * e, 0);
                s.delta.copy_within((n - 1) * e..n * e, 0);
                rows = 1;
            }
            let (x, delta) = (&mut s.x[..rows * e], &s.delta[..rows * e]);
            add_normed(x, delta, &w.post_attention_norm, c.rms_eps, &mut s.h);
            let h = &mut s.h[..rows * e];
            for (x, h) in x.chunks_exact(e).zip(h.chunks_exact_mut(e)) {
                rms_norm(x, &w.ffn_norm, c.rms_eps, h);
            }
            let (gate, up) = (&mut s.gate[..rows * f], &mut s.up[..rows * f]);
            QuantMatrix::matmul_each(h, rows, &mut [(&w.gate, gate), (&w.up, up)], &mut s.matvec)?;
            self.gelu.gate(gate, up);
            let delta = &mut s.delta[..rows * e];
            w.down.matmul(gate, rows, delta, &mut s.matvec)?;
            add_normed(
                &mut s.x[..rows * e],
                delta,
                &w.post_ffw_norm,
                c.rms_eps,
                &mut s.h,
            );
        }
        // After the last layer the residual holds `rows` rows: all of them, or the last one.
        let count = rows;
        for t in 0..count {
            rms_norm(
                &s.x[t * e..(t + 1) * e],
                &self.weights.output_norm,
                c.rms_eps,
                &mut s.h[t * e..(t + 1) * e],
            );
        }
        resize(&mut s.logits, count * c.vocab);
        self.weights
            .output
            .matmul(&s.h[..count * e], count, &mut s.logits, &mut s.matvec)?;
        Ok(&s.logits)
    }
}

/// `x += rmsnorm(delta)·weight`, row by row (Gemma's post-norms), with `tmp` as the normed row.
fn add_normed(x: &mut [f32], delta: &[f32], weight: &[f32], eps: f32, tmp: &mut [f32]) {
    let e = weight.len();
    let tmp = &mut tmp[..e];
    for (x, d) in x.chunks_exact_mut(e).zip(delta.chunks_exact(e)) {
        rms_norm(d, weight, eps, tmp);
        for (x, t) in x.iter_mut().zip(tmp.iter()) {
            *x += t;
        }
    }
}
