//! # tq-attention-wgpu
//!
//! TurboQuant encode and decode attention in WGSL, run through wgpu (Vulkan on Linux — Mesa's
//! lavapipe where there is no GPU —, Metal on macOS, DX12 on Windows), reading the packed page
//! layout of `tq-cache` directly and tested against its CPU reference.
//!
//! - [`GpuContext`]: adapter, device, queue, the compiled kernels, and the [`SplitLimits`]
//!   that decide how context-sized data splits into bindings and dispatches.
//! - [`GpuKvCache`]: the GPU copy of one layer's `KvCache`: [`upload_all`] once, then one
//!   token's worth per decode step ([`encode_and_append`] encodes on the GPU,
//!   [`append_encoded`] / [`sync_from`] upload records the CPU encoded), and
//!   [`attend`] (flash-decoding over token blocks, GQA, causal and sliding masks).
//! - [`kernels`]: each kernel is a `.wgsl` file beside the `.rs` file that dispatches it.
//! - [`bench`](mod@bench): [`bench::decode_step_timing`], the decode-step timing
//!   `scripts/gpu-check.sh` reports (`tq bench attention --backend wgpu` times the same call on
//!   caches built from real encoded tokens).
//!
//! The model uses the crate through `tq_models::llama::WgpuAttention` (one [`GpuKvCache`] per
//! layer behind the model's `AttentionBackend` seam; `tq generate --backend wgpu`).
//!
//! What the GPU supports: every allocation the CPU cache stores on a KV layer — keys and
//! values as f32, f16, TQ_mse (b = 1..8), debiased TQ_mse or TQ_prod (b = 2..9; Gaussian, Haar
//! or Hadamard sketch), one codec per stream (per-head seeds); two tiers of TQ_mse (`tq3.5`,
//! `tq2.5`); a data-aware basis (`basis = "planes"` or `"pca"`: several code groups of
//! different widths, the scales folded into the query); mean-centering, and RoPE-aware key
//! centering (`center = "rope"`: the prepare kernel computes each query's score correction per
//! block of 16 keys from a device table of the blocks' angles, the attention and score kernels
//! add it); attention sinks and
//! recent windows (binary16 or 8-bit copies, `recent_dtype = "q8"`; a window per stream and KV
//! head; a prefill gives every query its own window, as decoding does) — so every preset and
//! lever file, the recommended `rec*` and their 8-bit-window versions included; head dimension ≤ 512,
//! growing or sliding layers; streams in the fast-scan order (`record_order = "fast-scan"`, the
//! recommended presets') keep it on the device, the CPU store's blocks as they are; heavy
//! hitters (`heavy_hitters = f`: the tokens that drew `f` times their uniform share of
//! attention in a window keep their window copy on the device, decided from the weights the
//! kernels hand back with the CPU stream's rule, [`tq_cache::heavy_hitters`]). Streams with any of the levers after the first are encoded on the
//! host, which calibrates them from the first batch (means, outlier channels, bases — a plane
//! basis weighed by the batch's queries) exactly as the CPU cache does and writes the copies.
//! Not supported (a typed [`GpuError::Unsupported`]): two-tier codecs with QJL or debiased
//! tiers; sink and window copies in f32; sink counts that differ between the streams of a
//! layer; RoPE-aware key centering on some KV heads of a layer only. All arithmetic is f32 (no `SHADER_F16` path yet).
//!
//! [`upload_all`]: GpuKvCache::upload_all
//! [`encode_and_append`]: GpuKvCache::encode_and_append
//! [`append_encoded`]: GpuKvCache::append_encoded
//! [`sync_from`]: GpuKvCache::sync_from
//! [`attend`]: GpuKvCache::attend
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod append;
mod attention;
pub mod bench;
mod cache;
mod context;
mod error;
mod heavy_hitters;
mod host_encode;
pub mod kernels;
mod page_records;
mod tables;
mod windows;

pub use append::EncodedTokens;
pub use cache::{Downloaded, GpuKvCache, MAX_PAGE_TOKENS};
pub use context::{ContextOptions, GpuContext, SplitLimits};
pub use error::GpuError;
pub use tables::StreamKind;

/// The README's example, compiled as a doctest so it cannot rot.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
