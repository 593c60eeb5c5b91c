//! Per layer sensitivity: which layer's keys or values buy the most KL divergence per extra
//! byte when stored at full precision (f16), and the allocation that spends a byte budget on
//! the best of them.
//!
//! One variant per (layer, stream) raises that stream of that layer to f16 with an
//! `[[override]]` appended to the base allocation; [`rank`] orders the variants by
//! `(KL_base − KL_variant) / extra bytes per token`, and [`spend_budget`] adds the overrides
//! in that order while they fit. The greedy choice treats the layers as independent (their
//! savings are measured one at a time, not jointly); a re-evaluation of the written allocation
//! shows what the combination really saves.
//!
//! Raising to f16 measures what a stream's quantization costs, not what one bit more or less
//! would change, and the lowering a budget-neutral trade needs costs more than the raise saves
//! (docs/results.md, "Targets of the quality issue"). So the one-bit mode measures both
//! directions: [`stepped`] moves one stream of one layer a bit up or down, [`BitStep`] records
//! what that bought or cost, and [`trade_prefixes`] pairs the best raises with the cheapest
//! lowerings at the same bytes; [`traded`] writes a prefix of those pairs as an allocation
//! whose overrides apply to that model's depth only (`model_layers`).

use serde::Serialize;
use tq_cache::CodecSpec;
use tq_cache::allocation::{
    Allocation, AllocationError, CodecKind, LayerKind, LayerOverride, ModelShape, StreamKind,
    StreamPlan, StreamSettings,
};

use super::EvalRow;

/// `base` with `stream` of `layer` stored as f16 (an override appended after the base's own,
/// so it wins), named `<base>+L<layer><K|V>`.
pub fn raised(base: &Allocation, layer: usize, stream: StreamKind) -> Allocation {
    let f16 = StreamSettings::codec_only(CodecKind::F16);
    let mut allocation = with_layer_patch(base, vec![layer as i64], None, stream, f16);
    allocation.name = format!("{}+L{layer}{}", base.name, stream_letter(stream));
    allocation
}

/// `base` with an override appended after its own (so it wins) that patches `stream` of `layer`
/// with `settings`, for models of `model_layers` layers only when given.
fn with_layer_patch(
    base: &Allocation,
    layers: Vec<i64>,
    model_layers: Option<usize>,
    stream: StreamKind,
    settings: StreamSettings,
) -> Allocation {
    let (key, value) = match stream {
        StreamKind::Key => (Some(settings), None),
        StreamKind::Value => (None, Some(settings)),
    };
    let mut allocation = base.clone();
    allocation.overrides.push(LayerOverride {
        layers,
        layer_kind: None,
        model_layers,
        heads: None,
        key,
        value,
    });
    allocation
}

fn stream_letter(stream: StreamKind) -> char {
    match stream {
        StreamKind::Key => 'K',
        StreamKind::Value => 'V',
    }
}

/// Bytes per token of `allocation` on `shape`, from its stream plans.
pub fn bytes_per_token(
    allocation: &Allocation,
    shape: &ModelShape,
) -> Result<usize, AllocationError> {
    allocation
        .plans(shape)
        .map(|p| p.map(|p| p.bytes_per_token()))
        .sum()
}

/// What raising one stream of one layer buys.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LayerSensitivity {
    /// The layer.
    pub layer: usize,
    /// `key` or `value`.
    pub stream: &'static str,
    /// Extra bytes per token the raise costs.
    pub extra_bytes_per_token: usize,
    /// Mean KL of the variant.
    pub kl: f64,
    /// `KL_base − KL_variant` (negative when the raise made it worse, which noise can do).
    pub kl_saved: f64,
    /// `kl_saved / extra_bytes_per_token` (0 when the raise costs nothing).
    pub kl_saved_per_byte: f64,
}

/// Ranks the variants, best KL saved per byte first. `variants` pairs each evaluated row with
/// the (layer, stream) it raised and its extra bytes per token.
pub fn rank(
    base: &EvalRow,
    variants: &[(usize, StreamKind, usize, &EvalRow)],
) -> Vec<LayerSensitivity> {
    let mut out: Vec<LayerSensitivity> = variants
        .iter()
        .map(|&(layer, stream, extra, row)| {
            let kl_saved = base.text.mean_kl - row.text.mean_kl;
            LayerSensitivity {
                layer,
                stream: stream.as_str(),
                extra_bytes_per_token: extra,
                kl: row.text.mean_kl,
                kl_saved,
                kl_saved_per_byte: if extra == 0 {
                    0.0
                } else {
                    kl_saved / extra as f64
                },
            }
        })
        .collect();
    out.sort_by(|a, b| b.kl_saved_per_byte.total_cmp(&a.kl_saved_per_byte));
    out
}

