//! `tq bench states`: the memory of multi-state caches against the context length.
//!
//! For a Gemma-4-like stack (sliding rings at head dim 256, full caches at 512, KV sharing)
//! and a Qwen3.5-like hybrid (DeltaNet conv and recurrent states, every fourth layer full
//! attention), builds the cache an allocation gives at each context length — allocation only,
//! nothing is run — and prints per state class the byte formula beside the bytes measured from
//! the buffers:
//! - sliding KV: `states × ring slots × bytes per token` — constant in the context;
//! - full KV: `states × context × bytes per token` — linear in the context;
//! - shared KV: nothing stored;
//! - fixed: `4 × Π shape` per state, f32 whatever the allocation.
//!
//! With `--model` (`smollm2`, `gemma3-270m`, a .gguf file), the same rows for that real
//! model's states instead (Gemma 3 270M: 15 sliding-window rings and 3 growing global layers),
//! at 4K, 16K and 32K tokens by default. `tq inspect` shows the same figures per preset.

use clap::Args;
use serde::Serialize;
use tq_cache::allocation::Allocation;
use tq_cache::kv_cache::KvKind;
use tq_cache::states::{ModelCache, StateKind, StateSpec};
use tq_cache::token_store::Growth;
use tq_models::fetch::ModelSpec;
use tq_models::hybrid::{GemmaLikeConfig, QwenLikeConfig};

use crate::output::table;

/// Arguments of `tq bench states`.
#[derive(Args, Debug)]
pub struct StatesBenchArgs {
    /// Print JSON rows instead of a table.
    #[arg(long)]
    json: bool,
    /// Context lengths (tokens), comma-separated [default: 1024,4096,16384,65536; with
    /// --model 4096,16384,32768 up to the model's context].
    #[arg(long, value_delimiter = ',')]
    contexts: Vec<usize>,
    /// Allocations (preset names or TOML files), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "f16,k5v4,tq3.5")]
    allocations: Vec<String>,
    /// A real model instead of the synthetic stacks: `smollm2`, `gemma3-270m` (its 15 sliding
    /// layers and 3 global ones) or a .gguf file; only its state layouts are used.
    #[arg(long)]
    model: Option<ModelSpec>,
}

/// The contexts of a real model's rows when none are given: 4K, 16K and 32K tokens, those
/// within its context.
pub(crate) fn model_contexts(context_length: usize) -> Vec<usize> {
    let contexts: Vec<usize> = [4096, 16_384, 32_768]
        .into_iter()
        .filter(|&c| c <= context_length)
        .collect();
    if contexts.is_empty() {
        vec![context_length]
    } else {
        contexts
    }
}

/// One JSON row of `tq bench states --json`: one state class of one cache.
#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct StatesRow {
    /// The architecture.
    pub model: &'static str,
    /// The allocation's name.
    pub allocation: String,
    /// Context length the cache is built for.
    pub context: usize,
    /// `sliding-kv`, `full-kv`, `shared-kv` or `fixed`.
    pub class: &'static str,
    /// States of this class.
    pub states: usize,
    /// Token slots per state (ring slots, or the context), 0 for fixed and shared states.
    pub slots: usize,
    /// Bytes per token slot of one state (codes, scales and the 4-byte position); 0 when the
    /// states of this class differ.
    pub bytes_per_token: usize,
    /// Bytes per token slot of all states of this class together.
    pub class_bytes_per_token: usize,
    /// The formula, spelled out.
    pub formula: String,
    /// Bytes by the formula.
    pub formula_bytes: usize,
    /// Bytes measured from the buffers.
    pub allocated_bytes: usize,
}

/// What one state contributes: its class, slots, bytes per slot, formula and measured bytes.
struct Part {
    class: &'static str,
    slots: usize,
    bytes_per_token: usize,
    formula_bytes: usize,
    allocated_bytes: usize,
}

fn parts(specs: &[StateSpec], cache: &ModelCache, context: usize) -> Vec<Part> {
    specs
        .iter()
        .zip(cache.memory())
        .map(|(spec, m)| match &spec.kind {
            StateKind::Kv { layout, .. } => {
                let (class, slots) = match layout.kind {
                    KvKind::Sliding { .. } => ("sliding-kv", layout.ring_slots().unwrap_or(0)),
                    KvKind::Growing { .. } => ("full-kv", context),
                };
                Part {
                    class,
                    slots,
                    bytes_per_token: m.bytes_per_token,
                    formula_bytes: slots * m.bytes_per_token,
                    allocated_bytes: m.allocated_bytes,
                }
            }
            StateKind::SharedKv { .. } => Part {
                class: "shared-kv",
                slots: 0,
                bytes_per_token: 0,
                formula_bytes: 0,
                allocated_bytes: m.allocated_bytes,
            },
            StateKind::Fixed { shape } => Part {
                class: "fixed",
                slots: 0,
                bytes_per_token: 0,
                formula_bytes: 4 * shape.iter().product::<usize>(),
                allocated_bytes: m.allocated_bytes,
            },
        })
        .collect()
}

