//! User-facing subcommands other than benchmarks.

pub mod codebook;
pub mod demo;
pub mod model;
