//! A Qwen3.5-like hybrid: gated-DeltaNet layers (fixed conv and recurrent states) with every
//! `full_every`-th layer full attention over a growing KV cache.
//!
//! Its states, declared as data by [`QwenLikeConfig::state_specs`]: `blk.{l}.conv`
//! (`[kernel − 1, channels]`, f32) and `blk.{l}.rec` (`[heads, d_k, d_v]`, f32) per linear
//! layer, `blk.{l}.kv` (growing, codecs per the allocation) per attention layer. The fixed
//! states stay f32 whatever the allocation says, and a cache whose fixed states have seen a
//! token refuses to rewind (reset and re-run the prefix instead).

use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use serde::Serialize;
use tq_cache::allocation::Allocation;
use tq_cache::attention::AttentionKernel;
use tq_cache::kv_cache::{KvKind, KvLayout};
use tq_cache::states::{ModelCache, StateKind, StateSpec};
use tq_cache::token_store::Growth;

use super::delta_net::{DeltaNetBlock, DeltaNetGeometry};
use super::dense::Dense;
use super::layers::{AttentionBlock, AttentionGeometry, RopeSettings, SwiGluMlp};
use super::scratch::HybridScratch;
use super::stack::{Block, Mixer, Stack};
use crate::llama::{Logits, ModelError};

/// Hyper-parameters of a Qwen3.5-like hybrid.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct QwenLikeConfig {
    /// Vocabulary size.
    pub vocab: usize,
    /// Residual width.
    pub embedding: usize,
    /// MLP hidden width.
    pub feed_forward: usize,
    /// Number of layers.
    pub layers: usize,
    /// Layer `l` is full attention when `(l + 1) % full_every == 0` (4: layers 3, 7, ...).
    pub full_every: usize,
    /// Shape of the linear-attention layers.
    pub linear: DeltaNetGeometry,
    /// Shape and RoPE of the full-attention layers.
    pub full: AttentionGeometry,
    /// RMSNorm ε.
    pub rms_eps: f32,
    /// Seed of the random weights.
    pub seed: u64,
}

impl QwenLikeConfig {
    /// A small model for tests: eight layers (layers 3 and 7 full attention, head dim 64 with
    /// a quarter of it rotated), DeltaNet layers of 2 heads × 16 × 16 with a width-4 conv.
    pub fn tiny(seed: u64) -> Self {
        Self {
            vocab: 48,
            embedding: 32,
            feed_forward: 64,
            layers: 8,
            full_every: 4,
            linear: DeltaNetGeometry {
                heads: 2,
                key_dim: 16,
                value_dim: 16,
                conv_kernel: 4,
            },
            full: AttentionGeometry {
                q_heads: 2,
                kv_heads: 1,
                head_dim: 64,
                rope: RopeSettings {
                    base: 10_000_000.0,
                    dims: 16,
                },
            },
            rms_eps: 1e-6,
            seed,
        }
    }

    /// A Qwen3.5-sized cache geometry for memory reports (no weights are needed for those):
    /// 24 layers, every fourth full attention (2 KV heads × 256), DeltaNet layers of
    /// 16 heads × 128 × 128 with a width-4 conv (sizes illustrative, not read from a
    /// checkpoint).
    pub fn qwen35_like() -> Self {
        Self {
            vocab: 151_936,
            embedding: 1024,
            feed_forward: 3584,
            layers: 24,
            full_every: 4,
            linear: DeltaNetGeometry {
                heads: 16,
                key_dim: 128,
                value_dim: 128,
                conv_kernel: 4,
            },
            full: AttentionGeometry {
                q_heads: 8,
                kv_heads: 2,
                head_dim: 256,
                rope: RopeSettings {
                    base: 10_000_000.0,
                    dims: 64,
                },
            },
            rms_eps: 1e-6,
            seed: 0,
        }
    }

    /// Whether layer `l` is full attention.
    pub fn is_full(&self, l: usize) -> bool {
        (l + 1).is_multiple_of(self.full_every)
    }

