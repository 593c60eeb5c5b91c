//! User-facing subcommands other than benchmarks.

pub mod codebook;
pub mod demo;
pub mod eval;
pub mod kernel;
pub mod limits;
pub mod model;
pub mod needle;
pub mod perplexity;
pub mod sweep;
pub mod tokenize;
