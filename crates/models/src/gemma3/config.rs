//! Gemma 3 hyper-parameters from GGUF metadata, with the reference engine's defaults for the
//! keys a file may leave out.

use serde::Serialize;

use crate::gguf::Gguf;
use crate::llama::ModelError;

/// Which positions a layer attends to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LayerKind {
    /// The last `sliding_window` positions (the query's own included); its cache is a ring.
    Sliding,
    /// Every earlier position; its cache grows.
    Global,
}

/// The shape of a Gemma 3 model.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Gemma3Config {
    /// Transformer blocks.
    pub layers: usize,
    /// Residual width.
    pub embedding: usize,
    /// GELU-gated MLP hidden width.
    pub feed_forward: usize,
    /// Query heads.
    pub heads: usize,
    /// KV heads (GQA).
    pub kv_heads: usize,
    /// Key and value dimension per head (not `embedding / heads`: Gemma 3 270M has 640 wide
    /// residuals and 4 × 256 query dims).
    pub head_dim: usize,
    /// RoPE base of the global layers (`gemma3.rope.freq_base`).
    pub rope_base_global: f32,
    /// RoPE base of the sliding layers (`gemma3.rope.freq_base_swa`; 10 000 when absent, as the
    /// reference engine assumes).
    pub rope_base_sliding: f32,
    /// Positions a sliding layer sees (`gemma3.attention.sliding_window`), at most
    /// `context_length`: a longer window is the whole context (positions at or beyond the
    /// context are refused, so no query has keys further back), and taken as such, so the
    /// sliding layers' rings are no larger than the context needs.
    pub sliding_window: usize,
    /// Every `sliding_pattern`-th layer is global (layers `p−1, 2p−1, …`); the reference
    /// engine's Gemma 3 default is 6.
    pub sliding_pattern: usize,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// Trained context length.
    pub context_length: usize,
    /// Vocabulary size.
    pub vocab: usize,
}

fn inconsistent(why: String) -> ModelError {
    ModelError::Unsupported(format!("inconsistent gemma3 metadata: {why}"))
}

impl Gemma3Config {
    /// Reads `gemma3.*` metadata; other architectures and inconsistent keys are refused with
    /// an error naming the key.
    pub fn from_gguf(gguf: &Gguf) -> Result<Self, ModelError> {
        let m = gguf.metadata();
        let arch = m.str("general.architecture")?;
        if arch != "gemma3" {
            return Err(ModelError::Unsupported(format!(
                "architecture `{arch}` (this runner implements `gemma3`)"
            )));
        }
        let get = |key: &str| -> Result<usize, ModelError> {
            Ok(m.u32(&format!("gemma3.{key}"))? as usize)
        };
        let heads = get("attention.head_count")?;
        let kv_heads = match m.get("gemma3.attention.head_count_kv") {
            Some(_) => get("attention.head_count_kv")?,
            None => heads,
        };
        if heads == 0 || kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
            return Err(inconsistent(format!(
                "{heads} query heads cannot share {kv_heads} KV heads"
            )));
        }
        let embedding = get("embedding_length")?;
        let head_dim = match m.get("gemma3.attention.key_length") {
            Some(_) => get("attention.key_length")?,
            None => embedding / heads,
        };
        let value_dim = match m.get("gemma3.attention.value_length") {
            Some(_) => get("attention.value_length")?,
            None => head_dim,
        };
        if value_dim != head_dim || head_dim == 0 || !head_dim.is_multiple_of(2) {
            return Err(inconsistent(format!(
                "key_length {head_dim} and value_length {value_dim} must be equal and even"
            )));
        }
        let optional_f32 = |key: &str, default: f32| -> Result<f32, ModelError> {
            let key = format!("gemma3.{key}");
            Ok(match m.get(&key) {
                Some(_) => m.f32(&key)?,
                None => default,
            })
        };
        let sliding_window = get("attention.sliding_window")?;
        if sliding_window == 0 {
            return Err(inconsistent(
                "gemma3.attention.sliding_window is 0".to_string(),
            ));
        }
        let vocab = gguf
            .tensor_info("token_embd.weight")
            .and_then(|t| t.dims.get(1).copied())
            .ok_or_else(|| ModelError::Unsupported("no token_embd.weight tensor".into()))?
            as usize;
        let context_length = get("context_length")?;
        let config = Self {
            layers: get("block_count")?,
            embedding,
            feed_forward: get("feed_forward_length")?,
            heads,
            kv_heads,
            head_dim,
            rope_base_global: optional_f32("rope.freq_base", 1_000_000.0)?,
            rope_base_sliding: optional_f32("rope.freq_base_swa", 10_000.0)?,
            sliding_window: sliding_window.min(context_length.max(1)),
            sliding_pattern: 6,
            rms_eps: m.f32("gemma3.attention.layer_norm_rms_epsilon")?,
            context_length,
            vocab,
        };
        if config.layers == 0 || config.embedding == 0 || config.feed_forward == 0 {
            return Err(inconsistent(
                "block_count, embedding_length and feed_forward_length must be positive".into(),
            ));
        }
        Ok(config)
    }

    /// Whether `layer` attends to a sliding window or to everything.
    pub fn layer_kind(&self, layer: usize) -> LayerKind {
        if (layer + 1).is_multiple_of(self.sliding_pattern) {
            LayerKind::Global
        } else {
            LayerKind::Sliding
        }
    }

    /// The RoPE base of `layer`.
    pub fn rope_base(&self, layer: usize) -> f32 {
        match self.layer_kind(layer) {
            LayerKind::Sliding => self.rope_base_sliding,
            LayerKind::Global => self.rope_base_global,
        }
    }

    /// The scale queries are multiplied by before attention (`1/√head_dim`; attention itself
    /// then scales scores by 1).
    pub fn query_scale(&self) -> f32 {
        1.0 / (self.head_dim as f32).sqrt()
    }

    /// The scale of the embedding rows (`√embedding`).
    pub fn embedding_scale(&self) -> f32 {
        (self.embedding as f32).sqrt()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Gemma3Config {
        Gemma3Config {
            layers: 18,
            embedding: 640,
            feed_forward: 2048,
            heads: 4,
            kv_heads: 1,
            head_dim: 256,
            rope_base_global: 1e6,
            rope_base_sliding: 1e4,
            sliding_window: 512,
            sliding_pattern: 6,
            rms_eps: 1e-6,
            context_length: 32_768,
            vocab: 262_144,
        }
    }

    #[test]
    fn every_sixth_layer_is_global_with_its_own_rope_base() {
        let c = config();
        let global: Vec<usize> = (0..c.layers)
            .filter(|&l| c.layer_kind(l) == LayerKind::Global)
            .collect();
        assert_eq!(global, [5, 11, 17]);
        assert_eq!(c.rope_base(5), 1e6);
        assert_eq!(c.rope_base(4), 1e4);
        assert_eq!(c.query_scale(), 1.0 / 16.0);
    }
}