/// The base with f16 overrides for the best-ranked (layer, stream) pairs whose extra bytes
/// still fit `budget_bytes_per_token` (pairs that saved nothing are skipped); returns it and
/// the extra bytes per token it spends.
pub fn spend_budget(
    base: &Allocation,
    ranking: &[LayerSensitivity],
    budget_bytes_per_token: usize,
) -> (Allocation, usize) {
    let mut allocation = base.clone();
    let mut spent = 0;
    let mut chosen = Vec::new();
    for s in ranking {
        if s.kl_saved <= 0.0 || s.extra_bytes_per_token == 0 {
            continue;
        }
        if spent + s.extra_bytes_per_token > budget_bytes_per_token {
            continue;
        }
        let stream = if s.stream == "key" {
            StreamKind::Key
        } else {
            StreamKind::Value
        };
        allocation = raised(&allocation, s.layer, stream);
        spent += s.extra_bytes_per_token;
        chosen.push(format!("L{}{}", s.layer, stream_letter(stream)));
    }
    allocation.name = format!("{}-budget{budget_bytes_per_token}", base.name);
    allocation.description = Some(format!(
        "{} with f16 for {} (per-layer sensitivity, +{spent} bytes per token of a budget of \
         {budget_bytes_per_token})",
        base.name,
        if chosen.is_empty() {
            "nothing".to_string()
        } else {
            chosen.join(", ")
        }
    ));
    (allocation, spent)
}

/// The bits `stream` of `layer` (a layer of kind `kind`) stores per coordinate, where a one-bit
/// step is defined: `mse` and `debiased-mse` streams (for a fitted basis, the average over its
/// groups). `None` for f16 / f32, `prod` and two-tier streams, which [`stepped`] leaves alone.
/// Read on KV head 0: a step sets every head of the layer, so an allocation whose heads of one
/// layer differ in bits is stepped from head 0's.
pub fn stream_bits(
    base: &Allocation,
    shape: &ModelShape,
    layer: usize,
    kind: LayerKind,
    stream: StreamKind,
) -> Result<Option<u8>, AllocationError> {
    let resolved =
        base.resolve_stream_in(layer, kind, shape.num_layers, 0, shape.head_dim, stream)?;
    Ok(match resolved.plan {
        StreamPlan::Single(CodecSpec::Mse(spec) | CodecSpec::DebiasedMse(spec)) => Some(spec.bits),
        _ => None,
    })
}

/// `base` with `stream` of `layer` stored at `bits` per coordinate (an override appended after
/// the base's own, for this model's depth only), named `<base>+L<layer><K|V><±delta>`.
pub fn stepped(
    base: &Allocation,
    num_layers: usize,
    layer: usize,
    stream: StreamKind,
    from_bits: u8,
    bits: u8,
) -> Allocation {
    let patch = StreamSettings {
        bits: Some(bits),
        ..StreamSettings::default()
    };
    let layers = vec![layer as i64];
    let mut allocation = with_layer_patch(base, layers, Some(num_layers), stream, patch);
    let delta = i16::from(bits) - i16::from(from_bits);
    allocation.name = format!("{}+L{layer}{}{delta:+}", base.name, stream_letter(stream));
    allocation
}

/// One measured one-bit step of one stream of one layer.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BitStep {
    /// The layer.
    pub layer: usize,
    /// `key` or `value`.
    pub stream: &'static str,
    /// Bits per coordinate before the step.
    pub from_bits: u8,
    /// Bits per coordinate after it.
    pub to_bits: u8,
    /// Bytes per token the step adds (a raise) or frees (a lowering), always ≥ 0.
    pub bytes_per_token: usize,
    /// Mean KL of the variant.
    pub kl: f64,
    /// For a raise `KL_base − KL_variant` (what it buys), for a lowering `KL_variant −
    /// KL_base` (what it costs); either can come out negative in the noise.
    pub kl_change: f64,
}

impl BitStep {
    /// Builds the step's record from its evaluated row.
    pub fn measured(
        base: &EvalRow,
        layer: usize,
        stream: StreamKind,
        (from_bits, to_bits): (u8, u8),
        bytes_per_token: usize,
        row: &EvalRow,
    ) -> Self {
        let delta = row.text.mean_kl - base.text.mean_kl;
        BitStep {
            layer,
            stream: stream.as_str(),
            from_bits,
            to_bits,
            bytes_per_token,
            kl: row.text.mean_kl,
            kl_change: if to_bits > from_bits { -delta } else { delta },
        }
    }

