//! Gemma 3 (the 270M base model is the second reference model): sliding-window and global
//! layers over the N-state cache, head dimension 256, 32K context.
//!
//! Read top to bottom: [`config`] reads the hyper-parameters (and the reference engine's
//! defaults for absent keys), [`weights`] maps the tensors, [`ops`] holds what Gemma adds to a
//! Llama block (NEOX RoPE, GELU-gated MLP, per-head RMSNorm), [`model`] is the forward pass,
//! which implements [`CausalLm`](crate::causal_lm::CausalLm) so every harness runs it.
//!
//! States: one KV state per layer, a ring of `window + max_chunk − 1` slots on the sliding
//! layers (15 of 18 on the 270M model) and a growing cache on the global ones, so the sliding
//! layers cost at most their ring whatever the context.

pub mod config;
pub mod model;
pub mod ops;
pub mod weights;

pub use config::{Gemma3Config, LayerKind};
pub use model::{DEFAULT_MAX_CHUNK, Gemma3};
pub use ops::Gelu;
