//! The evaluation loop: every allocation and the reference in lockstep, chunk by chunk.

use std::time::Instant;

use serde::Serialize;
use tq_cache::allocation::{Allocation, ModelShape, StreamKind};
use tq_cache::attention::AttentionKernel;
use tq_cache::states::ModelCache;

use super::EvalError;
use super::memory::{CacheCost, cache_cost, peak_rss_bytes, reset_peak_rss};
use super::metrics::{TextMetrics, TextSummary, argmax, log_softmax_into};
use super::score_probe::{ReconstructionStats, ScoreProbe, ScoreRecord};
use crate::causal_lm::CausalLm;
use crate::llama::{AttentionBackend, CpuAttention, ForwardScratch, Logits};

/// How to evaluate.
#[derive(Clone, Debug)]
pub struct EvalOptions {
    /// Tokens per forward call; each chunk attends to the compressed past.
    pub prefill_chunk: usize,
    /// Attention kernel of every allocation (the reference included).
    pub kernel: AttentionKernel,
    /// Whether to measure the per layer attention-score error (costs one extra scoring of
    /// every query against every visible key, and `tokens × layers × kv_heads × head_dim × 4`
    /// bytes of exact keys per allocation).
    pub score_error: bool,
    /// Greedy one-token decode steps timed after the text, per allocation (0: none); they
    /// measure decode speed at the text's context length and are clipped to the model's
    /// context window.
    pub decode_steps: usize,
}

impl Default for EvalOptions {
    fn default() -> Self {
        Self {
            prefill_chunk: 256,
            kernel: AttentionKernel::Fused,
            score_error: true,
            decode_steps: 0,
        }
    }
}

/// The figures of one allocation.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EvalRow {
    /// The allocation's name.
    pub alloc: String,
    /// Perplexity, KL divergence and top-1 agreement against the reference.
    #[serde(flatten)]
    pub text: TextSummary,
    /// Bytes and bits per token.
    #[serde(flatten)]
    pub cost: CacheCost,
    /// Per layer `‖s̃ − s‖ / ‖s‖` of the attention scores (empty when not measured).
    pub layer_score_error: Vec<f64>,
    /// Per layer mean total-variation distance of the attention weights (empty when not
    /// measured).
    pub layer_weight_tv: Vec<f64>,
    /// Mean of `layer_score_error` over layers.
    pub mean_score_error: f64,
    /// Mean of `layer_weight_tv` over layers.
    pub mean_weight_tv: f64,
    /// Per layer all-in bits per key value at this text's length: codes, norms, per-head
    /// metadata and the fixed full-precision copies and means, spread over the tokens.
    pub layer_key_bits: Vec<f64>,
    /// The same for the values.
    pub layer_value_bits: Vec<f64>,
    /// Per layer distance of the key reconstruction error to the rate-distortion limit,
    /// `10·log10(Σ‖k − k̃‖²/Σ‖k‖² · 4^b)` dB with `b` that layer's all-in key bits
    /// ([`ReconstructionStats::distance_db`]; empty when not measured).
    pub layer_key_distance_db: Vec<Option<f64>>,
    /// The same for the values.
    pub layer_value_distance_db: Vec<Option<f64>>,
    /// The keys' distance over all layers (errors and energies summed, mean all-in bits).
    pub key_distance_db: Option<f64>,
    /// The values' distance over all layers.
    pub value_distance_db: Option<f64>,
    /// Seconds of forward passes, the probe's own scoring excluded.
    pub seconds: f64,
    /// Text tokens per second of those forward passes (prefill with logits at every
    /// position: slower than generation's prefill, which computes one row of logits).
    pub tokens_per_s: f64,
    /// Decode steps timed after the text (see [`EvalOptions::decode_steps`]).
    pub decode_steps: usize,
    /// Decode steps per second at the text's context length (0 when none ran).
    pub decode_tokens_per_s: f64,
}

