//! Pass-key retrieval on the real model: the "needle in a haystack" harness.
//!
//! A [`NeedleSpec`] says what to hide and what to ask: filler text repeated to the context
//! length, a needle sentence inserted at a depth, a question after the haystack, and the facts
//! the answer must contain. [`prompt::build_prompt`] lays the prompt out in tokens, framed by
//! a [`PromptStyle`] (the model's chat template, or completion text with a `Question:` /
//! `Answer:` cue for a base model), [`run_cell`] prefills it in chunks through a compressed
//! cache — so the cache's quantization affects the prompt, not only the answer — decodes
//! greedily and [`score`](score::score) counts the facts found, with exact and
//! case-insensitive matching as the evaluation seed does. One call is one cell of the
//! (allocation, context, depth) grid and yields one [`NeedleRow`]; [`run_grid`] runs a whole
//! grid, one cell at a time or concurrently ([`CellOrder`]); [`paired_hits`] compares two
//! allocations over the same cells (McNemar's exact test: `tq needle --key-seeds` runs a grid
//! per pass key for it). With [`NeedleOptions::needle_attention`] a cell also measures how
//! much weight each query head puts on the needle while the model answers, and
//! [`rank_retrieval_heads`] ranks the KV heads by it (`tq needle --needle-attention`); with
//! [`NeedleOptions::exact_needle`] it answers with the needle's own tokens read exactly, every
//! other token as the cache stores it (an oracle for per-token precision, `tq needle
//! --exact-needle`).

mod attention;
mod error;
mod exact;
mod grid;
mod kept;
mod paired;
pub mod prompt;
mod run;
pub mod score;
mod spec;
mod style;
#[cfg(test)]
mod test_cache;
mod window_attention;

pub use attention::{NeedleAttention, RetrievalHead, rank_retrieval_heads};
pub use error::NeedleError;
pub use exact::{ExactChoice, ExactNeedle, NeedleStreams};
pub use grid::{CellOrder, NeedleGrid, run_grid};
pub use kept::KeptTokens;
pub use paired::{PairedHits, paired_hits};
pub use prompt::{NeedlePrompt, build_prompt};
pub use run::{NeedleOptions, NeedleRow, run_cell, run_prompt};
pub use score::{FactScore, score};
pub use spec::{KEY_PLACEHOLDER, NeedleSpec};
pub use style::PromptStyle;
pub use window_attention::WindowAttention;
