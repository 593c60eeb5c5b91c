//! The buffers of a forward call and which positions get logits: shared by every model
//! architecture ([`crate::llama`], [`crate::gemma3`]), so callers hold one scratch type whatever
//! model they run.

use crate::quant::MatvecScratch;

/// Which positions get logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// Only the last token of the call (generation).
    Last,
    /// Every token of the call (perplexity, KL divergence).
    All,
}

/// Buffers of one forward call, reused across calls: after the first call of a given chunk
/// size nothing is allocated per token.
#[derive(Debug, Default)]
pub struct ForwardScratch {
    /// `[n, embedding]` residual stream.
    pub(crate) x: Vec<f32>,
    /// `[n, embedding]` normalized input of a sub-block.
    pub(crate) h: Vec<f32>,
    /// `[n, heads·head_dim]`.
    pub(crate) q: Vec<f32>,
    /// `[n, kv_heads·head_dim]`.
    pub(crate) k: Vec<f32>,
    /// `[n, kv_heads·head_dim]`.
    pub(crate) v: Vec<f32>,
    /// `[n, heads·head_dim]` attention output.
    pub(crate) attn: Vec<f32>,
    /// `[n, embedding]` a sub-block's output before the residual add.
    pub(crate) delta: Vec<f32>,
    /// `[n, feed_forward]`.
    pub(crate) gate: Vec<f32>,
    /// `[n, feed_forward]`.
    pub(crate) up: Vec<f32>,
    /// `[n or 1, vocab]`.
    pub(crate) logits: Vec<f32>,
    pub(crate) matvec: MatvecScratch,
}

impl ForwardScratch {
    /// Bytes the buffers hold (their capacities): the working memory of the largest call so
    /// far, what a memory budget adds to the cache for "one chunk of scratch".
    pub fn allocated_bytes(&self) -> usize {
        let floats: usize = [
            &self.x,
            &self.h,
            &self.q,
            &self.k,
            &self.v,
            &self.attn,
            &self.delta,
            &self.gate,
            &self.up,
            &self.logits,
        ]
        .iter()
        .map(|b| b.capacity())
        .sum();
        4 * floats + self.matvec.allocated_bytes()
    }
}

pub(crate) fn resize(buffer: &mut Vec<f32>, len: usize) {
    buffer.resize(len, 0.0);
}