/// The result of [`evaluate`].
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EvalReport {
    /// The reference allocation's name.
    pub reference: String,
    /// Text tokens run (positions scored: one fewer).
    pub tokens: usize,
    /// Tokens per forward call.
    pub prefill_chunk: usize,
    /// Attention kernel.
    pub kernel: String,
    /// One row per allocation, in the order given.
    pub rows: Vec<EvalRow>,
    /// Peak RSS of the process during the evaluation, bytes (every allocation's cache and
    /// exact keys are alive at once, so this is the whole comparison's peak).
    pub peak_rss_bytes: Option<u64>,
    /// Whether the peak was reset at the start (else it covers the process's whole life).
    pub peak_rss_reset: bool,
}

/// One allocation under evaluation.
struct Lane {
    name: String,
    allocation: Allocation,
    cache: ModelCache,
    record: Option<ScoreRecord>,
    metrics: TextMetrics,
    seconds: f64,
    decode_seconds: f64,
}

impl Lane {
    fn new(
        model: &dyn CausalLm,
        name: &str,
        allocation: &Allocation,
        tokens: usize,
        score_error: bool,
    ) -> Result<Self, EvalError> {
        Ok(Self {
            name: name.to_string(),
            allocation: allocation.clone(),
            cache: model.new_cache(allocation, tokens)?,
            record: score_error.then(|| ScoreRecord::new(model.dims().layers)),
            metrics: TextMetrics::default(),
            seconds: 0.0,
            decode_seconds: 0.0,
        })
    }

    /// Runs one chunk; returns its logits `[chunk, vocab]`.
    fn forward<'s>(
        &mut self,
        model: &dyn CausalLm,
        chunk: &[u32],
        positions: &[u32],
        kernel: AttentionKernel,
        scratch: &'s mut ForwardScratch,
    ) -> Result<&'s [f32], EvalError> {
        let probe_before = self.record.as_ref().map_or(0.0, ScoreRecord::seconds);
        let clock = Instant::now();
        let mut plain;
        let mut probe;
        let backend: &mut dyn AttentionBackend = match self.record.as_mut() {
            Some(record) => {
                probe = ScoreProbe::new(&mut self.cache, kernel, record);
                &mut probe
            }
            None => {
                plain = CpuAttention {
                    cache: &mut self.cache,
                    kernel,
                };
                &mut plain
            }
        };
        let logits = model.forward_with(chunk, positions, backend, Logits::All, scratch)?;
        let probe_after = self.record.as_ref().map_or(0.0, ScoreRecord::seconds);
        self.seconds += clock.elapsed().as_secs_f64() - (probe_after - probe_before);
        Ok(logits)
    }

    /// Greedy decode `steps` tokens after `first`, timed (attention without the probe: this
    /// measures what generation costs).
    fn decode(
        &mut self,
        model: &dyn CausalLm,
        first: u32,
        steps: usize,
        kernel: AttentionKernel,
        scratch: &mut ForwardScratch,
    ) -> Result<(), EvalError> {
        let start = self.cache.len();
        let positions: Vec<u32> = (0..(start + steps) as u32).collect();
        let mut next = first;
        let clock = Instant::now();
        for step in 0..steps {
            let logits = model.forward(
                &[next],
                &positions[..start + step + 1],
                &mut self.cache,
                kernel,
                Logits::Last,
                scratch,
            )?;
            next = argmax(logits) as u32;
        }
        self.decode_seconds = clock.elapsed().as_secs_f64();
        Ok(())
    }
}

