//! The Llama architecture (SmolLM2 is one), run over any cache of `tq-cache`.
//!
//! Read top to bottom: [`config`] reads the hyper-parameters from GGUF metadata, [`weights`]
//! maps every tensor without copying it, [`ops`] holds the small numeric pieces (RMSNorm,
//! RoPE, SwiGLU), [`model`] is the forward pass, [`sampling`] picks the next token and
//! [`generate`] loops them.
//!
//! One call serves prefill chunks and decode: `forward(tokens, positions, cache)` with
//! `offset = positions.len − tokens.len` (the cache holds the first `offset` tokens).
//! Attention sits behind [`attention_backend`]: the CPU cache, or the GPU kernels of
//! `tq-attention-wgpu` through [`wgpu_attention`].

pub mod attention_backend;
pub mod config;
mod error;
pub mod generate;
pub mod model;
pub mod ops;
pub mod sampling;
pub mod weights;
pub mod wgpu_attention;

pub use attention_backend::{AttentionBackend, CpuAttention};
pub use config::LlamaConfig;
pub use error::ModelError;
pub use generate::{Generation, GenerationOptions};
pub use model::{ForwardScratch, Llama, Logits};
pub use sampling::Sampler;
pub use wgpu_attention::WgpuAttention;
