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

use serde::Serialize;
use tq_cache::allocation::{
    Allocation, AllocationError, CodecKind, LayerOverride, ModelShape, StreamKind, StreamSettings,
};

use super::EvalRow;

/// `base` with `stream` of `layer` stored as f16 (an override appended after the base's own,
/// so it wins), named `<base>+L<layer><K|V>`.
pub fn raised(base: &Allocation, layer: usize, stream: StreamKind) -> Allocation {
    let f16 = Some(StreamSettings::codec_only(CodecKind::F16));
    let (key, value) = match stream {
        StreamKind::Key => (f16, None),
        StreamKind::Value => (None, f16),
    };
    let mut allocation = base.clone();
    allocation.overrides.push(LayerOverride {
        layers: vec![layer as i64],
        layer_kind: None,
        heads: None,
        key,
        value,
    });
    allocation.name = format!("{}+L{layer}{}", base.name, stream_letter(stream));
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