/// Runs `tokens` through the model once per allocation and once with `reference`, and
/// compares each allocation's next-token distributions with the reference's at every
/// position. An allocation equal to the reference (same settings) is run once and serves as
/// both. `progress(done, total)` is called after every forward call.
pub fn evaluate(
    model: &dyn CausalLm,
    tokens: &[u32],
    reference: (&str, &Allocation),
    allocations: &[(String, Allocation)],
    options: &EvalOptions,
    mut progress: impl FnMut(usize, usize),
) -> Result<EvalReport, EvalError> {
    let n = tokens.len();
    if n < 2 {
        return Err(EvalError::TooFewTokens(n));
    }
    let context = model.dims().context_length;
    if n > context {
        return Err(EvalError::TooManyTokens { tokens: n, context });
    }
    if allocations.is_empty() || options.prefill_chunk == 0 {
        return Err(EvalError::InvalidCall(
            "at least one allocation and a prefill chunk of at least one token".into(),
        ));
    }
    let decode_steps = options.decode_steps.min(context - n);
    let peak_rss_reset = reset_peak_rss();
    let mut lanes = allocations
        .iter()
        .map(|(name, allocation)| {
            Lane::new(
                model,
                name,
                allocation,
                n + decode_steps,
                options.score_error,
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    let reference_lane = lanes.iter().position(|l| &l.allocation == reference.1);
    let mut separate_reference = match reference_lane {
        Some(_) => None,
        None => Some(Lane::new(model, reference.0, reference.1, n, false)?),
    };
    let vocab = model.dims().vocab;
    let chunk = options.prefill_chunk.min(n).min(model.max_chunk());
    let positions: Vec<u32> = (0..n as u32).collect();
    let mut scratch = ForwardScratch::default();
    let mut reference_log_probs = vec![0.0f32; chunk * vocab];
    let chunks = n.div_ceil(chunk);
    let calls_per_chunk = lanes.len() + usize::from(separate_reference.is_some());
    let total = chunks * calls_per_chunk + if decode_steps > 0 { lanes.len() } else { 0 };
    let mut done = 0;
    for (c, piece) in tokens.chunks(chunk).enumerate() {
        let start = c * chunk;
        let end = start + piece.len();
        let order = reference_lane
            .into_iter()
            .chain((0..lanes.len()).filter(|&i| Some(i) != reference_lane));
        if let Some(lane) = separate_reference.as_mut() {
            let logits = lane.forward(
                model,
                piece,
                &positions[..end],
                options.kernel,
                &mut scratch,
            )?;
            store_log_probs(logits, vocab, &mut reference_log_probs)?;
            done += 1;
            progress(done, total);
        }
        for i in order {
            let lane = &mut lanes[i];
            let logits = lane.forward(
                model,
                piece,
                &positions[..end],
                options.kernel,
                &mut scratch,
            )?;
            if Some(i) == reference_lane {
                store_log_probs(logits, vocab, &mut reference_log_probs)?;
            }
            for (j, row) in logits.chunks_exact(vocab).enumerate() {
                if let Some(&target) = tokens.get(start + j + 1) {
                    let reference_row = &reference_log_probs[j * vocab..(j + 1) * vocab];
                    lane.metrics.add(reference_row, row, target as usize);
                }
            }
            done += 1;
            progress(done, total);
        }
    }
    if decode_steps > 0 {
        // Only the timing matters here: every lane starts from the same token (the text's
        // last, fed again) and decodes the same number of steps at the same context length.
        let first = tokens[n - 1];
        for lane in &mut lanes {
            lane.decode(model, first, decode_steps, options.kernel, &mut scratch)?;
            done += 1;
            progress(done, total);
        }
    }
    let shape = ModelShape {
        num_layers: model.dims().layers,
        num_kv_heads: model.dims().kv_heads,
        head_dim: model.dims().head_dim,
    };
    let rows = lanes
        .iter()
        .map(|lane| row(lane, &shape, n, decode_steps))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(EvalReport {
        reference: reference.0.to_string(),
        tokens: n,
        prefill_chunk: chunk,
        kernel: format!("{:?}", options.kernel),
        rows,
        peak_rss_bytes: peak_rss_bytes(),
        peak_rss_reset,
    })
}

fn store_log_probs(logits: &[f32], vocab: usize, out: &mut [f32]) -> Result<(), EvalError> {
    if vocab == 0 || !logits.len().is_multiple_of(vocab) || logits.len() > out.len() {
        return Err(EvalError::InvalidCall(format!(
            "{} logits for a vocabulary of {vocab}",
            logits.len()
        )));
    }
    for (row, o) in logits.chunks_exact(vocab).zip(out.chunks_exact_mut(vocab)) {
        log_softmax_into(row, o);
    }
    Ok(())
}

/// Per layer all-in bits per key value and per value-stream value for `tokens` cached tokens:
/// each head's per-token record, its per-head metadata (outlier channels) and the fixed bytes
/// of its built stream (full-precision sinks and recent copies, the mean of a centered
/// stream), averaged over the KV heads.
fn layer_all_in_bits(
    allocation: &Allocation,
    shape: &ModelShape,
    cache: &ModelCache,
    tokens: usize,
) -> Result<(Vec<f64>, Vec<f64>), EvalError> {
    let tokens = tokens.max(1);
    let mut keys = Vec::with_capacity(shape.num_layers);
    let mut values = Vec::with_capacity(shape.num_layers);
    for layer in 0..shape.num_layers {
        let kv = cache.kv(layer)?;
        for (kind, out) in [
            (StreamKind::Key, &mut keys),
            (StreamKind::Value, &mut values),
        ] {
            let mut bits = 0.0;
            for head in 0..shape.num_kv_heads {
                let plan =
                    allocation.resolve(layer, shape.num_layers, head, shape.head_dim, kind)?;
                let stream = match kind {
                    StreamKind::Key => kv.keys(head),
                    StreamKind::Value => kv.values(head),
                };
                // An 8-bit window's tokens have no codes (their copies are in the fixed bytes).
                let bytes = stream.body_tokens(tokens) * plan.bytes_per_token()
                    + plan.metadata_bytes_per_head()
                    + stream.fixed_bytes();
                bits += 8.0 * bytes as f64 / (tokens * shape.head_dim) as f64;
            }
            out.push(bits / shape.num_kv_heads.max(1) as f64);
        }
    }
    Ok((keys, values))
}

fn row(
    lane: &Lane,
    shape: &ModelShape,
    tokens: usize,
    decode_steps: usize,
) -> Result<EvalRow, EvalError> {
    let cost = cache_cost(&lane.allocation, shape, &lane.cache, tokens + decode_steps)?;
    let stats = lane.record.as_ref().map_or(&[][..], ScoreRecord::stats);
    let layer_score_error: Vec<f64> = stats.iter().map(|s| s.relative_error()).collect();
    let layer_weight_tv: Vec<f64> = stats.iter().map(|s| s.mean_weight_tv()).collect();
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let (layer_key_bits, layer_value_bits) =
        layer_all_in_bits(&lane.allocation, shape, &lane.cache, tokens + decode_steps)?;
    let reconstruction = lane
        .record
        .as_ref()
        .map_or(&[][..], ScoreRecord::reconstruction);
    let distances = |which: usize, bits: &[f64]| -> Vec<Option<f64>> {
        reconstruction
            .iter()
            .zip(bits)
            .map(|(r, &b)| r[which].distance_db(b))
            .collect()
    };
    let total = |which: usize, bits: &[f64]| -> Option<f64> {
        let mut sum = ReconstructionStats::default();
        for r in reconstruction {
            sum.squared_error += r[which].squared_error;
            sum.squared_energy += r[which].squared_energy;
            sum.vectors += r[which].vectors;
        }
        sum.distance_db(mean(bits))
    };
    Ok(EvalRow {
        layer_key_distance_db: distances(0, &layer_key_bits),
        layer_value_distance_db: distances(1, &layer_value_bits),
        key_distance_db: total(0, &layer_key_bits),
        value_distance_db: total(1, &layer_value_bits),
        layer_key_bits,
        layer_value_bits,
        alloc: lane.name.clone(),
        text: lane.metrics.summary(),
        cost,
        mean_score_error: mean(&layer_score_error),
        mean_weight_tv: mean(&layer_weight_tv),
        layer_score_error,
        layer_weight_tv,
        seconds: lane.seconds,
        tokens_per_s: tokens as f64 / lane.seconds.max(f64::MIN_POSITIVE),
        decode_steps,
        decode_tokens_per_s: if decode_steps == 0 {
            0.0
        } else {
            decode_steps as f64 / lane.decode_seconds.max(f64::MIN_POSITIVE)
        },
    })
}
