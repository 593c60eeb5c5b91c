//! Resource limits checked before a run starts: a context beyond the model's window, or a cache
//! that would not fit the memory budget, is refused up front with the numbers, instead of
//! being discovered by a failed forward call or by the allocator half-way through a prefill.

use tq_cache::TokenCodec;
use tq_cache::allocation::{Allocation, AllocationError, LayerKind, ModelShape, StreamKind};
use tq_cache::basis::BasisPolicy;
use tq_cache::record_order::{FAST_SCAN_BLOCK, RecordOrder};

/// Why a run was refused before it started.
#[derive(Debug, thiserror::Error)]
pub enum LimitError {
    /// More tokens than the model's context window.
    #[error(
        "{what} needs {needed} tokens, beyond the model's context window of {window} tokens: \
         use a shorter prompt or context"
    )]
    ContextOverflow {
        /// What needs the tokens (`prompt + max tokens`, `--ctx`, ...).
        what: String,
        /// Tokens needed.
        needed: usize,
        /// The model's window.
        window: usize,
    },
    /// The cache would exceed the memory budget.
    #[error(
        "the `{allocation}` cache for {tokens} tokens needs {needed} bytes ({needed_mib:.1} MiB), \
         over the budget of {budget} bytes ({budget_mib:.1} MiB; --max-cache-bytes): raise the \
         budget, use fewer tokens or a smaller allocation",
        needed_mib = *needed as f64 / 1048576.0,
        budget_mib = *budget as f64 / 1048576.0
    )]
    OverBudget {
        /// The allocation's name.
        allocation: String,
        /// Tokens the cache would hold.
        tokens: usize,
        /// Its bytes by formula.
        needed: u64,
        /// The budget.
        budget: u64,
    },
    /// The allocation cannot be resolved on this model.
    #[error(transparent)]
    Allocation(#[from] AllocationError),
}

/// Refuses `needed` tokens beyond a `window`-token model.
pub fn check_context(what: &str, needed: usize, window: usize) -> Result<(), LimitError> {
    if needed > window {
        return Err(LimitError::ContextOverflow {
            what: what.to_owned(),
            needed,
            window,
        });
    }
    Ok(())
}

/// Bytes the cache of `allocation` holds for `tokens` tokens on a model of `shape`, by formula:
/// every stream's per-token record, its per-head metadata (outlier channel lists, means), the
/// full-precision sink and recent-window copies (all their slots, even where `tokens` is
/// fewer), and the 4-byte position of every token in
/// every layer. It is `ModelCache::memory`'s formula bytes of a cache that holds `tokens`
/// tokens in pages of exactly that size, plus the outlier channel lists of two-tier streams,
/// which that report leaves out (tested). A fitted basis (a few KiB per stream, known only
/// once fitted) is not included.
///
/// ```
/// use tq_cache::allocation::{Allocation, ModelShape};
/// use tq_models::limits::cache_bytes_for;
/// let shape = ModelShape { num_layers: 30, num_kv_heads: 3, head_dim: 64 };
/// let f16 = Allocation::preset("f16").unwrap();
/// // 30 layers × 3 heads × (keys + values) × 64 × 2 bytes, plus 30 positions of 4 bytes.
/// assert_eq!(cache_bytes_for(&f16, &shape, 1000).unwrap(), 1000 * (23_040 + 120));
/// ```
pub fn cache_bytes_for(
    allocation: &Allocation,
    shape: &ModelShape,
    tokens: usize,
) -> Result<u64, AllocationError> {
    cache_bytes_for_layers(allocation, shape, &vec![None; shape.num_layers], tokens)
}

/// [`cache_bytes_for`] on a model with sliding-window layers: `rings[l]` is `Some(slots)` for
/// a sliding layer, whose ring holds at most `slots` tokens (and whose streams resolve as
/// [`LayerKind::Sliding`]), `None` for a global layer. `rings` has one entry per layer.
///
/// ```
/// use tq_cache::allocation::{Allocation, ModelShape};
/// use tq_models::limits::cache_bytes_for_layers;
/// let shape = ModelShape { num_layers: 2, num_kv_heads: 1, head_dim: 256 };
/// let f16 = Allocation::preset("f16").unwrap();
/// // A global layer holds all 4096 tokens, a sliding one its 1023 slots: 1 KiB + 4 B each.
/// let bytes = cache_bytes_for_layers(&f16, &shape, &[None, Some(1023)], 4096).unwrap();
/// assert_eq!(bytes, (4096 + 1023) * (1024 + 4));
/// ```
pub fn cache_bytes_for_layers(
    allocation: &Allocation,
    shape: &ModelShape,
    rings: &[Option<usize>],
    tokens: usize,
) -> Result<u64, AllocationError> {
    layer_bytes(allocation, shape, rings, tokens).map(|(bytes, _)| bytes)
}

