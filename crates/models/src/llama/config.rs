//! Llama hyper-parameters from GGUF metadata.

use serde::Serialize;

use super::ModelError;
use crate::gguf::Gguf;

/// The shape of a Llama model.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LlamaConfig {
    /// Transformer blocks.
    pub layers: usize,
    /// Embedding width.
    pub embedding: usize,
    /// SwiGLU hidden width.
    pub feed_forward: usize,
    /// Query heads.
    pub heads: usize,
    /// KV heads (GQA).
    pub kv_heads: usize,
    /// Head dimension.
    pub head_dim: usize,
    /// Dimensions RoPE rotates (the whole head unless the file says otherwise).
    pub rope_dims: usize,
    /// RoPE base frequency.
    pub rope_base: f32,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// Trained context length.
    pub context_length: usize,
    /// Vocabulary size.
    pub vocab: usize,
}

impl LlamaConfig {
    /// Reads `llama.*` metadata; other architectures are refused with a clear error.
    pub fn from_gguf(gguf: &Gguf) -> Result<Self, ModelError> {
        let m = gguf.metadata();
        let arch = m.str("general.architecture")?;
        if arch != "llama" {
            return Err(ModelError::Unsupported(format!(
                "architecture `{arch}` (this runner implements `llama`)"
            )));
        }
        let heads = m.u32("llama.attention.head_count")? as usize;
        let embedding = m.u32("llama.embedding_length")? as usize;
        if heads == 0 || !embedding.is_multiple_of(heads) {
            return Err(ModelError::Unsupported(format!(
                "{embedding} embedding dims do not split into {heads} heads"
            )));
        }
        let head_dim = embedding / heads;
        let kv_heads = match m.get("llama.attention.head_count_kv") {
            Some(_) => m.u32("llama.attention.head_count_kv")? as usize,
            None => heads,
        };
        if kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
            return Err(ModelError::Unsupported(format!(
                "{heads} query heads cannot share {kv_heads} KV heads"
            )));
        }
        let rope_dims = match m.get("llama.rope.dimension_count") {
            Some(_) => m.u32("llama.rope.dimension_count")? as usize,
            None => head_dim,
        };
        let vocab = gguf
            .tensor_info("token_embd.weight")
            .and_then(|t| t.dims.get(1).copied())
            .ok_or_else(|| ModelError::Unsupported("no token_embd.weight tensor".into()))?
            as usize;
        Ok(Self {
            layers: m.u32("llama.block_count")? as usize,
            embedding,
            feed_forward: m.u32("llama.feed_forward_length")? as usize,
            heads,
            kv_heads,
            head_dim,
            rope_dims: rope_dims.min(head_dim),
            rope_base: match m.get("llama.rope.freq_base") {
                Some(_) => m.f32("llama.rope.freq_base")?,
                None => 10_000.0,
            },
            rms_eps: m.f32("llama.attention.layer_norm_rms_epsilon")?,
            context_length: m.u32("llama.context_length")? as usize,
            vocab,
        })
    }

    /// f16 cache bytes per token (keys and values of every layer): the baseline a compressed
    /// cache is measured against.
    pub fn f16_cache_bytes_per_token(&self) -> usize {
        self.layers * self.kv_heads * self.head_dim * 2 * 2
    }
}
