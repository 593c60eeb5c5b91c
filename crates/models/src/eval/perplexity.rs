//! Perplexity and KL divergence in the reference engine's protocol (`llama-perplexity`), so
//! that a row here compares with a row of `llama-perplexity [--kl-divergence]` on the same
//! model and text.
//!
//! The protocol, as that engine runs it:
//! - the text is tokenized once (BOS first only for a model that asks for it);
//! - it is cut into `n = ⌊tokens / ctx⌋` chunks of `ctx` tokens, the remainder dropped;
//! - every chunk starts from an empty cache at position 0, and for a model that adds BOS its
//!   first token is overwritten (not shifted) by BOS;
//! - only the second half is scored: the logits at positions `ctx/2 … ctx−2` against the
//!   next token, `ctx/2 − 1` tokens per chunk; natural log throughout;
//! - PPL = `exp(mean NLL)` over every scored token of every chunk, `±` as in [`kld`];
//! - the KL-divergence mode compares each scored position's distribution with the base
//!   (f16-cache) run's, stored as in [`BaseLogProbs`].
//!
//! Each chunk runs through the cache under test in prefill pieces of
//! [`PerplexityOptions::prefill_chunk`] tokens (every piece attends to the compressed past,
//! as in generation); pieces wholly in the unscored first half ask the model for one row of
//! logits only. The base run and the allocations under test advance chunk by chunk in
//! lockstep, so the base's stored log-probabilities are one chunk's worth, not the text's.
//!
//! [`kld`]: super::kld

use std::time::Instant;

use serde::Serialize;
use tq_cache::allocation::{Allocation, LayerKind, ModelShape, StreamKind};
use tq_cache::attention::AttentionKernel;
use tq_cache::states::{ModelCache, StateKind};

use super::EvalError;
use super::kld::{BaseLogProbs, KldStats, KldSummary};
use super::metrics::negative_log_likelihood;
use crate::causal_lm::CausalLm;
use crate::llama::{ForwardScratch, Logits};

/// How to run the protocol.
#[derive(Clone, Debug)]
pub struct PerplexityOptions {
    /// Tokens per chunk (the engine's `-c`); even and at least 4.
    pub ctx: usize,
    /// Tokens per forward call inside a chunk (the prefill chunking of the cache under test).
    pub prefill_chunk: usize,
    /// Attention kernel of every run, the base included.
    pub kernel: AttentionKernel,
    /// At most this many chunks (the engine's `--chunks`); `None` for all.
    pub max_chunks: Option<usize>,
}

impl Default for PerplexityOptions {
    fn default() -> Self {
        Self {
            ctx: 512,
            prefill_chunk: 256,
            kernel: AttentionKernel::Fused,
            max_chunks: None,
        }
    }
}

/// The figures of one allocation (the keys of `tq perplexity --json`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PerplexityRow {
    /// The allocation's name.
    pub alloc: String,
    /// Tokens per chunk.
    pub ctx: usize,
    /// Chunks run.
    pub chunks: usize,
    /// Tokens scored (`chunks · (ctx/2 − 1)`).
    pub scored_tokens: usize,
    /// Perplexity over the scored tokens.
    pub ppl: f64,
    /// Its "±" (the engine's).
    pub ppl_err: f64,
    /// Mean KL divergence against the base run, nats (`null` without a base).
    pub kld_mean: Option<f64>,
    /// Standard error of the mean KL divergence.
    pub kld_err: Option<f64>,
    /// Median per-token KL divergence.
    pub kld_median: Option<f64>,
    /// 99th percentile of the per-token KL divergence.
    pub kld_p99: Option<f64>,
    /// Largest per-token KL divergence.
    pub kld_max: Option<f64>,
    /// Percentage of scored tokens whose most likely next token is the base's.
    pub same_top_p: Option<f64>,
    /// All-in bits per cached value at this context: see [`all_in_bits_per_value`].
    pub bits_per_value: f64,
    /// Whether this row is the base run the others are compared with.
    pub base: bool,
    /// Seconds of forward passes for this allocation.
    pub seconds: f64,
}

