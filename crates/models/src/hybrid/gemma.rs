//! A Gemma-4-like stack: local sliding-window layers and global full-attention layers with
//! different head dimensions and RoPE settings, and KV-sharing layers that read an earlier
//! layer's cache instead of storing their own.
//!
//! Its states, declared as data by [`GemmaLikeConfig::state_specs`]: one sliding KV state
//! (a ring) per local producer layer, one growing KV state per global producer layer, and one
//! [`StateKind::SharedKv`] per sharing layer (no storage). A ring holds
//! `window + prefill_chunk − 1` slots: a chunk of up to `prefill_chunk` tokens is written
//! before it attends, and its first token still needs the `window − 1` positions before it, so
//! any chunking with chunks ≤ `prefill_chunk` is exact. With `prefill_chunk = 1` (a ring of
//! exactly `window` slots, the seed's layout) decode is exact but a chunk that wraps the ring
//! loses the oldest in-window keys of its non-final tokens (`tests/hybrid_chunking.rs` shows it).

use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use serde::Serialize;
use tq_cache::allocation::Allocation;
use tq_cache::attention::AttentionKernel;
use tq_cache::kv_cache::{KvKind, KvLayout};
use tq_cache::states::{ModelCache, StateKind, StateSpec};
use tq_cache::token_store::Growth;

use super::dense::Dense;
use super::layers::{AttentionBlock, AttentionGeometry, RopeSettings, SwiGluMlp};
use super::scratch::HybridScratch;
use super::stack::{Block, Mixer, Stack};
use crate::llama::{AttentionBackend, Logits, ModelError};

/// Local (sliding-window) or global (full) attention.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AttentionSpan {
    /// Sees the last `window` positions; its cache is a ring.
    Sliding,
    /// Sees every earlier position; its cache grows.
    Full,
}

/// One layer of the stack.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct GemmaLayer {
    /// Local or global.
    pub span: AttentionSpan,
    /// `Some(l)`: read layer `l`'s cache (same span, an earlier producer) instead of storing one.
    pub shares: Option<usize>,
    /// This layer's RoPE, when it differs from its span's.
    pub rope: Option<RopeSettings>,
}

/// Head dimension and RoPE of one attention span.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct SpanSettings {
    /// Head dimension of every layer of this span.
    pub head_dim: usize,
    /// RoPE of every layer of this span.
    pub rope: RopeSettings,
}

/// Hyper-parameters of a Gemma-4-like model.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GemmaLikeConfig {
    /// Vocabulary size.
    pub vocab: usize,
    /// Residual width.
    pub embedding: usize,
    /// MLP hidden width.
    pub feed_forward: usize,
    /// Query heads of every attention layer.
    pub q_heads: usize,
    /// KV heads of every attention layer.
    pub kv_heads: usize,
    /// Sliding layers' head dimension and RoPE.
    pub sliding: SpanSettings,
    /// Full layers' head dimension and RoPE.
    pub full: SpanSettings,
    /// Attention window W of sliding layers.
    pub window: usize,
    /// Longest prefill chunk that stays exact (ring slots = `window + prefill_chunk − 1`).
    pub prefill_chunk: usize,
    /// The layers, in order.
    pub layers: Vec<GemmaLayer>,
    /// RMSNorm ε.
    pub rms_eps: f32,
    /// Seed of the random weights.
    pub seed: u64,
}

