//! Every Gemma 3 weight, borrowed from the memory-mapped file like Llama's (nothing copied but
//! the f32 norm vectors).

use std::sync::Arc;

use super::Gemma3Config;
use crate::gguf::Gguf;
use crate::llama::ModelError;
use crate::llama::weights::{Weight, matrix, vector};

/// The weights of one Gemma 3 block: four norms around the two sub-blocks, and the QK-norms.
#[derive(Clone, Debug)]
pub struct Gemma3LayerWeights {
    /// RMSNorm before attention, `[embedding]`.
    pub attn_norm: Vec<f32>,
    /// `[heads·head_dim, embedding]`.
    pub q: Weight,
    /// `[kv_heads·head_dim, embedding]`.
    pub k: Weight,
    /// `[kv_heads·head_dim, embedding]`.
    pub v: Weight,
    /// Per-head RMSNorm of queries, `[head_dim]`, shared by every head.
    pub q_norm: Vec<f32>,
    /// Per-head RMSNorm of keys, `[head_dim]`.
    pub k_norm: Vec<f32>,
    /// `[embedding, heads·head_dim]`.
    pub o: Weight,
    /// RMSNorm of the attention output before the residual add, `[embedding]`.
    pub post_attention_norm: Vec<f32>,
    /// RMSNorm before the MLP, `[embedding]`.
    pub ffn_norm: Vec<f32>,
    /// `[feed_forward, embedding]`.
    pub gate: Weight,
    /// `[feed_forward, embedding]`.
    pub up: Weight,
    /// `[embedding, feed_forward]`.
    pub down: Weight,
    /// RMSNorm of the MLP output before the residual add, `[embedding]`.
    pub post_ffw_norm: Vec<f32>,
}

/// All Gemma 3 weights. The output head is the token embedding (tied), unless the file has
/// an `output.weight`.
#[derive(Clone, Debug)]
pub struct Gemma3Weights {
    /// `[vocab, embedding]` token embeddings.
    pub token_embd: Weight,
    /// Final RMSNorm, `[embedding]`.
    pub output_norm: Vec<f32>,
    /// `[vocab, embedding]` output head.
    pub output: Weight,
    /// The blocks.
    pub layers: Vec<Gemma3LayerWeights>,
}

impl Gemma3Weights {
    /// Maps every tensor the config needs, checking names, shapes and formats. The norm
    /// weights are used as stored: GGUF conversion already added Gemma's `+1`.
    pub fn load(file: &Arc<Gguf>, config: &Gemma3Config) -> Result<Self, ModelError> {
        let e = config.embedding;
        let d = config.head_dim;
        let q_dim = config.heads * d;
        let kv_dim = config.kv_heads * d;
        let f = config.feed_forward;
        let token_embd = matrix(file, "token_embd.weight", config.vocab, e)?;
        let output = match file.tensor_info("output.weight") {
            Some(_) => matrix(file, "output.weight", config.vocab, e)?,
            None => token_embd.clone(),
        };
        let layers = (0..config.layers)
            .map(|l| {
                let name = |t: &str| format!("blk.{l}.{t}.weight");
                Ok(Gemma3LayerWeights {
                    attn_norm: vector(file, &name("attn_norm"), e)?,
                    q: matrix(file, &name("attn_q"), q_dim, e)?,
                    k: matrix(file, &name("attn_k"), kv_dim, e)?,
                    v: matrix(file, &name("attn_v"), kv_dim, e)?,
                    q_norm: vector(file, &name("attn_q_norm"), d)?,
                    k_norm: vector(file, &name("attn_k_norm"), d)?,
                    o: matrix(file, &name("attn_output"), e, q_dim)?,
                    post_attention_norm: vector(file, &name("post_attention_norm"), e)?,
                    ffn_norm: vector(file, &name("ffn_norm"), e)?,
                    gate: matrix(file, &name("ffn_gate"), f, e)?,
                    up: matrix(file, &name("ffn_up"), f, e)?,
                    down: matrix(file, &name("ffn_down"), e, f)?,
                    post_ffw_norm: vector(file, &name("post_ffw_norm"), e)?,
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        Ok(Self {
            token_embd,
            output_norm: vector(file, "output_norm.weight", e)?,
            output,
            layers,
        })
    }
}
