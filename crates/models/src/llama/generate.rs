//! The generation loop: chunked prefill through the cache, then one-token decode steps, over
//! the CPU cache ([`generate`]) or any [`AttentionBackend`] ([`generate_with`]).

use std::time::Instant;

use serde::Serialize;
use tq_cache::attention::AttentionKernel;
use tq_cache::states::ModelCache;

use super::attention_backend::{AttentionBackend, CpuAttention};
use super::model::{ForwardScratch, Logits};
use super::{ModelError, Sampler};
use crate::causal_lm::CausalLm;

/// How to generate.
#[derive(Clone, Debug)]
pub struct GenerationOptions {
    /// New tokens at most.
    pub max_tokens: usize,
    /// Prompt tokens per forward call: every chunk attends to the compressed past, so the
    /// cache's quantization affects the prompt too.
    pub prefill_chunk: usize,
    /// Attention kernel.
    pub kernel: AttentionKernel,
    /// Tokens that end generation (not emitted), e.g. `<|im_end|>` and eos.
    pub stop_tokens: Vec<u32>,
}

impl Default for GenerationOptions {
    fn default() -> Self {
        Self {
            max_tokens: 64,
            prefill_chunk: 256,
            kernel: AttentionKernel::Fused,
            stop_tokens: Vec::new(),
        }
    }
}

/// What a generation produced and how fast.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Generation {
    /// The generated tokens (stop token excluded).
    pub tokens: Vec<u32>,
    /// Prompt tokens processed.
    pub prompt_tokens: usize,
    /// Seconds spent on the prompt (including the first token's logits).
    pub prefill_seconds: f64,
    /// Seconds spent on decode steps.
    pub decode_seconds: f64,
    /// Decode steps run.
    pub decode_steps: usize,
    /// Whether a stop token ended it.
    pub stopped: bool,
}

impl Generation {
    /// Prompt tokens per second.
    pub fn prefill_tokens_per_s(&self) -> f64 {
        self.prompt_tokens as f64 / self.prefill_seconds.max(f64::MIN_POSITIVE)
    }

    /// Decode steps per second.
    pub fn decode_tokens_per_s(&self) -> f64 {
        if self.decode_steps == 0 {
            return 0.0;
        }
        self.decode_steps as f64 / self.decode_seconds.max(f64::MIN_POSITIVE)
    }
}

/// Runs the prompt (after whatever `cache` already holds) and generates up to
/// `options.max_tokens` tokens, calling `on_token` for each as it is chosen. Attention runs
/// on the CPU with `options.kernel`; [`generate_with`] takes any backend.
pub fn generate(
    model: &dyn CausalLm,
    cache: &mut ModelCache,
    prompt: &[u32],
    sampler: &mut Sampler,
    options: &GenerationOptions,
    on_token: impl FnMut(u32),
) -> Result<Generation, ModelError> {
    let start = cache.len();
    let mut backend = CpuAttention {
        cache,
        kernel: options.kernel,
    };
    generate_with(
        model,
        &mut backend,
        start,
        prompt,
        sampler,
        options,
        on_token,
    )
}

/// [`generate`] with attention delegated to `backend` (the CPU cache, the GPU kernels, or an
/// instrumented backend) whose cache already holds `start` tokens (positions `0..start`).
/// `options.kernel` is ignored: the backend decides how attention runs.
pub fn generate_with(
    model: &dyn CausalLm,
    backend: &mut dyn AttentionBackend,
    start: usize,
    prompt: &[u32],
    sampler: &mut Sampler,
    options: &GenerationOptions,
    mut on_token: impl FnMut(u32),
) -> Result<Generation, ModelError> {
    if prompt.is_empty() {
        return Err(ModelError::InvalidCall("empty prompt".into()));
    }
    let mut scratch = ForwardScratch::default();
    let total = start + prompt.len() + options.max_tokens;
    let positions: Vec<u32> = (0..total as u32).collect();
    let mut generation = Generation {
        prompt_tokens: prompt.len(),
        ..Generation::default()
    };
    let clock = Instant::now();
    let chunk = options.prefill_chunk.clamp(1, model.max_chunk());
    let mut done = start;
    let mut next = 0u32;
    for piece in prompt.chunks(chunk) {
        done += piece.len();
        let logits = model.forward_with(
            piece,
            &positions[..done],
            backend,
            Logits::Last,
            &mut scratch,
        )?;
        next = sampler.sample(logits);
    }
    generation.prefill_seconds = clock.elapsed().as_secs_f64();
    let clock = Instant::now();
    for step in 0..options.max_tokens {
        if options.stop_tokens.contains(&next) {
            generation.stopped = true;
            break;
        }
        generation.tokens.push(next);
        on_token(next);
        if step + 1 == options.max_tokens {
            break;
        }
        done += 1;
        let logits = model.forward_with(
            &[next],
            &positions[..done],
            backend,
            Logits::Last,
            &mut scratch,
        )?;
        next = sampler.sample(logits);
        generation.decode_steps += 1;
    }
    generation.decode_seconds = clock.elapsed().as_secs_f64();
    Ok(generation)
}
