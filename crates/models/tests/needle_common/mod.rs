//! The needle golden grids: one prompt per (context, depth), answered through each cache; the
//! cells a snapshot pins.
#![allow(dead_code)]

use serde::Serialize;
use tq_cache::allocation::Allocation;
use tq_models::causal_lm::CausalLm;
use tq_models::needle::{self, CellOrder, NeedleGrid, NeedleOptions, NeedleSpec, PromptStyle};
use tq_models::tokenizer::Tokenizer;

/// What a golden records of one cell.
#[derive(Serialize)]
pub struct Cell {
    pub alloc: String,
    pub context: usize,
    pub depth: f64,
    pub prompt_tokens: usize,
    pub expected: Vec<String>,
    pub hit: bool,
    pub score_case_insensitive: f64,
    pub answer: String,
}

/// Every (context, depth, allocation) cell of `spec` on `model`, prompts framed by `style`,
/// in that order, run concurrently ([`CellOrder::Concurrent`]: CI would otherwise wait on one
/// core through each cell's serial steps; the answers are the same).
pub fn run_grid(
    model: &dyn CausalLm,
    style: &PromptStyle,
    spec: &NeedleSpec,
    allocs: &[&str],
    contexts: &[usize],
    depths: &[f64],
    options: &NeedleOptions,
) -> Vec<Cell> {
    let tokenizer = Tokenizer::from_gguf(model.file()).expect("tokenizer");
    let allocations: Vec<Allocation> = allocs
        .iter()
        .map(|name| Allocation::preset(name).expect("a shipped preset"))
        .collect();
    let named: Vec<(&str, &Allocation)> = allocs.iter().copied().zip(&allocations).collect();
    let grid = NeedleGrid {
        allocations: &named,
        contexts,
        depths,
    };
    needle::run_grid(
        model,
        &tokenizer,
        style,
        spec,
        &grid,
        options,
        CellOrder::Concurrent,
        &|_| {},
    )
    .expect("the grid runs")
    .into_iter()
    .map(|row| Cell {
        hit: row.hit(),
        alloc: row.alloc,
        context: row.context,
        depth: row.depth,
        prompt_tokens: row.prompt_tokens,
        expected: row.expected,
        score_case_insensitive: row.score_case_insensitive,
        answer: row.answer,
    })
    .collect()
}