/// The bytes of [`cache_bytes_for_layers`] that hold no token: a stream that asks for the
/// fast-scan order allocates its records in whole blocks of 32 (`TokenStore::in_blocks`), so
/// a store sized to a context that is not a multiple of 32 has up to 31 empty record slots.
/// The all-in bits per value (`eval::perplexity::all_in_bits_per_value`) count what the cache
/// stores, without them.
///
/// ```
/// use tq_cache::allocation::{Allocation, ModelShape};
/// use tq_models::limits::block_slack_bytes_for_layers;
/// let shape = ModelShape { num_layers: 1, num_kv_heads: 1, head_dim: 64 };
/// let rows = Allocation::preset("mse-k4v4").unwrap();
/// assert_eq!(block_slack_bytes_for_layers(&rows, &shape, &[None], 1000).unwrap(), 0);
/// // `rec4.25` asks for the fast-scan order: 1000 tokens leave empty slots in the last block.
/// let fast = Allocation::preset("rec4.25").unwrap();
/// assert!(block_slack_bytes_for_layers(&fast, &shape, &[None], 1000).unwrap() > 0);
/// ```
pub fn block_slack_bytes_for_layers(
    allocation: &Allocation,
    shape: &ModelShape,
    rings: &[Option<usize>],
    tokens: usize,
) -> Result<u64, AllocationError> {
    layer_bytes(allocation, shape, rings, tokens).map(|(_, slack)| slack)
}

/// An upper bound, from the allocation alone, on the all-in bits per value a cache of
/// `allocation` stores at `tokens` tokens on a model without sliding-window layers: what
/// [`cache_bytes_for`] counts (codes, 8-bit or f16 window copies, sinks, means, channel lists)
/// less the position table and the fast-scan block slack (as
/// `eval::perplexity::all_in_bits_per_value` counts), plus for every stream that fits a basis
/// the most its fit stores (how many groups it keeps depends on the data): `2·d` bytes of
/// plane indices or `2·d²` of f16 rows, and 8 bytes for each of at most 8 groups. This is what a preset's stated budget is checked against, and what
/// `tq sweep --step-bits --max-bits` holds a trade to.
///
/// ```
/// use tq_cache::allocation::{Allocation, ModelShape};
/// use tq_models::limits::all_in_bits_bound;
/// let shape = ModelShape { num_layers: 30, num_kv_heads: 3, head_dim: 64 };
/// let f16 = Allocation::preset("f16").unwrap();
/// assert_eq!(all_in_bits_bound(&f16, &shape, 2048).unwrap(), 16.0);
/// let rec = Allocation::preset("rec2.5").unwrap();
/// assert!(all_in_bits_bound(&rec, &shape, 2048).unwrap() <= 2.5);
/// ```
pub fn all_in_bits_bound(
    allocation: &Allocation,
    shape: &ModelShape,
    tokens: usize,
) -> Result<f64, AllocationError> {
    let rings = vec![None; shape.num_layers];
    let (bytes, slack) = layer_bytes(allocation, shape, &rings, tokens)?;
    let positions = 4 * (tokens * shape.num_layers) as u64;
    let mut fits = 0u64;
    for layer in 0..shape.num_layers {
        for head in 0..shape.num_kv_heads {
            for stream in StreamKind::BOTH {
                let r = allocation.resolve_stream(
                    layer,
                    shape.num_layers,
                    head,
                    shape.head_dim,
                    stream,
                )?;
                // `FittedBasis::bytes`: f16 rows or u16 plane indices, and 8 bytes per group
                // (at most 8 groups: one per width).
                let d = shape.head_dim as u64;
                fits += match r.basis {
                    BasisPolicy::None => 0,
                    BasisPolicy::Planes => 2 * d + 8 * 8,
                    BasisPolicy::Pca => 2 * d * d + 8 * 8,
                };
            }
        }
    }
    let values = (2 * shape.num_layers * shape.num_kv_heads * shape.head_dim * tokens) as f64;
    Ok(8.0 * (bytes - positions - slack + fits) as f64 / values)
}

