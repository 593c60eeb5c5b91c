//! Buffers of one hybrid forward call, reused across calls.

/// Working memory of [`Stack::forward`](super::stack::Stack::forward): after the first call
/// of a given chunk size nothing is allocated per token (buffers only grow).
#[derive(Debug, Default)]
pub struct HybridScratch {
    /// `[n, embedding]` residual stream.
    pub(crate) x: Vec<f32>,
    /// `[n, embedding]` normalized input of a sub-block.
    pub(crate) h: Vec<f32>,
    /// `[n, embedding]` a sub-block's output before the residual add.
    pub(crate) delta: Vec<f32>,
    /// Attention: `[n, q_heads·head_dim]` queries and output, `[n, kv_heads·head_dim]` K, V.
    pub(crate) q: Vec<f32>,
    pub(crate) k: Vec<f32>,
    pub(crate) v: Vec<f32>,
    pub(crate) attn: Vec<f32>,
    /// MLP: `[n, hidden]`.
    pub(crate) gate: Vec<f32>,
    pub(crate) up: Vec<f32>,
    /// DeltaNet: `[n, channels]` projected and convolved q|k|v, `[n, heads·d_v]` gate and
    /// output, `[n, heads]` write strength and decay inputs, per-head temporaries.
    pub(crate) mixed: Vec<f32>,
    pub(crate) conv: Vec<f32>,
    pub(crate) z: Vec<f32>,
    pub(crate) o: Vec<f32>,
    pub(crate) beta: Vec<f32>,
    pub(crate) decay: Vec<f32>,
    pub(crate) head_k: Vec<f32>,
    pub(crate) head_q: Vec<f32>,
    pub(crate) head_delta: Vec<f32>,
    /// `[n or 1, vocab]`.
    pub(crate) logits: Vec<f32>,
}
