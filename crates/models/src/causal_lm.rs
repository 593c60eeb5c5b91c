//! One interface over every real model architecture: [`CausalLm`].
//!
//! The harnesses (generation, perplexity, KL divergence, needles, benchmarks) need the same few
//! things from a model whatever its architecture: its dimensions, its states, and the one
//! `forward(tokens, positions, cache, ...)` call that serves prefill chunks and decode. Llama
//! ([`crate::llama::Llama`], SmolLM2) and Gemma 3 ([`crate::gemma3::Gemma3`]) implement it;
//! [`load_model`] opens a GGUF file and picks the implementation from its
//! `general.architecture`.
//!
//! A trait object rather than an enum: the harnesses take `&dyn CausalLm`, so a new
//! architecture touches its own module and [`load_model`], not every caller.

use std::path::Path;
use std::sync::Arc;

use tq_cache::allocation::{Allocation, LayerKind, ModelShape};
use tq_cache::attention::AttentionKernel;
use tq_cache::states::{ModelCache, StateSpec};
use tq_cache::token_store::Growth;

use crate::forward_scratch::{ForwardScratch, Logits};
use crate::gemma3::Gemma3;
use crate::gguf::{Gguf, WeightMemory};
use crate::llama::{AttentionBackend, CpuAttention, Llama, ModelError};

/// The dimensions every harness reads, whatever the architecture.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelDims {
    /// Transformer blocks (one KV state each).
    pub layers: usize,
    /// Residual width.
    pub embedding: usize,
    /// Query heads.
    pub q_heads: usize,
    /// KV heads per layer.
    pub kv_heads: usize,
    /// Dimension of one key or value vector.
    pub head_dim: usize,
    /// Vocabulary size (logits per position).
    pub vocab: usize,
    /// Trained context length: positions at or beyond it are refused.
    pub context_length: usize,
}

impl ModelDims {
    /// The shape an [`Allocation`] resolves against.
    pub fn model_shape(&self) -> ModelShape {
        ModelShape {
            num_layers: self.layers,
            num_kv_heads: self.kv_heads,
            head_dim: self.head_dim,
        }
    }

    /// f16 bytes of one token's keys and values in one layer.
    pub fn f16_bytes_per_token_per_layer(&self) -> usize {
        self.kv_heads * self.head_dim * 2 * 2
    }
}

/// A causal language model over a memory-mapped GGUF file.
pub trait CausalLm: std::fmt::Debug + Send + Sync {
    /// The architecture as GGUF names it (`llama`, `gemma3`).
    fn architecture(&self) -> &'static str;

    /// The dimensions.
    fn dims(&self) -> ModelDims;

    /// The underlying file (metadata, tokenizer).
    fn file(&self) -> &Arc<Gguf>;

    /// The model's states, one KV state per layer (growing ones obtain memory with
    /// `growth`; sliding-window layers are rings whatever `growth` says).
    fn state_specs(&self, growth: Growth) -> Vec<StateSpec>;

    /// The longest chunk one forward call may carry (`usize::MAX` when any length is exact;
    /// a model with ring states is exact only up to the chunk its rings were sized for).
    fn max_chunk(&self) -> usize {
        usize::MAX
    }

    /// Per layer, the ring of a sliding-window layer (`Some(slots)`: it holds at most that
    /// many tokens, and its streams resolve as
    /// [`LayerKind::Sliding`]) or `None` for a
    /// global layer, which keeps every token.
    fn ring_slots(&self) -> Vec<Option<usize>> {
        let mut rings = vec![None; self.dims().layers];
        for spec in self.state_specs(Growth::Static { capacity: 1 }) {
            if let tq_cache::states::StateKind::Kv { layer, layout } = &spec.kind
                && let Some(ring) = rings.get_mut(*layer)
            {
                *ring = layout.ring_slots();
            }
        }
        rings
    }

