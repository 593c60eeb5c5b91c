//! The forward pass.

use std::path::Path;
use std::sync::Arc;

use tq_cache::allocation::Allocation;
use tq_cache::attention::{AttentionKernel, AttentionShape};
use tq_cache::kv_cache::{KvKind, KvLayout};
use tq_cache::states::{ModelCache, StateKind, StateSpec};
use tq_cache::token_store::Growth;

use super::attention_backend::{AttentionBackend, CpuAttention};
use super::ops::{rms_norm, rope, swiglu};
use super::weights::LlamaWeights;
use super::{LlamaConfig, ModelError};
use crate::causal_lm::{CausalLm, ModelDims};
use crate::forward_scratch::resize;
pub use crate::forward_scratch::{ForwardScratch, Logits};
use crate::gguf::{Gguf, WeightMemory};
use crate::quant::{KQuantOrder, Q8Order, QuantMatrix};

/// A Llama model over a memory-mapped GGUF file.
#[derive(Clone, Debug)]
pub struct Llama {
    /// Hyper-parameters.
    pub config: LlamaConfig,
    /// The weights.
    pub weights: LlamaWeights,
    /// The summation order of the K-format weight products (SmolLM2 has none).
    pub k_order: KQuantOrder,
    /// The summation order of the Q4_0/Q4_1/Q5_0/Q8_0 weight products.
    pub q8_order: Q8Order,
    file: Arc<Gguf>,
}

