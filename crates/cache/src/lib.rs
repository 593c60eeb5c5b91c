//! # tq-cache
//!
//! The TurboQuant codecs that compress key and value vectors, and (in later work) the compressed
//! KV cache built from them.
//!
//! - [`codec::TqMse`]: rotate with a seeded random orthogonal Π, quantize each coordinate with
//!   the Lloyd-Max codebook of the exact rotated-coordinate law `Beta((d−1)/2, (d−1)/2)` on
//!   [−1, 1], pack the b-bit codes into `u32` words, store the norm as f16.
//! - [`codec::TqProd`]: TQ_mse(b−1) plus a 1-bit QJL sketch of the residual: unbiased inner
//!   products.
//! - [`codec::DebiasedMse`]: TQ_mse inner products divided by `1 − D_mse(b)`: unbiased, with
//!   lower variance than TQ_prod at equal bits.
//!
//! The crate composes the three leaf crates `tq-lloyd-max`, `tq-rotation` and `tq-qjl`; it
//! depends on `half` for the f16 norms the packed layout stores.
//!
//! ```
//! use tq_cache::codec::{MseSpec, TqMse};
//! let codec = TqMse::new(MseSpec::new(128, 4, 42)).unwrap();
//! assert_eq!(codec.bytes_per_vector(), 128 * 4 / 8 + 2);
//! ```
#![deny(missing_docs)]

pub mod codec;
mod token_codec;

pub use token_codec::{CodecSpec, TokenCodec};
mod error;
pub mod record_order;
pub mod token_store;

pub use error::CacheError;
pub mod allocation;
pub mod attention;
pub mod basis;
pub mod center;
mod forward;
pub mod heavy_hitters;
pub mod kv_cache;
pub mod persist;
pub mod rope_center;
pub mod states;
pub mod stream;
pub mod two_tier;

/// The README's examples, compiled and run as doctests so they cannot rot.
#[doc = include_str!("../../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
pub mod synthetic_needle;