/// The result of [`perplexity`].
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PerplexityReport {
    /// Tokens of the whole text.
    pub text_tokens: usize,
    /// Tokens per chunk.
    pub ctx: usize,
    /// Chunks run.
    pub chunks: usize,
    /// Tokens per forward call inside a chunk.
    pub prefill_chunk: usize,
    /// Attention kernel.
    pub kernel: String,
    /// The base allocation of the KL divergences, if any.
    pub base: Option<String>,
    /// One row per allocation; the base first when it was not among them.
    pub rows: Vec<PerplexityRow>,
}

/// One allocation under test.
struct Lane {
    name: String,
    allocation: Allocation,
    cache: ModelCache,
    stats: KldStats,
    base: bool,
    seconds: f64,
}

impl Lane {
    fn new(
        model: &dyn CausalLm,
        name: &str,
        allocation: &Allocation,
        ctx: usize,
        base: bool,
    ) -> Result<Self, EvalError> {
        Ok(Self {
            name: name.to_string(),
            allocation: allocation.clone(),
            cache: model.new_cache(allocation, ctx)?,
            stats: KldStats::default(),
            base,
            seconds: 0.0,
        })
    }

    /// Runs one chunk from an empty cache; calls `score(position, logits_row)` for every scored
    /// position in order.
    fn run_chunk(
        &mut self,
        model: &dyn CausalLm,
        chunk: &[u32],
        positions: &[u32],
        options: &PerplexityOptions,
        scratch: &mut ForwardScratch,
        mut score: impl FnMut(&mut KldStats, usize, &[f32]),
    ) -> Result<(), EvalError> {
        let clock = Instant::now();
        self.cache.reset();
        let first = options.ctx / 2;
        let vocab = model.dims().vocab;
        let mut start = 0;
        while start < chunk.len() {
            let end = (start + options.prefill_chunk.min(model.max_chunk())).min(chunk.len());
            // Only positions ctx/2 .. ctx−2 are scored: a piece that holds none of them needs
            // no logits but its last row (the model computes at least that one).
            let wanted = end > first && start < chunk.len() - 1;
            let logits = model.forward(
                &chunk[start..end],
                &positions[..end],
                &mut self.cache,
                options.kernel,
                if wanted { Logits::All } else { Logits::Last },
                scratch,
            )?;
            if wanted {
                for (j, row) in logits.chunks_exact(vocab).enumerate() {
                    let p = start + j;
                    if p >= first && p + 1 < chunk.len() {
                        score(&mut self.stats, p, row);
                    }
                }
            }
            start = end;
        }
        self.seconds += clock.elapsed().as_secs_f64();
        Ok(())
    }

    /// The lane's figures. Call after the chunks ran: a centered stream's mean exists (and
    /// is counted in the bits) only once the stream has seen its first chunk.
    fn row(
        &self,
        model: &dyn CausalLm,
        ctx: usize,
        chunks: usize,
    ) -> Result<PerplexityRow, EvalError> {
        let shape = ModelShape {
            num_layers: model.dims().layers,
            num_kv_heads: model.dims().kv_heads,
            head_dim: model.dims().head_dim,
        };
        let bits_per_value = all_in_bits_per_value(
            &self.allocation,
            &shape,
            &model.ring_slots(),
            &self.cache,
            ctx,
        )?;
        let KldSummary {
            count,
            ppl,
            ppl_err,
            kld_mean,
            kld_err,
            kld_median,
            kld_p99,
            kld_max,
            same_top_p,
        } = self.stats.summary();
        Ok(PerplexityRow {
            alloc: self.name.clone(),
            ctx,
            chunks,
            scored_tokens: count,
            ppl,
            ppl_err,
            kld_mean,
            kld_err,
            kld_median,
            kld_p99,
            kld_max,
            same_top_p,
            bits_per_value,
            base: self.base,
            seconds: self.seconds,
        })
    }
}

/// The chunks of `tokens` the protocol runs: `⌊len / ctx⌋` slices of `ctx` tokens (at most
/// `max_chunks`), the first token of each replaced by `bos` when the model adds one.
pub fn protocol_chunks(
    tokens: &[u32],
    ctx: usize,
    bos: Option<u32>,
    max_chunks: Option<usize>,
) -> Vec<Vec<u32>> {
    tokens
        .chunks_exact(ctx.max(1))
        .take(max_chunks.unwrap_or(usize::MAX))
        .map(|c| {
            let mut chunk = c.to_vec();
            if let Some(bos) = bos {
                chunk[0] = bos;
            }
            chunk
        })
        .collect()
}