/// `(bytes, slack)`: [`cache_bytes_for_layers`] and [`block_slack_bytes_for_layers`].
fn layer_bytes(
    allocation: &Allocation,
    shape: &ModelShape,
    rings: &[Option<usize>],
    tokens: usize,
) -> Result<(u64, u64), AllocationError> {
    if rings.len() != shape.num_layers {
        return Err(AllocationError::Shape(format!(
            "{} ring sizes for a {}-layer model",
            rings.len(),
            shape.num_layers
        )));
    }
    let bytes_of = |spec| {
        TokenCodec::new(&spec)
            .map(|c| c.bytes_per_token() as u64)
            .unwrap_or(2 * shape.head_dim as u64)
    };
    let fp = bytes_of(allocation.fp_codec(shape.head_dim));
    let recent = bytes_of(allocation.recent_codec(shape.head_dim));
    let (mut bytes, mut slack_bytes) = (0u64, 0u64);
    for (layer, ring) in rings.iter().enumerate() {
        // A ring keeps no full-precision sink or recent copies: its window is what attention
        // sees, and a sink would have left the window.
        let (kind, held) = match *ring {
            Some(slots) => (LayerKind::Sliding, tokens.min(slots)),
            None => (LayerKind::Global, tokens),
        };
        for head in 0..shape.num_kv_heads {
            for stream in StreamKind::BOTH {
                let r = allocation.resolve_stream_in(
                    layer,
                    kind,
                    shape.num_layers,
                    head,
                    shape.head_dim,
                    stream,
                )?;
                // Allocated with the stream, whatever the context: a window longer than the
                // tokens held still costs all of its slots (as `Stream::fixed_bytes` counts).
                let (sinks, window) = if ring.is_some() {
                    (0, 0)
                } else {
                    // Built for `tokens`, the ring holds the window at that length.
                    (allocation.sink_tokens, r.recent.tokens_at(tokens))
                };
                // An 8-bit window's tokens have no codes until they leave it.
                let coded = if allocation.window_defers_codes() {
                    held.saturating_sub(window)
                } else {
                    held
                };
                bytes += coded as u64 * r.plan.bytes_per_token() as u64
                    + r.metadata_bytes_per_head() as u64
                    + sinks as u64 * fp
                    + window as u64 * recent;
                // A stream that asks for the fast-scan order holds its records in whole blocks
                // of 32 whatever order its fitted codec takes (`TokenStore::in_blocks`): the
                // slack's record bytes (its scales are not rounded).
                if r.record_order == RecordOrder::FastScan {
                    let record_bytes = match r.plan.build_single() {
                        Some(Ok(codec)) => 4 * codec.record_words(),
                        _ => r.plan.bytes_per_token(),
                    };
                    let slack = coded.next_multiple_of(FAST_SCAN_BLOCK) - coded;
                    slack_bytes += (slack * record_bytes) as u64;
                }
            }
        }
        bytes += 4 * held as u64;
    }
    Ok((bytes + slack_bytes, slack_bytes))
}

/// Refuses a cache of `allocation` for `tokens` tokens whose [`cache_bytes_for`] exceeds
/// `budget` bytes.
pub fn check_cache_budget(
    allocation: &Allocation,
    shape: &ModelShape,
    tokens: usize,
    budget: u64,
) -> Result<(), LimitError> {
    check_layers_budget(
        allocation,
        shape,
        &vec![None; shape.num_layers],
        tokens,
        budget,
    )
}

/// [`check_cache_budget`] with sliding-window layers counted at their rings (see
/// [`cache_bytes_for_layers`]).
pub fn check_layers_budget(
    allocation: &Allocation,
    shape: &ModelShape,
    rings: &[Option<usize>],
    tokens: usize,
    budget: u64,
) -> Result<(), LimitError> {
    let needed = cache_bytes_for_layers(allocation, shape, rings, tokens)?;
    if needed > budget {
        return Err(LimitError::OverBudget {
            allocation: allocation.name.clone(),
            tokens,
            needed,
            budget,
        });
    }
    Ok(())
}

/// The default cache budget: half of the machine's physical memory (`MemTotal` of
/// `/proc/meminfo`), leaving the other half to the model's weights, the activations and
/// everything else running; `None` where that file does not exist (not Linux), meaning no
/// default limit.
pub fn default_cache_budget() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_mem_total(&meminfo).map(|total| total / 2)
}

/// `MemTotal` of a `/proc/meminfo` text, in bytes.
///
/// ```
/// use tq_models::limits::parse_mem_total;
/// assert_eq!(parse_mem_total("MemTotal:       16384 kB\nMemFree: 1 kB\n"), Some(16_777_216));
/// assert_eq!(parse_mem_total("MemFree: 1 kB\n"), None);
/// ```
pub fn parse_mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}
