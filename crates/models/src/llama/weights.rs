//! Every weight of the model, borrowed from the memory-mapped file: nothing is copied or
//! dequantized up front, so resident memory is the file's pages the forward pass touches.

use std::sync::Arc;

use super::{LlamaConfig, ModelError};
use crate::gguf::Gguf;
use crate::quant::{QuantKind, QuantMatrix, dequantize_row};

/// The bytes of one tensor inside the shared file (a cheap handle: an `Arc` and a range).
#[derive(Clone, Debug)]
pub struct TensorBytes {
    file: Arc<Gguf>,
    start: usize,
    end: usize,
}

impl AsRef<[u8]> for TensorBytes {
    fn as_ref(&self) -> &[u8] {
        &self.file.bytes()[self.start..self.end]
    }
}

/// A weight matrix in its GGUF block format.
pub type Weight = QuantMatrix<TensorBytes>;

/// The weights of one transformer block.
#[derive(Clone, Debug)]
pub struct LayerWeights {
    /// RMSNorm before attention, `[embedding]`.
    pub attn_norm: Vec<f32>,
    /// `[heads·head_dim, embedding]`.
    pub q: Weight,
    /// `[kv_heads·head_dim, embedding]`.
    pub k: Weight,
    /// `[kv_heads·head_dim, embedding]`.
    pub v: Weight,
    /// `[embedding, heads·head_dim]`.
    pub o: Weight,
    /// RMSNorm before the MLP, `[embedding]`.
    pub ffn_norm: Vec<f32>,
    /// `[feed_forward, embedding]`.
    pub gate: Weight,
    /// `[feed_forward, embedding]`.
    pub up: Weight,
    /// `[embedding, feed_forward]`.
    pub down: Weight,
}

/// All weights.
#[derive(Clone, Debug)]
pub struct LlamaWeights {
    /// `[vocab, embedding]` token embeddings.
    pub token_embd: Weight,
    /// Final RMSNorm, `[embedding]`.
    pub output_norm: Vec<f32>,
    /// `[vocab, embedding]` output head (the embeddings themselves when tied).
    pub output: Weight,
    /// The blocks.
    pub layers: Vec<LayerWeights>,
}

/// The weight matrix `name`, checked to be `rows × cols` in a supported block format.
pub(crate) fn matrix(
    file: &Arc<Gguf>,
    name: &str,
    rows: usize,
    cols: usize,
) -> Result<Weight, ModelError> {
    let view = file.tensor_data(name)?;
    let expected = vec![cols as u64, rows as u64];
    if view.dims() != expected.as_slice() {
        return Err(ModelError::Shape {
            name: name.to_string(),
            expected,
            actual: view.dims().to_vec(),
        });
    }
    let kind = QuantKind::from_ggml_type(view.ggml_type().id())?;
    // The view borrows from the file's bytes: its offset is plain address arithmetic.
    let start = view.data.as_ptr() as usize - file.bytes().as_ptr() as usize;
    let bytes = TensorBytes {
        file: Arc::clone(file),
        start,
        end: start + view.data.len(),
    };
    Ok(QuantMatrix::new(kind, rows, cols, bytes)?)
}

/// The f32 vector `name` of length `len` (dequantized if stored otherwise).
pub(crate) fn vector(file: &Gguf, name: &str, len: usize) -> Result<Vec<f32>, ModelError> {
    let view = file.tensor_data(name)?;
    if view.dims() != [len as u64] {
        return Err(ModelError::Shape {
            name: name.to_string(),
            expected: vec![len as u64],
            actual: view.dims().to_vec(),
        });
    }
    let kind = QuantKind::from_ggml_type(view.ggml_type().id())?;
    let mut out = vec![0.0; len];
    dequantize_row(kind, view.data, &mut out)?;
    Ok(out)
}

impl LlamaWeights {
    /// Maps every tensor the config needs, checking names, shapes and formats.
    pub fn load(file: &Arc<Gguf>, config: &LlamaConfig) -> Result<Self, ModelError> {
        let e = config.embedding;
        let q_dim = config.heads * config.head_dim;
        let kv_dim = config.kv_heads * config.head_dim;
        let f = config.feed_forward;
        let token_embd = matrix(file, "token_embd.weight", config.vocab, e)?;
        let output = match file.tensor_info("output.weight") {
            Some(_) => matrix(file, "output.weight", config.vocab, e)?,
            None => token_embd.clone(),
        };
        let layers = (0..config.layers)
            .map(|l| {
                let name = |t: &str| format!("blk.{l}.{t}.weight");
                Ok(LayerWeights {
                    attn_norm: vector(file, &name("attn_norm"), e)?,
                    q: matrix(file, &name("attn_q"), q_dim, e)?,
                    k: matrix(file, &name("attn_k"), kv_dim, e)?,
                    v: matrix(file, &name("attn_v"), kv_dim, e)?,
                    o: matrix(file, &name("attn_output"), e, q_dim)?,
                    ffn_norm: vector(file, &name("ffn_norm"), e)?,
                    gate: matrix(file, &name("ffn_gate"), f, e)?,
                    up: matrix(file, &name("ffn_up"), f, e)?,
                    down: matrix(file, &name("ffn_down"), e, f)?,
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
