//! The (context, depth, allocation) grid every needle harness runs: one prompt per
//! (context, depth), answered through a fresh cache per allocation.

use rayon::prelude::*;
use tq_cache::allocation::Allocation;

use super::error::NeedleError;
use super::prompt::build_prompt;
use super::run::{NeedleOptions, NeedleRow, run_prompt};
use super::spec::NeedleSpec;
use super::style::PromptStyle;
use crate::causal_lm::CausalLm;
use crate::tokenizer::Tokenizer;

/// What a grid covers: the allocations (each with the name its rows carry), the contexts in
/// tokens and the needle depths in [0, 1].
#[derive(Clone, Copy, Debug)]
pub struct NeedleGrid<'a> {
    /// `(name, allocation)`, in the order their rows come out within a (context, depth).
    pub allocations: &'a [(&'a str, &'a Allocation)],
    /// Context lengths in tokens.
    pub contexts: &'a [usize],
    /// Needle depths.
    pub depths: &'a [f64],
}

/// How the cells of a grid share the machine.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CellOrder {
    /// One cell after another: each row's tokens/s is that cell's alone.
    #[default]
    OneAtATime,
    /// Every cell a task on rayon's pool, beside its forward passes' own tasks: one cell
    /// leaves cores idle through its serial steps, so a grid finishes sooner on several cores
    /// (about 1.8× on two), but the rows' tokens/s then share the cores, and every cell in
    /// flight holds a cache of its own (work stealing can start more cells than there are
    /// threads). The answers are the same: the kernels give the same bits whatever the thread
    /// count.
    Concurrent,
}

/// Runs every cell of `grid` on `model`: prompts of `spec` framed by `style`, in the order
/// context, depth, allocation; `on_cell` sees each row as it finishes (in finishing order,
/// which is the grid's order only for [`CellOrder::OneAtATime`]). Stops at the first error.
#[allow(clippy::too_many_arguments)]
pub fn run_grid(
    model: &dyn CausalLm,
    tokenizer: &Tokenizer,
    style: &PromptStyle,
    spec: &NeedleSpec,
    grid: &NeedleGrid<'_>,
    options: &NeedleOptions,
    order: CellOrder,
    on_cell: &(dyn Fn(&NeedleRow) + Sync),
) -> Result<Vec<NeedleRow>, NeedleError> {
    let mut prompts = Vec::with_capacity(grid.contexts.len() * grid.depths.len());
    for &context in grid.contexts {
        for &depth in grid.depths {
            let prompt = build_prompt(tokenizer, style, spec, context, depth)?;
            prompts.push((context, depth, prompt));
        }
    }
    let cells: Vec<_> = prompts
        .iter()
        .flat_map(|prompt| grid.allocations.iter().map(move |alloc| (prompt, alloc)))
        .collect();
    let run = |((context, depth, prompt), (name, allocation)): &(
        &(usize, f64, super::NeedlePrompt),
        &(&str, &Allocation),
    )| {
        let row = run_prompt(
            model, tokenizer, prompt, name, allocation, *context, *depth, options,
        )?;
        on_cell(&row);
        Ok(row)
    };
    match order {
        CellOrder::OneAtATime => cells.iter().map(run).collect(),
        CellOrder::Concurrent => cells.par_iter().with_max_len(1).map(run).collect(),
    }
}