impl Llama {
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
        let config = LlamaConfig::from_gguf(&file)?;
        let weights = LlamaWeights::load(&file, &config)?;
        Ok(Self {
            config,
            weights,
            k_order: KQuantOrder::default(),
            q8_order: Q8Order::default(),
            file,
        })
    }

    /// The underlying file (metadata, tokenizer).
    pub fn file(&self) -> &Arc<Gguf> {
        &self.file
    }

    /// The model's states: one growing KV cache per layer.
    pub fn state_specs(&self, growth: Growth) -> Vec<StateSpec> {
        (0..self.config.layers)
            .map(|layer| StateSpec {
                name: format!("blk.{layer}.kv"),
                kind: StateKind::Kv {
                    layer,
                    layout: KvLayout {
                        kv_heads: self.config.kv_heads,
                        head_dim: self.config.head_dim,
                        kind: KvKind::Growing { growth },
                        max_rewind: 0,
                        rope_pairs: tq_cache::basis::RopePairs::Adjacent,
                        // RoPE-aware centering turns every plane; a partial RoPE has none.
                        rope_base: if self.config.rope_dims == self.config.head_dim {
                            tq_cache::rope_center::RopeBase::new(self.config.rope_base)
                        } else {
                            tq_cache::rope_center::RopeBase::UNKNOWN
                        },
                    },
                },
            })
            .collect()
    }

    /// A cache for up to `capacity` tokens with the codecs `allocation` chooses (allocated
    /// up front: decoding never allocates cache memory).
    pub fn new_cache(
        &self,
        allocation: &Allocation,
        capacity: usize,
    ) -> Result<ModelCache, ModelError> {
        let specs = self.state_specs(Growth::Static { capacity });
        Ok(ModelCache::with_allocation(specs, allocation)?)
    }

    /// Runs `tokens` at the end of the sequence whose positions are `positions`
    /// (`offset = positions.len − tokens.len` tokens are already in `cache`) and returns the
    /// logits (`[vocab]` for [`Logits::Last`], `[tokens.len, vocab]` for [`Logits::All`]).
    ///
    /// Attention runs on the CPU with `kernel`; [`Llama::forward_with`] takes any
    /// [`AttentionBackend`].
    #[allow(clippy::too_many_arguments)]
    pub fn forward<'s>(
        &self,
        tokens: &[u32],
        positions: &[u32],
        cache: &mut ModelCache,
        kernel: AttentionKernel,
        logits: Logits,
        scratch: &'s mut ForwardScratch,
    ) -> Result<&'s [f32], ModelError> {
        let mut backend = CpuAttention { cache, kernel };
        self.forward_with(tokens, positions, &mut backend, logits, scratch)
    }

    /// [`Llama::forward`] with attention delegated to `backend` (CPU cache, GPU kernels, or
    /// an instrumented backend).
    pub fn forward_with<'s>(
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
        let (e, qd, kvd, f) = (
            c.embedding,
            c.heads * c.head_dim,
            c.kv_heads * c.head_dim,
            c.feed_forward,
        );
        let s = scratch;
        s.matvec.set_k_order(self.k_order);
        s.matvec.set_q8_order(self.q8_order);
        for (buffer, width) in [
            (&mut s.x, e),
            (&mut s.h, e),
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
        for (row, &token) in s.x.chunks_exact_mut(e).zip(tokens) {
            if token as usize >= c.vocab {
                return Err(ModelError::TokenOutOfRange {
                    id: token,
                    vocab: c.vocab,
                });
            }
            self.weights.token_embd.embedding_row(token as usize, row)?;
        }
        let shape = AttentionShape {
            q_heads: c.heads,
            scale: 1.0 / (c.head_dim as f32).sqrt(),
        };
        for (layer, w) in self.weights.layers.iter().enumerate() {
            // Attention sub-block.
            for (x, h) in s.x.chunks_exact(e).zip(s.h.chunks_exact_mut(e)) {
                rms_norm(x, &w.attn_norm, c.rms_eps, h);
            }
            let mut qkv = [
                (&w.q, &mut s.q[..]),
                (&w.k, &mut s.k[..]),
                (&w.v, &mut s.v[..]),
            ];
            QuantMatrix::matmul_each(&s.h, n, &mut qkv, &mut s.matvec)?;
            for (i, &p) in new_positions.iter().enumerate() {
                rope(
                    &mut s.q[i * qd..(i + 1) * qd],
                    c.head_dim,
                    c.rope_dims,
                    c.rope_base,
                    p,
                );
                rope(
                    &mut s.k[i * kvd..(i + 1) * kvd],
                    c.head_dim,
                    c.rope_dims,
                    c.rope_base,
                    p,
                );
            }
            backend.attend(layer, &s.q, &s.k, &s.v, positions, shape, &mut s.attn)?;
            w.o.matmul(&s.attn, n, &mut s.delta, &mut s.matvec)?;
            for (x, d) in s.x.iter_mut().zip(&s.delta) {
                *x += d;
            }
            // MLP sub-block.
            for (x, h) in s.x.chunks_exact(e).zip(s.h.chunks_exact_mut(e)) {
                rms_norm(x, &w.ffn_norm, c.rms_eps, h);
            }
            let mut gate_up = [(&w.gate, &mut s.gate[..]), (&w.up, &mut s.up[..])];
            QuantMatrix::matmul_each(&s.h, n, &mut gate_up, &mut s.matvec)?;
            swiglu(&mut s.gate, &s.up);
            w.down.matmul(&s.gate, n, &mut s.delta, &mut s.matvec)?;
            for (x, d) in s.x.iter_mut().zip(&s.delta) {
                *x += d;
            }
        }
        let rows = match logits {
            Logits::Last => n - 1..n,
            Logits::All => 0..n,
        };
        let count = rows.len();
        for (i, t) in rows.enumerate() {
            rms_norm(
                &s.x[t * e..(t + 1) * e],
                &self.weights.output_norm,
                c.rms_eps,
                &mut s.h[i * e..(i + 1) * e],
            );
        }
        resize(&mut s.logits, count * c.vocab);
        self.weights
            .output
            .matmul(&s.h[..count * e], count, &mut s.logits, &mut s.matvec)?;
        Ok(&s.logits)
    }
}

impl CausalLm for Llama {
    fn architecture(&self) -> &'static str {
        "llama"
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
        Llama::file(self)
    }

    fn state_specs(&self, growth: Growth) -> Vec<StateSpec> {
        Llama::state_specs(self, growth)
    }

    fn forward_with<'s>(
        &self,
        tokens: &[u32],
        positions: &[u32],
        backend: &mut dyn AttentionBackend,
        logits: Logits,
        scratch: &'s mut ForwardScratch,
    ) -> Result<&'s [f32], ModelError> {
        Llama::forward_with(self, tokens, positions, backend, logits, scratch)
    }

    fn set_llamacpp_numerics(&mut self, on: bool) {
        (self.k_order, self.q8_order) = if on {
            (KQuantOrder::LlamaCppX86, Q8Order::LlamaCppAvx2)
        } else {
            (KQuantOrder::BlockLanes, Q8Order::BlockLanes)
        };
    }
}