    /// Checks every shape.
    pub fn validate(&self) -> Result<(), ModelError> {
        if self.vocab == 0 || self.embedding == 0 || self.feed_forward == 0 || self.full_every == 0
        {
            return Err(ModelError::Unsupported(
                "Qwen-like config: vocab, embedding, feed_forward and full_every must be positive"
                    .into(),
            ));
        }
        self.linear.validate()?;
        self.full.validate("full layers")
    }

    /// The states, as data: conv and recurrent (fixed f32) per linear layer, a growing KV
    /// state per full layer.
    pub fn state_specs(&self, growth: Growth) -> Vec<StateSpec> {
        let mut specs = Vec::new();
        for layer in 0..self.layers {
            if self.is_full(layer) {
                specs.push(StateSpec {
                    name: format!("blk.{layer}.kv"),
                    kind: StateKind::Kv {
                        layer,
                        layout: KvLayout {
                            kv_heads: self.full.kv_heads,
                            head_dim: self.full.head_dim,
                            kind: KvKind::Growing { growth },
                            max_rewind: 0,
                            rope_pairs: tq_cache::basis::RopePairs::Adjacent,
                            rope_base: Default::default(),
                        },
                    },
                });
            } else {
                specs.push(StateSpec {
                    name: format!("blk.{layer}.conv"),
                    kind: StateKind::Fixed {
                        shape: self.linear.conv_shape(),
                    },
                });
                specs.push(StateSpec {
                    name: format!("blk.{layer}.rec"),
                    kind: StateKind::Fixed {
                        shape: self.linear.recurrent_shape(),
                    },
                });
            }
        }
        specs
    }
}

/// A Qwen3.5-like hybrid with seeded random weights.
#[derive(Clone, Debug)]
pub struct QwenLike {
    /// Hyper-parameters.
    pub config: QwenLikeConfig,
    stack: Stack,
}

impl QwenLike {
    /// Draws the weights from `config.seed`.
    pub fn new(config: QwenLikeConfig) -> Result<Self, ModelError> {
        config.validate()?;
        let mut rng = ChaCha20Rng::seed_from_u64(config.seed);
        let e = config.embedding;
        let embed = Dense::uniform(config.vocab, e, 1.0, &mut rng);
        let blocks = (0..config.layers)
            .map(|l| {
                let mixer = if config.is_full(l) {
                    Mixer::Attention(AttentionBlock::random(l, e, config.full, true, &mut rng))
                } else {
                    Mixer::DeltaNet(DeltaNetBlock::random(
                        config.linear,
                        e,
                        format!("blk.{l}.conv"),
                        format!("blk.{l}.rec"),
                        config.rms_eps,
                        &mut rng,
                    ))
                };
                Block {
                    mixer_norm: vec![1.0; e],
                    mixer,
                    mlp_norm: vec![1.0; e],
                    mlp: SwiGluMlp::random(e, config.feed_forward, &mut rng),
                }
            })
            .collect();
        let output = Dense::random(config.vocab, e, &mut rng);
        let stack = Stack::new(
            embed,
            blocks,
            output,
            config.rms_eps,
            config.state_specs(Growth::Doubling { initial: 1 }),
        );
        Ok(Self { config, stack })
    }

    /// The model's states (full layers grow with `growth`).
    pub fn state_specs(&self, growth: Growth) -> Vec<StateSpec> {
        self.config.state_specs(growth)
    }

    /// A cache for up to `capacity` tokens: the allocation chooses the full layers' codecs;
    /// conv and recurrent states are f32.
    pub fn new_cache(
        &self,
        allocation: &Allocation,
        capacity: usize,
    ) -> Result<ModelCache, ModelError> {
        let specs = self.state_specs(Growth::Static { capacity });
        Ok(ModelCache::with_allocation(specs, allocation)?)
    }

    /// The forward pass, with the Llama model's call shape (see [`Stack::forward`]).
    pub fn forward<'s>(
        &self,
        tokens: &[u32],
        positions: &[u32],
        cache: &mut ModelCache,
        kernel: AttentionKernel,
        logits: Logits,
        scratch: &'s mut HybridScratch,
    ) -> Result<&'s [f32], ModelError> {
        self.stack
            .forward(tokens, positions, cache, kernel, logits, scratch)
    }

    /// Vocabulary size.
    pub fn vocab(&self) -> usize {
        self.config.vocab
    }
}