/// The rows of one model, allocation and context: one per state class present.
pub fn measure(
    model: &'static str,
    specs: Vec<StateSpec>,
    allocation: &Allocation,
    context: usize,
) -> Result<Vec<StatesRow>, Box<dyn std::error::Error>> {
    let cache = ModelCache::with_allocation(specs, allocation)?;
    Ok(class_rows(model, &cache, &allocation.name, context))
}

/// The rows of `cache` (of `allocation`) at `context` tokens: one per state class present.
/// The formula counts ring slots for sliding states and `context` slots for growing ones,
/// whatever capacity `cache` was built with; the measured bytes are `cache`'s own (built for
/// `context` tokens by [`measure`]; a smaller template cache gives the formula alone).
pub fn class_rows(
    model: &'static str,
    cache: &ModelCache,
    allocation: &str,
    context: usize,
) -> Vec<StatesRow> {
    let parts = parts(cache.specs(), cache, context);
    let mut rows = Vec::new();
    for class in ["sliding-kv", "full-kv", "shared-kv", "fixed"] {
        let of_class: Vec<&Part> = parts.iter().filter(|p| p.class == class).collect();
        let Some(first) = of_class.first() else {
            continue;
        };
        let states = of_class.len();
        // Distinct (slots, bytes per slot, bytes) groups with their counts, in state order.
        let mut groups: Vec<(usize, &Part)> = Vec::new();
        for p in &of_class {
            match groups.iter_mut().find(|(_, g)| {
                (g.slots, g.bytes_per_token, g.formula_bytes)
                    == (p.slots, p.bytes_per_token, p.formula_bytes)
            }) {
                Some((count, _)) => *count += 1,
                None => groups.push((1, p)),
            }
        }
        let uniform = groups.len() == 1;
        let formula_bytes = of_class.iter().map(|p| p.formula_bytes).sum();
        let terms: Vec<String> = groups
            .iter()
            .map(|(count, p)| match class {
                "fixed" => format!("{count} × {}", p.formula_bytes),
                _ => format!("{count} × {} × {}", p.slots, p.bytes_per_token),
            })
            .collect();
        let formula = match class {
            "shared-kv" => format!("{states} × 0 (reads its producer)"),
            "fixed" => format!("{} (4 × Π shape)", terms.join(" + ")),
            _ => terms.join(" + "),
        };
        rows.push(StatesRow {
            model,
            allocation: allocation.to_string(),
            context,
            class,
            states,
            slots: if uniform { first.slots } else { 0 },
            bytes_per_token: if uniform { first.bytes_per_token } else { 0 },
            class_bytes_per_token: of_class.iter().map(|p| p.bytes_per_token).sum(),
            formula,
            formula_bytes,
            allocated_bytes: of_class.iter().map(|p| p.allocated_bytes).sum(),
        });
    }
    rows
}

fn mib(bytes: usize) -> String {
    format!("{:.2}", bytes as f64 / (1024.0 * 1024.0))
}

/// `tq bench states --model`: the real model's state classes.
fn run_model(args: &StatesBenchArgs) -> Result<(), Box<dyn std::error::Error>> {
    let model = crate::commands::model::open_model(&args.model)?;
    let dims = model.dims();
    let contexts = if args.contexts.is_empty() {
        model_contexts(dims.context_length)
    } else {
        args.contexts.clone()
    };
    let mut rows = Vec::new();
    for name in &args.allocations {
        let allocation = Allocation::load(name)?;
        for &context in &contexts {
            let growth = Growth::Static { capacity: context };
            rows.extend(measure(
                model.architecture(),
                model.state_specs(growth),
                &allocation,
                context,
            )?);
        }
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    let specs = model.state_specs(Growth::Static { capacity: 1 });
    println!(
        "cache memory by state class (allocation only; states × slots × bytes per token)\n\
         {}: {} layers × {} KV heads × head dim {}; {}\n{}",
        model.architecture(),
        dims.layers,
        dims.kv_heads,
        dims.head_dim,
        layer_kinds(&specs),
        states_table(&rows)
    );
    Ok(())
}

/// "15 sliding layers (window 512, ring 1023 slots), 3 global layers" for a model's states.
pub(crate) fn layer_kinds(specs: &[StateSpec]) -> String {
    let mut sliding = Vec::new();
    let mut growing = 0;
    for spec in specs {
        if let StateKind::Kv { layout, .. } = &spec.kind {
            match (layout.window(), layout.ring_slots()) {
                (Some(window), Some(slots)) => sliding.push((window, slots)),
                _ => growing += 1,
            }
        }
    }
    let mut kinds: Vec<(usize, usize)> = sliding.clone();
    kinds.sort_unstable();
    kinds.dedup();
    let rings: Vec<String> = kinds
        .iter()
        .map(|(w, s)| format!("window {w}, ring {s} slots"))
        .collect();
    match sliding.len() {
        0 => format!("{growing} layers (every token)"),
        n => format!(
            "{n} sliding layers ({}), {growing} global layers (every token)",
            rings.join("; ")
        ),
    }
}

fn states_table(rows: &[StatesRow]) -> String {
    let body: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.model.to_string(),
                r.allocation.clone(),
                r.context.to_string(),
                r.class.to_string(),
                r.formula.clone(),
                r.formula_bytes.to_string(),
                r.allocated_bytes.to_string(),
                mib(r.allocated_bytes),
                if r.formula_bytes == r.allocated_bytes {
                    "yes"
                } else {
                    "NO"
                }
                .to_string(),
            ]
        })
        .collect();
    table(
        &[
            "model",
            "allocation",
            "context",
            "state",
            "formula",
            "formula B",
            "measured B",
            "MiB",
            "equal",
        ],
        &body,
    )
}

