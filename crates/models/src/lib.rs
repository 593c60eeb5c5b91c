//! # tq-models (planned)
//!
//! This crate will hold the GGUF reader, the tokenizer built from GGUF metadata, and a
//! Llama-architecture forward pass that runs over any cache allocation of `tq-cache`
//! (or the GPU kernels of `tq-attention-wgpu`), plus the retrieval and quality harness.
//!
//! Nothing is implemented yet.

#![deny(missing_docs)]

pub mod gguf;

pub mod quant;
