//! `--max-cache-bytes` and the up-front checks every command that builds a model cache runs
//! (the checks themselves are `tq_models::limits`).

use clap::Args;
use tq_cache::allocation::{Allocation, ModelShape};
use tq_models::limits::{LimitError, check_cache_budget, check_context, default_cache_budget};
use tq_models::llama::Llama;

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
/// cache for them fits the budget.
pub fn check_run<'a>(
    model: &Llama,
    allocations: impl IntoIterator<Item = &'a Allocation>,
    tokens: usize,
    what: &str,
    budget: &CacheBudgetArgs,
) -> Result<(), LimitError> {
    check_context(what, tokens, model.config.context_length)?;
    let Some(budget) = budget.budget() else {
        return Ok(());
    };
    let shape = ModelShape {
        num_layers: model.config.layers,
        num_kv_heads: model.config.kv_heads,
        head_dim: model.config.head_dim,
    };
    for allocation in allocations {
        check_cache_budget(allocation, &shape, tokens, budget)?;
    }
    Ok(())
}
