//! The TurboQuant vector codecs: TQ_mse, TQ_prod and the debiased-MSE estimator.
//!
//! Every codec stores, per vector, b-bit codes packed little-endian into `u32` words (see
//! [`packing`]) and an f16 norm; TQ_prod adds packed QJL sign bits and an f16 residual norm `γ`.
//! Encoding and decoding take caller-owned buffers and a [`CodecScratch`], so the hot path
//! allocates nothing; the owned `encode`/`decode` forms are for convenience and tests.

mod debiased;
mod error;
mod input;
mod mse;
pub mod packing;
mod prod;
mod q8;

pub use debiased::DebiasedMse;
pub use error::CodecError;
pub(crate) use input::{checked_norm, dot};
pub use mse::{CodecScratch, MseCode, MseSpec, TqMse};
pub use prod::{PreparedQuery, ProdCode, ProdSpec, TqProd};
pub use q8::{Q8_ROTATION_SEED, Q8Window};