impl GemmaLikeConfig {
    /// A small model for tests: six layers (sliding ×2, full, sliding, a sliding sharer of
    /// layer 3, a full sharer of layer 2), head dims 32 (sliding) and 64 (full), W = 8;
    /// layer 1 overrides its span's RoPE.
    pub fn tiny(seed: u64) -> Self {
        use AttentionSpan::{Full, Sliding};
        let layer = |span, shares| GemmaLayer {
            span,
            shares,
            rope: None,
        };
        Self {
            vocab: 48,
            embedding: 32,
            feed_forward: 64,
            q_heads: 2,
            kv_heads: 1,
            sliding: SpanSettings {
                head_dim: 32,
                rope: RopeSettings {
                    base: 10_000.0,
                    dims: 32,
                },
            },
            full: SpanSettings {
                head_dim: 64,
                // Partial RoPE on global layers, as Gemma's p-RoPE: a quarter of the dims.
                rope: RopeSettings {
                    base: 1_000_000.0,
                    dims: 16,
                },
            },
            window: 8,
            prefill_chunk: 8,
            layers: vec![
                layer(Sliding, None),
                GemmaLayer {
                    // A layer with its own RoPE: a different base, half the dims rotated.
                    rope: Some(RopeSettings {
                        base: 50_000.0,
                        dims: 16,
                    }),
                    ..layer(Sliding, None)
                },
                layer(Full, None),
                layer(Sliding, None),
                layer(Sliding, Some(3)),
                layer(Full, Some(2)),
            ],
            rms_eps: 1e-6,
            seed,
        }
    }

    /// A Gemma-4-E2B-sized cache geometry for memory reports (no weights are needed for
    /// those): the seed's dual head dims 256 (sliding, W = 512) and 512 (full), one KV head;
    /// 35 layers, four sliding to one full, the last 20 sharing the last producer of their span
    /// (layer counts are illustrative, not read from a checkpoint).
    pub fn gemma4_e2b_like() -> Self {
        let producers = 15;
        let span = |l: usize| {
            if l % 5 == 4 {
                AttentionSpan::Full
            } else {
                AttentionSpan::Sliding
            }
        };
        let last_producer = |s: AttentionSpan| (0..producers).rev().find(|&l| span(l) == s);
        let layers = (0..35)
            .map(|l| GemmaLayer {
                span: span(l),
                shares: if l < producers {
                    None
                } else {
                    last_producer(span(l))
                },
                rope: None,
            })
            .collect();
        Self {
            vocab: 262_144,
            embedding: 1536,
            feed_forward: 6144,
            q_heads: 8,
            kv_heads: 1,
            sliding: SpanSettings {
                head_dim: 256,
                rope: RopeSettings {
                    base: 10_000.0,
                    dims: 256,
                },
            },
            full: SpanSettings {
                head_dim: 512,
                rope: RopeSettings {
                    base: 1_000_000.0,
                    dims: 128,
                },
            },
            window: 512,
            prefill_chunk: 512,
            layers,
            rms_eps: 1e-6,
            seed: 0,
        }
    }

    fn span(&self, span: AttentionSpan) -> &SpanSettings {
        match span {
            AttentionSpan::Sliding => &self.sliding,
            AttentionSpan::Full => &self.full,
        }
    }

    /// The attention geometry of a span.
    pub fn geometry(&self, span: AttentionSpan) -> AttentionGeometry {
        let s = self.span(span);
        AttentionGeometry {
            q_heads: self.q_heads,
            kv_heads: self.kv_heads,
            head_dim: s.head_dim,
            rope: s.rope,
        }
    }

    /// The attention geometry of one layer: its span's, with the layer's own RoPE if it has one.
    pub fn layer_geometry(&self, layer: &GemmaLayer) -> AttentionGeometry {
        let mut g = self.geometry(layer.span);
        if let Some(rope) = layer.rope {
            g.rope = rope;
        }
        g
    }

    /// Checks every shape and every sharing link.
    pub fn validate(&self) -> Result<(), ModelError> {
        let bad = |why: String| Err(ModelError::Unsupported(format!("Gemma-like config: {why}")));
        if self.vocab == 0 || self.embedding == 0 || self.feed_forward == 0 {
            return bad("vocab, embedding and feed_forward must be positive".into());
        }
        if self.window == 0 || self.prefill_chunk == 0 {
            return bad("window and prefill_chunk must be positive".into());
        }
        self.geometry(AttentionSpan::Sliding)
            .validate("sliding layers")?;
        self.geometry(AttentionSpan::Full).validate("full layers")?;
        for (l, layer) in self.layers.iter().enumerate() {
            self.layer_geometry(layer).validate(&format!("layer {l}"))?;
            if let Some(source) = layer.shares {
                let ok = source < l
                    && self.layers[source].shares.is_none()
                    && self.layers[source].span == layer.span;
                if !ok {
                    return bad(format!(
                        "layer {l} shares layer {source}: not an earlier producer of the same span"
                    ));
                }
                // The producer's keys carry its RoPE; queries rotated differently would score
                // mismatched frequencies.
                if self.layer_geometry(layer).rope != self.layer_geometry(&self.layers[source]).rope
                {
                    return bad(format!(
                        "layer {l} shares layer {source} but rotates its queries differently"
                    ));
                }
            }
        }
        Ok(())
    }