/// Everything the cache of `allocation` stores for `ctx` tokens, in bits per cached value
/// (`2 · kv_heads · head_dim` values per token a layer holds: all `ctx` in a global layer, at
/// most its ring in a sliding-window layer, `rings[l] = Some(slots)`, whose streams resolve
/// as [`LayerKind::Sliding`]'s; so an f16 cache is 16 bits on any model): every stream's
/// per-token record (codes, QJL signs, norms) for the tokens its layer holds, its per-head
/// metadata (outlier channel lists), and the fixed
/// full-precision and per-stream copies the built cache holds (sink and recent-window tokens,
/// means, basis fits) — spread over the `ctx` tokens, so a window costs more at a short
/// context. The position table (4 bytes per token, the same for every allocation) is not
/// counted. A centered stream's mean is counted once the stream has chosen it (its first
/// chunk), so pass a cache that has run. `rings` has one entry per layer.
pub fn all_in_bits_per_value(
    allocation: &Allocation,
    shape: &ModelShape,
    rings: &[Option<usize>],
    cache: &ModelCache,
    ctx: usize,
) -> Result<f64, EvalError> {
    if rings.len() != shape.num_layers {
        return Err(EvalError::InvalidCall(format!(
            "{} ring sizes for a {}-layer model",
            rings.len(),
            shape.num_layers
        )));
    }
    let (mut bytes, mut tokens) = (0usize, 0usize);
    for (layer, ring) in rings.iter().enumerate() {
        let (kind, held) = match *ring {
            Some(slots) => (LayerKind::Sliding, ctx.min(slots)),
            None => (LayerKind::Global, ctx),
        };
        tokens += held;
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
                // An 8-bit window's tokens have no codes until they leave it (their copies are
                // in the cache's fixed bytes).
                let coded = match ring {
                    None if allocation.window_defers_codes() => {
                        held.saturating_sub(r.recent.tokens_at(held))
                    }
                    _ => held,
                };
                bytes += coded * r.plan.bytes_per_token() + r.plan.metadata_bytes_per_head();
            }
        }
    }
    for spec in cache.specs() {
        if let StateKind::Kv { layer, .. } = spec.kind {
            // Kept heavy hitters are data-dependent: those of the cache as it stands (the last
            // chunk's, at this context).
            let kv = cache.kv(layer)?;
            bytes += kv.fixed_bytes() + kv.kept_bytes();
        }
    }
    let values = 2 * shape.num_kv_heads * shape.head_dim * tokens.max(1);
    Ok(8.0 * bytes as f64 / values as f64)
}

/// Refuses an allocation whose full-precision copies cover a whole chunk: with
/// `sink_tokens + recent window ≥ ctx` nothing in the chunk is read from the compressed body,
/// so its figures would measure f16, not the allocation (and its bits would count copies of
/// every token twice). The window is the longest any stream has in a cache of `ctx` tokens
/// ([`Allocation::longest_recent_window`]). The error names the fields to shrink.
pub fn check_windows<'a>(
    allocations: impl IntoIterator<Item = &'a Allocation>,
    ctx: usize,
) -> Result<(), EvalError> {
    for a in allocations {
        let recent = a.longest_recent_window(ctx);
        if a.sink_tokens + recent >= ctx {
            return Err(EvalError::InvalidCall(format!(
                "allocation `{}`: sink_tokens ({}) + the recent window ({recent} tokens at \
                 this context, recent_fp_tokens or recent_fraction, the longest of any stream) \
                 cover the whole {ctx}-token chunk, so nothing would be read from the \
                 compressed cache; use a longer --ctx or a shorter window",
                a.name, a.sink_tokens
            )));
        }
    }
    Ok(())
}

