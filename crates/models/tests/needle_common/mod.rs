//! The needle golden grids: one prompt per (context, depth), answered through each cache; the
//! cells a snapshot pins.
#![allow(dead_code)]

use serde::Serialize;
use tq_cache::allocation::Allocation;
use tq_models::causal_lm::CausalLm;
use tq_models::needle::{NeedleOptions, NeedleSpec, PromptStyle, build_prompt, run_prompt};
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

/// Every (context, depth, allocation) cell of `spec` on `model`, prompts framed by `style`.
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
    let mut cells = Vec::new();
    for &context in contexts {
        for &depth in depths {
            let prompt =
                build_prompt(&tokenizer, style, spec, context, depth).expect("the prompt builds");
            for allocation in &allocations {
                let row = run_prompt(
                    model,
                    &tokenizer,
                    &prompt,
                    &allocation.name,
                    allocation,
                    context,
                    depth,
                    options,
                )
                .expect("the cell runs");
                cells.push(Cell {
                    hit: row.hit(),
                    alloc: row.alloc,
                    context,
                    depth,
                    prompt_tokens: row.prompt_tokens,
                    expected: row.expected,
                    score_case_insensitive: row.score_case_insensitive,
                    answer: row.answer,
                });
            }
        }
    }
    cells
}