    /// The states, as data: `blk.{l}.kv` per layer — sliding (a ring) or growing with
    /// `growth` for producers, shared for sharers.
    pub fn state_specs(&self, growth: Growth) -> Vec<StateSpec> {
        self.layers
            .iter()
            .enumerate()
            .map(|(layer, l)| StateSpec {
                name: format!("blk.{layer}.kv"),
                kind: match l.shares {
                    Some(source_layer) => StateKind::SharedKv {
                        layer,
                        source_layer,
                    },
                    None => StateKind::Kv {
                        layer,
                        layout: match l.span {
                            AttentionSpan::Sliding => KvLayout {
                                kv_heads: self.kv_heads,
                                head_dim: self.sliding.head_dim,
                                kind: KvKind::Sliding {
                                    window: self.window,
                                },
                                // The extra ring slots keep a chunk's first token exact.
                                max_rewind: self.prefill_chunk - 1,
                                rope_pairs: tq_cache::basis::RopePairs::Adjacent,
                                rope_base: Default::default(),
                            },
                            AttentionSpan::Full => KvLayout {
                                kv_heads: self.kv_heads,
                                head_dim: self.full.head_dim,
                                kind: KvKind::Growing { growth },
                                max_rewind: 0,
                                rope_pairs: tq_cache::basis::RopePairs::Adjacent,
                                rope_base: Default::default(),
                            },
                        },
                    },
                },
            })
            .collect()
    }
}

/// A Gemma-4-like model with seeded random weights.
#[derive(Clone, Debug)]
pub struct GemmaLike {
    /// Hyper-parameters.
    pub config: GemmaLikeConfig,
    stack: Stack,
}

impl GemmaLike {
    /// Draws the weights from `config.seed`.
    pub fn new(config: GemmaLikeConfig) -> Result<Self, ModelError> {
        config.validate()?;
        let mut rng = ChaCha20Rng::seed_from_u64(config.seed);
        let e = config.embedding;
        let embed = Dense::uniform(config.vocab, e, 1.0, &mut rng);
        let blocks = config
            .layers
            .iter()
            .enumerate()
            .map(|(l, layer)| Block {
                mixer_norm: vec![1.0; e],
                mixer: Mixer::Attention(AttentionBlock::random(
                    l,
                    e,
                    config.layer_geometry(layer),
                    layer.shares.is_none(),
                    &mut rng,
                )),
                mlp_norm: vec![1.0; e],
                mlp: SwiGluMlp::random(e, config.feed_forward, &mut rng),
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

    /// A cache for up to `capacity` tokens with the codecs `allocation` chooses for the
    /// sliding and full KV states.
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

    /// The forward pass with the attention on `backend` — the GPU's
    /// ([`WgpuAttention`](crate::llama::WgpuAttention) built from a cache of this model, whose
    /// sharing layers read their producers' GPU caches), or a [`CpuAttention`] over a
    /// `ModelCache`, which gives what [`forward`](Self::forward) gives.
    ///
    /// [`CpuAttention`]: crate::llama::CpuAttention
    pub fn forward_with<'s>(
        &self,
        tokens: &[u32],
        positions: &[u32],
        backend: &mut dyn AttentionBackend,
        logits: Logits,
        scratch: &'s mut HybridScratch,
    ) -> Result<&'s [f32], ModelError> {
        self.stack
            .forward_with(tokens, positions, backend, logits, scratch)
    }

    /// Vocabulary size.
    pub fn vocab(&self) -> usize {
        self.config.vocab
    }
}