    fn stream_kind(&self) -> StreamKind {
        if self.stream == "key" {
            StreamKind::Key
        } else {
            StreamKind::Value
        }
    }

    /// KL bought (raise) or paid (lowering) per byte per token.
    fn per_byte(&self) -> f64 {
        self.kl_change / self.bytes_per_token.max(1) as f64
    }
}

/// Trades at the base's bytes: raises ranked by KL bought per byte, paired in order with
/// lowerings ranked by KL paid per byte freed (a stream is never both raised and lowered), as
/// long as the pair's raise buys more than its lowering costs and the raises' bytes stay within
/// the lowerings'. Returns the prefixes of that list of pairs, shortest first: `trades[k]` is
/// the first `k + 1` pairs, which [`traded`] turns into an allocation. Like [`rank`], it treats
/// the steps as independent, which they are not (savings add up to less than their sum):
/// evaluating the prefixes together picks the length.
pub fn trade_prefixes(steps: &[BitStep]) -> Vec<Vec<(BitStep, BitStep)>> {
    let mut raises: Vec<&BitStep> = steps.iter().filter(|s| s.to_bits > s.from_bits).collect();
    let mut lowerings: Vec<&BitStep> = steps.iter().filter(|s| s.to_bits < s.from_bits).collect();
    raises.sort_by(|a, b| b.per_byte().total_cmp(&a.per_byte()));
    lowerings.sort_by(|a, b| a.per_byte().total_cmp(&b.per_byte()));
    let same = |a: &BitStep, b: &BitStep| a.layer == b.layer && a.stream == b.stream;
    let mut pairs: Vec<(BitStep, BitStep)> = Vec::new();
    let mut out = Vec::new();
    let (mut added, mut freed) = (0usize, 0usize);
    let mut lower_iter = lowerings.into_iter().peekable();
    for raise in raises {
        if raise.kl_change <= 0.0 || pairs.iter().any(|(_, l)| same(l, raise)) {
            continue;
        }
        // The cheapest lowering not of a stream already raised.
        let lowering = loop {
            match lower_iter.next() {
                Some(l) if pairs.iter().any(|(r, _)| same(r, l)) || same(l, raise) => continue,
                other => break other,
            }
        };
        let Some(lowering) = lowering else { break };
        if raise.kl_change <= lowering.kl_change
            || added + raise.bytes_per_token > freed + lowering.bytes_per_token
        {
            break;
        }
        added += raise.bytes_per_token;
        freed += lowering.bytes_per_token;
        pairs.push((raise.clone(), lowering.clone()));
        out.push(pairs.clone());
    }
    out
}

/// `base` with the pairs' steps applied: one `[[override]]` per stream kind and new width,
/// each for models of `num_layers` layers only (`model_layers`), so the layer map rides in a
/// file that other models can still load. Named `<base>-trades<k>`.
pub fn traded(base: &Allocation, num_layers: usize, pairs: &[(BitStep, BitStep)]) -> Allocation {
    let mut allocation = base.clone();
    let mut groups: std::collections::BTreeMap<(&'static str, u8), Vec<i64>> =
        std::collections::BTreeMap::new();
    for step in pairs.iter().flat_map(|(r, l)| [r, l]) {
        groups
            .entry((step.stream, step.to_bits))
            .or_default()
            .push(step.layer as i64);
    }
    for ((stream, bits), mut layers) in groups {
        layers.sort_unstable();
        let patch = StreamSettings {
            bits: Some(bits),
            ..StreamSettings::default()
        };
        let kind = if stream == "key" {
            StreamKind::Key
        } else {
            StreamKind::Value
        };
        allocation = with_layer_patch(&allocation, layers, Some(num_layers), kind, patch);
    }
    let list = |f: fn(&(BitStep, BitStep)) -> &BitStep| {
        pairs
            .iter()
            .map(|p| {
                let s = f(p);
                format!("L{}{}", s.layer, stream_letter(s.stream_kind()))
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    allocation.name = format!("{}-trades{}", base.name, pairs.len());
    allocation.description = Some(format!(
        "{} with one bit more for {} and one bit less for {} (one-bit trades at the same bytes, \
         measured per layer; {num_layers}-layer models only)",
        base.name,
        list(|p| &p.0),
        list(|p| &p.1)
    ));
    allocation
}
