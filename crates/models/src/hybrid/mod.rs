//! Hybrid and multi-state architectures with deterministic random weights (no download):
//! the N-state cache of `tq-cache` driven by models whose states are not one K/V pair per
//! layer.
//!
//! - [`gemma::GemmaLike`]: sliding-window layers (ring buffers) beside full-attention layers
//!   with a larger head dimension, per-span RoPE, and KV-sharing layers.
//! - [`qwen::QwenLike`]: gated-DeltaNet layers with a fixed conv state `[kernel − 1, channels]`
//!   and a fixed recurrent state `[heads, d_k, d_v]`, every fourth layer full attention.
//!
//! Both declare their states as data (`state_specs` → `Vec<StateSpec>`: kind, shape, dtype,
//! truncatable), build a [`ModelCache`] from an allocation (TurboQuant on growing and sliding
//! KV states, f32 on fixed ones) and run the Llama model's call shape,
//! `forward(tokens, positions, &mut cache, kernel, logits, scratch)`, with
//! `offset = positions.len − tokens.len`: prefill, chunked prefill and decode are one call.
//! [`StatefulModel`] names that contract so code (tests, benchmarks) can drive any of them —
//! the Llama model included. [`GemmaLike::forward_with`] runs the same stack with its attention
//! on any [`AttentionBackend`](crate::llama::AttentionBackend) — the GPU's
//! ([`WgpuAttention`](crate::llama::WgpuAttention), whose sharing layers read their producers'
//! GPU caches) or the CPU's.
//!
//! ```
//! use tq_cache::allocation::Allocation;
//! use tq_cache::attention::AttentionKernel;
//! use tq_models::hybrid::{HybridScratch, QwenLike, QwenLikeConfig, feed_in_chunks};
//!
//! let model = QwenLike::new(QwenLikeConfig::tiny(7))?;
//! let mut cache = model.new_cache(&Allocation::preset("k5v4")?, 256)?;
//! let mut scratch = HybridScratch::default();
//! // A prompt in chunks of 4 tokens, then one decode step: the same call underneath.
//! let kernel = AttentionKernel::Fused;
//! let tokens = [1, 2, 3, 4, 5, 6];
//! let prompt = feed_in_chunks(&model, &mut cache, &tokens, &[4], kernel, &mut scratch)?;
//! assert_eq!(prompt.len(), 6 * model.vocab());
//! let next = feed_in_chunks(&model, &mut cache, &[7], &[1], kernel, &mut scratch)?;
//! assert_eq!((next.len(), cache.len()), (model.vocab(), 7));
//! // The DeltaNet states have absorbed tokens: a rewind is refused, a reset always works.
//! assert!(cache.truncate(3).is_err());
//! cache.reset();
//! assert_eq!(cache.len(), 0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Read top to bottom: [`dense`] (seeded f32 matrices), [`layers`] (RoPE settings, attention
//! through the cache, SwiGLU — over the Llama model's [`crate::llama::ops`]), [`delta_net`]
//! (the recurrent layer), [`stack`] (the residual stack every model here is), then the two
//! architectures, which only declare states and pick mixers.

pub mod delta_net;
pub mod dense;
pub mod drive;
pub mod gemma;
pub mod layers;
pub mod qwen;
mod scratch;
pub mod stack;

pub use drive::feed_in_chunks;
pub use gemma::{AttentionSpan, GemmaLayer, GemmaLike, GemmaLikeConfig, SpanSettings};
pub use qwen::{QwenLike, QwenLikeConfig};
pub use scratch::HybridScratch;

use tq_cache::allocation::Allocation;
use tq_cache::attention::AttentionKernel;
use tq_cache::states::{ModelCache, StateSpec};
use tq_cache::token_store::Growth;

use crate::llama::{ForwardScratch, Llama, Logits, ModelError};

/// A model whose memory between calls is a declared set of states, run by one forward call
/// for prefill, chunks and decode.
pub trait StatefulModel {
    /// Reusable buffers of one forward call.
    type Scratch: Default;

    /// The states, as data (growing KV states use `growth`).
    fn state_specs(&self, growth: Growth) -> Vec<StateSpec>;

    /// Vocabulary size (the width of one row of logits).
    fn vocab(&self) -> usize;

    /// A cache for up to `capacity` tokens with the codecs `allocation` chooses.
    fn new_cache(
        &self,
        allocation: &Allocation,
        capacity: usize,
    ) -> Result<ModelCache, ModelError> {
        Ok(ModelCache::with_allocation(
            self.state_specs(Growth::Static { capacity }),
            allocation,
        )?)
    }

    /// Runs `tokens` at the end of the sequence whose positions are `positions` and returns
    /// the logits (`[vocab]` for [`Logits::Last`], `[tokens.len, vocab]` for [`Logits::All`]).
    fn forward<'s>(
        &self,
        tokens: &[u32],
        positions: &[u32],
        cache: &mut ModelCache,
        kernel: AttentionKernel,
        logits: Logits,
        scratch: &'s mut Self::Scratch,
    ) -> Result<&'s [f32], ModelError>;
}

impl StatefulModel for GemmaLike {
    type Scratch = HybridScratch;

    fn state_specs(&self, growth: Growth) -> Vec<StateSpec> {
        GemmaLike::state_specs(self, growth)
    }

    fn vocab(&self) -> usize {
        GemmaLike::vocab(self)
    }

    fn forward<'s>(
        &self,
        tokens: &[u32],
        positions: &[u32],
        cache: &mut ModelCache,
        kernel: AttentionKernel,
        logits: Logits,
        scratch: &'s mut HybridScratch,
    ) -> Result<&'s [f32], ModelError> {
        GemmaLike::forward(self, tokens, positions, cache, kernel, logits, scratch)
    }
}

impl StatefulModel for QwenLike {
    type Scratch = HybridScratch;

    fn state_specs(&self, growth: Growth) -> Vec<StateSpec> {
        QwenLike::state_specs(self, growth)
    }

    fn vocab(&self) -> usize {
        QwenLike::vocab(self)
    }

    fn forward<'s>(
        &self,
        tokens: &[u32],
        positions: &[u32],
        cache: &mut ModelCache,
        kernel: AttentionKernel,
        logits: Logits,
        scratch: &'s mut HybridScratch,
    ) -> Result<&'s [f32], ModelError> {
        QwenLike::forward(self, tokens, positions, cache, kernel, logits, scratch)
    }
}

impl StatefulModel for Llama {
    type Scratch = ForwardScratch;

    fn state_specs(&self, growth: Growth) -> Vec<StateSpec> {
        Llama::state_specs(self, growth)
    }

    fn vocab(&self) -> usize {
        self.config.vocab
    }

    fn forward<'s>(
        &self,
        tokens: &[u32],
        positions: &[u32],
        cache: &mut ModelCache,
        kernel: AttentionKernel,
        logits: Logits,
        scratch: &'s mut ForwardScratch,
    ) -> Result<&'s [f32], ModelError> {
        Llama::forward(self, tokens, positions, cache, kernel, logits, scratch)
    }
}
