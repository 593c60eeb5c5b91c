//! `--max-cache-bytes` and the up-front checks every command that builds a model cache runs
//! (the checks themselves are `tq_models::limits`).

use clap::Args;
use tq_cache::allocation::Allocation;
use tq_models::causal_lm::CausalLm;
use tq_models::limits::{LimitError, check_context, check_layers_budget, default_cache_budget};

/// The cache memory budget of a command.
#[derive(Args, Debug, Clone, Copy, Default)]
pub struct CacheBudgetArgs {
    /// Refuse, before running, a cache whose bytes (codes, norms, metadata, full-precision
    /// windows, positions; by formula) would exceed this many bytes. Default: half of the
    /// machine's physical memory (no limit where that is unknown).
    #[arg(long, value_name = "BYTES")]
    pub max_cache_bytes: Option<u64>,
}

impl CacheBudgetArgs {
    /// The budget in force: the flag, or the default.
    pub fn budget(&self) -> Option<u64> {
        self.max_cache_bytes.or_else(default_cache_budget)
    }
}

/// Checks that `tokens` (what `what` needs) fit `model`'s window and that each allocation's
/// cache for them fits the budget. The budget check counts every layer at `tokens` tokens: on
/// a model with sliding-window layers (bounded by their rings) it overestimates, never under.
pub fn check_run<'a>(
    model: &dyn CausalLm,
    allocations: impl IntoIterator<Item = &'a Allocation>,
    tokens: usize,
    what: &str,
    budget: &CacheBudgetArgs,
) -> Result<(), LimitError> {
    let dims = model.dims();
    check_context(what, tokens, dims.context_length)?;
    let Some(budget) = budget.budget() else {
        return Ok(());
    };
    let shape = dims.model_shape();
    let rings = model.ring_slots();
    for allocation in allocations {
        check_layers_budget(allocation, &shape, &rings, tokens, budget)?;
    }
    Ok(())
}
