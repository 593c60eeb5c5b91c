//! Memory figures: cache bytes (formula and allocated) and the process peak RSS.

use serde::Serialize;
use tq_cache::allocation::{Allocation, AllocationError, ModelShape, StreamKind};
use tq_cache::states::ModelCache;

/// What an allocation's cache costs on one model.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct CacheCost {
    /// Bytes a token stores in every layer's keys and values, from the allocation's stream
    /// plans (codes, sign bits, norms; no position table).
    pub bytes_per_token_formula: usize,
    /// Bytes per token slot of the built cache as allocated: measured buffer capacities
    /// (positions and any full-precision sink/recent copies included) ÷ slots.
    pub bytes_per_token_allocated: f64,
    /// `8 · bytes_per_token_formula / (2 · layers · kv_heads · head_dim)`.
    pub bits_per_value: f64,
    /// Stored bits per key value, averaged over layers and heads.
    pub key_bits_per_value: f64,
    /// Stored bits per value-stream value, averaged over layers and heads.
    pub value_bits_per_value: f64,
    /// Bytes the built cache holds, measured from its buffers.
    pub cache_bytes_allocated: usize,
    /// Bytes the built cache holds, by the layout formula.
    pub cache_bytes_formula: usize,
}

/// The cost of `allocation` on `shape`, with the built `cache` of `slots` token slots.
pub fn cache_cost(
    allocation: &Allocation,
    shape: &ModelShape,
    cache: &ModelCache,
    slots: usize,
) -> Result<CacheCost, AllocationError> {
    let mut bytes = 0usize;
    for plan in allocation.plans(shape) {
        bytes += plan?.bytes_per_token();
    }
    let values = 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim;
    let memory = cache.memory();
    let allocated: usize = memory.iter().map(|m| m.allocated_bytes).sum();
    let formula: usize = memory.iter().map(|m| m.formula_bytes).sum();
    Ok(CacheCost {
        bytes_per_token_formula: bytes,
        bytes_per_token_allocated: allocated as f64 / slots.max(1) as f64,
        bits_per_value: 8.0 * bytes as f64 / values as f64,
        key_bits_per_value: allocation.bits_per_value(shape, StreamKind::Key)?,
        value_bits_per_value: allocation.bits_per_value(shape, StreamKind::Value)?,
        cache_bytes_allocated: allocated,
        cache_bytes_formula: formula,
    })
}

/// The process's peak resident set (`VmHWM` of `/proc/self/status`), in bytes; `None` where
/// the file does not exist (not Linux) or has no such line.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    parse_vm_hwm(&status)
}

/// The `VmHWM:  <n> kB` line of a `/proc/<pid>/status` text, in bytes.
pub fn parse_vm_hwm(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let mut words = line["VmHWM:".len()..].split_whitespace();
    let value: u64 = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") => Some(value * 1024),
        _ => None,
    }
}

/// Resets the peak RSS to the current RSS (Linux ≥ 4.0: writing `5` to
/// `/proc/self/clear_refs`), so the next [`peak_rss_bytes`] covers only what follows.
/// Returns whether the reset took effect; where it does not, the peak covers the whole
/// process and is still an upper bound.
pub fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}