    /// Per layer, whether it is a sliding-window or a global layer (what `layer_kind` in an
    /// allocation's `[[override]]` selects).
    fn layer_kinds(&self) -> Vec<LayerKind> {
        self.ring_slots()
            .iter()
            .map(|ring| match ring {
                Some(_) => LayerKind::Sliding,
                None => LayerKind::Global,
            })
            .collect()
    }

    /// f16 cache bytes of a sequence of `tokens` tokens: the baseline a compressed cache is
    /// measured against (a sliding-window layer holds at most its ring).
    fn f16_cache_bytes(&self, tokens: usize) -> usize {
        let per_layer = self.dims().f16_bytes_per_token_per_layer();
        self.ring_slots()
            .iter()
            .map(|ring| per_layer * ring.map_or(tokens, |slots| slots.min(tokens)))
            .sum()
    }

    /// A cache for up to `capacity` tokens with the codecs `allocation` chooses (allocated up
    /// front: decoding never allocates cache memory).
    fn new_cache(
        &self,
        allocation: &Allocation,
        capacity: usize,
    ) -> Result<ModelCache, ModelError> {
        let specs = self.state_specs(Growth::Static { capacity });
        Ok(ModelCache::with_allocation(specs, allocation)?)
    }

    /// Runs `tokens` at the end of the sequence whose positions are `positions`
    /// (`offset = positions.len − tokens.len` tokens are already cached) with attention
    /// delegated to `backend`, and returns the logits (`[vocab]` for [`Logits::Last`],
    /// `[tokens.len, vocab]` for [`Logits::All`]).
    ///
    /// The weight products and attention are rayon parallel iterators, some 200 per decoded
    /// token. Call this from inside a rayon pool (`pool.install(|| ...)` around the whole
    /// generation loop, as `tq` does): from any other thread, each of them hands its work to
    /// a worker and sleeps until it is done, which cost a fifth of SmolLM2's decode speed
    /// (`docs/results.md`, "Per-token overhead").
    fn forward_with<'s>(
        &self,
        tokens: &[u32],
        positions: &[u32],
        backend: &mut dyn AttentionBackend,
        logits: Logits,
        scratch: &'s mut ForwardScratch,
    ) -> Result<&'s [f32], ModelError>;

    /// [`CausalLm::forward_with`] with attention on the CPU over `cache` with `kernel`.
    fn forward<'s>(
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

    /// The llama.cpp-compatible attention kernel for this model: the one that rounds like the
    /// build of the reference engine whose outputs this project compares the model against
    /// (an AVX2 build for Llama/SmolLM2, an AVX512-FP16 build for Gemma 3). Use it together
    /// with [`CausalLm::set_llamacpp_numerics`].
    fn llamacpp_kernel(&self) -> AttentionKernel {
        AttentionKernel::LlamaCppF16
    }

    /// Switches the model's own elementwise numerics (beyond attention, which the kernel
    /// chooses) to the reference engine's where they differ from the exact functions — Gemma
    /// 3's GELU through llama.cpp's f16 table. Llama has nothing to switch.
    fn set_llamacpp_numerics(&mut self, _on: bool) {}
}

/// Opens a GGUF model file and builds the model its `general.architecture` names.
/// The file is held as [`WeightMemory::for_inference`] picks (read onto huge pages on Linux,
/// where a decode step streams the weights faster; `TQ_WEIGHTS=mapped` maps it instead).
///
/// Errors: the file's own ([`ModelError::Gguf`]), missing or inconsistent architecture keys,
/// or an architecture this crate does not run ([`ModelError::Unsupported`]).
pub fn load_model(path: impl AsRef<Path>) -> Result<Box<dyn CausalLm>, ModelError> {
    let file = Arc::new(Gguf::open_with(path, WeightMemory::for_inference())?);
    let arch = file.metadata().str("general.architecture")?.to_string();
    match arch.as_str() {
        "llama" => Ok(Box::new(Llama::from_gguf(file)?)),
        "gemma3" => Ok(Box::new(Gemma3::from_gguf(file)?)),
        other => Err(ModelError::Unsupported(format!(
            "architecture `{other}` (this crate runs `llama` and `gemma3`)"
        ))),
    }
}