/// Runs the protocol over `tokens` (the whole text, tokenized once) for every allocation,
/// and, when `base` is given, the KL divergence of each against that base allocation's run
/// (the base row is reported too, first if it is not among `allocations`). `bos` is the BOS id
/// when the model adds one (it overwrites each chunk's first token). `progress(done, total)`
/// is called after every chunk of every allocation.
pub fn perplexity(
    model: &dyn CausalLm,
    tokens: &[u32],
    bos: Option<u32>,
    base: Option<(&str, &Allocation)>,
    allocations: &[(String, Allocation)],
    options: &PerplexityOptions,
    mut progress: impl FnMut(usize, usize),
) -> Result<PerplexityReport, EvalError> {
    let ctx = options.ctx;
    if ctx < 4 || !ctx.is_multiple_of(2) || options.prefill_chunk == 0 {
        return Err(EvalError::InvalidCall(format!(
            "the context must be even and at least 4 tokens (got {ctx}) and the prefill chunk at least 1 (got {})",
            options.prefill_chunk
        )));
    }
    let context = model.dims().context_length;
    if ctx > context {
        return Err(EvalError::TooManyTokens {
            tokens: ctx,
            context,
        });
    }
    if tokens.len() < ctx {
        return Err(EvalError::InvalidCall(format!(
            "the text has {} tokens, fewer than one chunk of {ctx}",
            tokens.len()
        )));
    }
    if allocations.is_empty() && base.is_none() {
        return Err(EvalError::InvalidCall("no allocation to run".into()));
    }
    check_windows(
        allocations
            .iter()
            .map(|(_, a)| a)
            .chain(base.map(|(_, b)| b)),
        ctx,
    )?;
    let chunks = protocol_chunks(tokens, ctx, bos, options.max_chunks);
    // The base runs as one of the allocations when it is among them (same settings), else as
    // a lane of its own placed first.
    let listed = base.and_then(|(_, b)| allocations.iter().position(|(_, a)| a == b));
    let mut lanes = Vec::with_capacity(allocations.len() + 1);
    if let (Some((name, allocation)), None) = (base, listed) {
        lanes.push(Lane::new(model, name, allocation, ctx, true)?);
    }
    let offset = lanes.len();
    for (i, (name, allocation)) in allocations.iter().enumerate() {
        lanes.push(Lane::new(model, name, allocation, ctx, listed == Some(i))?);
    }
    let base_index = match (base, listed) {
        (None, _) => None,
        (Some(_), None) => Some(0),
        (Some(_), Some(i)) => Some(offset + i),
    };
    let positions: Vec<u32> = (0..ctx as u32).collect();
    let first = ctx / 2;
    let mut scratch = ForwardScratch::default();
    let mut stored: Vec<BaseLogProbs> = vec![BaseLogProbs::default(); ctx - 1 - first];
    let total = chunks.len() * lanes.len();
    let mut done = 0;
    for chunk in &chunks {
        if let Some(b) = base_index {
            lanes[b].run_chunk(
                model,
                chunk,
                &positions,
                options,
                &mut scratch,
                |stats, p, row| {
                    let nll = stored[p - first].quantize(row, chunk[p + 1] as usize);
                    stats.add_base(nll);
                },
            )?;
            done += 1;
            progress(done, total);
        }
        for (i, lane) in lanes.iter_mut().enumerate() {
            if Some(i) == base_index {
                continue;
            }
            let compare = base_index.is_some();
            lane.run_chunk(
                model,
                chunk,
                &positions,
                options,
                &mut scratch,
                |stats, p, row| {
                    let nll = negative_log_likelihood(row, chunk[p + 1] as usize);
                    if compare {
                        stats.add(&stored[p - first], row, nll);
                    } else {
                        stats.add_nll(nll);
                    }
                },
            )?;
            done += 1;
            progress(done, total);
        }
    }
    Ok(PerplexityReport {
        text_tokens: tokens.len(),
        ctx,
        chunks: chunks.len(),
        prefill_chunk: options.prefill_chunk,
        kernel: format!("{:?}", options.kernel),
        base: base.map(|(n, _)| n.to_string()),
        rows: lanes
            .iter()
            .map(|l| l.row(model, ctx, chunks.len()))
            .collect::<Result<_, _>>()?,
    })
}