/// Runs `tq bench states`.
pub fn run(args: &StatesBenchArgs) -> Result<(), Box<dyn std::error::Error>> {
    if args.model.is_some() {
        return run_model(args);
    }
    let contexts = if args.contexts.is_empty() {
        vec![1024, 4096, 16_384, 65_536]
    } else {
        args.contexts.clone()
    };
    let gemma = GemmaLikeConfig::gemma4_e2b_like();
    let qwen = QwenLikeConfig::qwen35_like();
    let mut rows = Vec::new();
    for name in &args.allocations {
        let allocation = Allocation::load(name)?;
        for &context in &contexts {
            let growth = Growth::Static { capacity: context };
            rows.extend(measure(
                "gemma4-like",
                gemma.state_specs(growth),
                &allocation,
                context,
            )?);
            rows.extend(measure(
                "qwen3.5-like",
                qwen.state_specs(growth),
                &allocation,
                context,
            )?);
        }
    }
    rows.sort_by(|a, b| {
        (a.model, &a.allocation, a.context).cmp(&(b.model, &b.allocation, b.context))
    });
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    println!(
        "cache memory by state class (allocation only; states × slots × bytes per token)\n\
         gemma4-like: {} layers, W = {} (ring {} slots), head dims {} sliding / {} full\n\
         qwen3.5-like: {} layers, full every {}, DeltaNet {} heads × {} × {}, conv {}\n{}",
        gemma.layers.len(),
        gemma.window,
        gemma.window + gemma.prefill_chunk - 1,
        gemma.sliding.head_dim,
        gemma.full.head_dim,
        qwen.layers,
        qwen.full_every,
        qwen.linear.heads,
        qwen.linear.key_dim,
        qwen.linear.value_dim,
        qwen.linear.conv_kernel,
        states_table(&rows)
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_real_model_gets_4k_16k_32k_within_its_context() {
        assert_eq!(model_contexts(32_768), [4096, 16_384, 32_768]);
        assert_eq!(model_contexts(8192), [4096]);
        assert_eq!(model_contexts(2048), [2048]);
    }

    /// Sliding and fixed states do not grow with the context, full ones grow linearly, the
    /// formula equals the measured bytes, and TurboQuant shrinks the KV classes only.
    #[test]
    fn sliding_constant_full_linear_formula_exact() {
        let gemma = GemmaLikeConfig::tiny(0);
        let qwen = QwenLikeConfig::tiny(0);
        let f16 = Allocation::preset("f16").unwrap();
        let k5v4 = Allocation::preset("k5v4").unwrap();
        let rows = |alloc: &Allocation, context| {
            let growth = Growth::Static { capacity: context };
            let mut r = measure("g", gemma.state_specs(growth), alloc, context).unwrap();
            r.extend(measure("q", qwen.state_specs(growth), alloc, context).unwrap());
            r
        };
        let (small, large) = (rows(&f16, 1000), rows(&f16, 4000));
        let quantized = rows(&k5v4, 1000);
        assert_eq!(small.len(), 5, "g: sliding, full, shared; q: full, fixed");
        for ((s, l), q) in small.iter().zip(&large).zip(&quantized) {
            assert_eq!(s.formula_bytes, s.allocated_bytes, "{s:?}");
            assert_eq!(l.formula_bytes, l.allocated_bytes, "{l:?}");
            match s.class {
                "full-kv" => {
                    assert_eq!(4 * s.allocated_bytes, l.allocated_bytes);
                    assert!(q.allocated_bytes < s.allocated_bytes);
                }
                "sliding-kv" => {
                    assert_eq!(s.allocated_bytes, l.allocated_bytes);
                    assert!(q.allocated_bytes < s.allocated_bytes);
                }
                "shared-kv" => assert_eq!(s.allocated_bytes, 0),
                "fixed" => {
                    assert_eq!(s.allocated_bytes, l.allocated_bytes);
                    assert_eq!(
                        q.allocated_bytes, s.allocated_bytes,
                        "fixed states stay f32"
                    );
                }
                other => panic!("unexpected class {other}"),
            }
        }
    }
}
