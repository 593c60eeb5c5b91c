//! KV-sharing layers on the GPU: the Gemma-like hybrid stack (`GemmaLike::tiny`: sliding
//! layers of d = 32 on rings, full layers of d = 64, a sliding layer sharing layer 3's cache
//! and a full one sharing layer 2's) run through `WgpuAttention`, whose sharers read their
//! producers' GPU caches (`attend_shared`) and store nothing.
//!
//! 1. Layer by layer on identical inputs against the CPU's exact kernel (`Reference`: every
//!    visible token decoded, f64 sums), through a prompt in chunks of 8 and decode steps past
//!    the rings' wrap: the same records, the same sums in another f32 order, so outputs differ
//!    by ~1e-6 of the call's largest |output|; the bound is the GPU crate's 1e-4 (a wrong
//!    producer, offset, mask or window moves outputs by > 1e-2). Allocations: rows (`k5v4`),
//!    the fast-scan order with bit planes (3-bit keys, 6-bit values), four f16 sinks and
//!    centering (`rec4.25-global`), the recommended `rec4.25` (plane basis, sinks, 8-bit
//!    recent windows), and f16 windows of 3 and 5 tokens, shorter than a chunk, which a sharer
//!    reads per query as its producer's step did.
//! 2. The whole model on the GPU alone: its logits against the CPU run's. The hybrid stack's
//!    projections are f32 (no activation quantization), so per-layer differences of ~1e-6
//!    stay ~1e-5 of the logits through six layers; the bound is 1e-3 of the largest |logit|.
//!
//! Needs a GPU adapter (skipped with a message when absent, failing when `CI=true`).

mod wgpu_common;
mod wgpu_paired;

use tq_cache::allocation::Allocation;
use tq_cache::attention::{AttentionKernel, AttentionShape};
use tq_models::hybrid::{GemmaLike, GemmaLikeConfig, HybridScratch};
use tq_models::llama::{AttentionBackend, CpuAttention, Logits, ModelError, WgpuAttention};
use wgpu_common::context_or_skip;
use wgpu_paired::Paired;

const PROMPT: usize = 30;
const CHUNK: usize = 8;
const DECODE_STEPS: usize = 12;

fn allocations() -> Vec<Allocation> {
    let fast = Allocation::from_toml_str(
        "name = \"fast-k3v6\"\n\
         key = { codec = \"mse\", bits = 3, record_order = \"fast-scan\" }\n\
         value = { codec = \"mse\", bits = 6, record_order = \"fast-scan\" }",
    )
    .unwrap();
    // Windows shorter than a prefill chunk: within a chunk each query reads its own newest
    // tokens from the copies, and so must the full layer's sharer.
    let short_windows = Allocation::from_toml_str(
        "name = \"k4v4-w3\"\nsink_tokens = 1\n\
         key = { codec = \"mse\", bits = 4, recent_fp_tokens = 3 }\n\
         value = { codec = \"mse\", bits = 4, recent_fp_tokens = 5 }",
    )
    .unwrap();
    let mut out: Vec<Allocation> = ["k5v4", "rec4.25-global", "rec4.25"]
        .iter()
        .map(|p| Allocation::preset(p).unwrap())
        .collect();
    out.insert(1, fast);
    out.push(short_windows);
    out
}

fn prompt() -> Vec<u32> {
    (0..PROMPT as u32).map(|i| (i * 13 + 5) % 48).collect()
}

/// Runs `forward` over the prompt in chunks, then greedy decode steps; returns every call's
/// last logits.
fn drive(
    model: &GemmaLike,
    mut forward: impl FnMut(&[u32], &[u32], &mut HybridScratch) -> Vec<f32>,
) -> Vec<Vec<f32>> {
    let positions: Vec<u32> = (0..(PROMPT + DECODE_STEPS) as u32).collect();
    let mut scratch = HybridScratch::default();
    let mut all = Vec::new();
    let mut done = 0;
    for piece in prompt().chunks(CHUNK) {
        done += piece.len();
        all.push(forward(piece, &positions[..done], &mut scratch));
    }
    for _ in 0..DECODE_STEPS {
        let last = all.last().unwrap();
        let next = (0..model.vocab())
            .max_by(|&a, &b| last[a].total_cmp(&last[b]))
            .unwrap() as u32;
        done += 1;
        all.push(forward(&[next], &positions[..done], &mut scratch));
    }
    all
}

#[test]
fn shared_kv_layers_read_their_producers_gpu_caches() {
    let Some(ctx) = context_or_skip() else {
        return;
    };
    let model = GemmaLike::new(GemmaLikeConfig::tiny(3)).unwrap();
    let layers = model.config.layers.len();
    let sharers = model
        .config
        .layers
        .iter()
        .filter(|l| l.shares.is_some())
        .count();
    assert!(sharers > 0);
    let capacity = PROMPT + DECODE_STEPS;
    for allocation in allocations() {
        let name = allocation.name.clone();
        // 1. Layer by layer.
        let mut cache = model.new_cache(&allocation, capacity).unwrap();
        let gpu = WgpuAttention::new(&ctx, &cache).unwrap();
        assert_eq!(gpu.layers(), layers, "{name}");
        let mut paired = Paired::new(
            CpuAttention {
                cache: &mut cache,
                kernel: AttentionKernel::Reference,
            },
            gpu,
        );
        let cpu_logits = drive(&model, |tokens, positions, scratch| {
            model
                .forward_with(tokens, positions, &mut paired, Logits::Last, scratch)
                .unwrap()
                .to_vec()
        });
        let forwards = PROMPT.div_ceil(CHUNK) + DECODE_STEPS;
        assert_eq!(paired.calls, layers * forwards, "{name}: every layer ran");
        assert_eq!(paired.shared_calls, sharers * forwards, "{name}");
        assert_eq!(paired.gpu.len(), capacity, "{name}");
        eprintln!(
            "{name}: largest per-layer difference {:.2e} of max |output|",
            paired.worst
        );
        assert!(
            paired.worst <= 1e-4,
            "{name}: GPU attention differs from the CPU's by {:.3e} of max |output|",
            paired.worst
        );
        // The CPU model itself (its own entry point) gives what the backend seam gave.
        let mut own = model.new_cache(&allocation, capacity).unwrap();
        let direct = drive(&model, |tokens, positions, scratch| {
            model
                .forward(
                    tokens,
                    positions,
                    &mut own,
                    AttentionKernel::Reference,
                    Logits::Last,
                    scratch,
                )
                .unwrap()
                .to_vec()
        });
        assert_eq!(
            direct, cpu_logits,
            "{name}: forward and forward_with(CpuAttention)"
        );

        // 2. The whole model on the GPU.
        let template = model.new_cache(&allocation, capacity).unwrap();
        let mut gpu = WgpuAttention::new(&ctx, &template).unwrap();
        let gpu_logits = drive(&model, |tokens, positions, scratch| {
            model
                .forward_with(tokens, positions, &mut gpu, Logits::Last, scratch)
                .unwrap()
                .to_vec()
        });
        for (step, (g, c)) in gpu_logits.iter().zip(&cpu_logits).enumerate() {
            let top = c.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let worst = g
                .iter()
                .zip(c)
                .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(
                worst <= 1e-3 * top,
                "{name}: call {step}: GPU logits differ by {worst} (largest |logit| {top})"
            );
        }
        // A sharer stores nothing: only the producers have caches on the device.
        assert_eq!(gpu.len(), capacity, "{name}");
    }
}

/// A producer called as a sharer, a sharer called with keys and values or before its
/// producer, queries beyond the producer's last step on windowed streams, and a fixed state are
/// typed errors.
#[test]
fn shared_kv_misuse_is_a_typed_error() {
    let Some(ctx) = context_or_skip() else {
        return;
    };
    let model = GemmaLike::new(GemmaLikeConfig::tiny(3)).unwrap();
    let cache = model
        .new_cache(&Allocation::preset("k5v4").unwrap(), 16)
        .unwrap();
    let mut gpu = WgpuAttention::new(&ctx, &cache).unwrap();
    let shape = AttentionShape {
        q_heads: 2,
        scale: 0.125,
    };
    let (q, kv) = (vec![0.1f32; 2 * 32], vec![0.1f32; 32]);
    let mut out = vec![0.0f32; 2 * 32];
    // Layer 0 produces; layer 4 shares layer 3 (both sliding, d = 32).
    let err = gpu.attend_shared(0, &q, &[0], shape, &mut out).unwrap_err();
    assert!(matches!(err, ModelError::InvalidCall(_)), "{err}");
    let err = gpu
        .attend(4, &q, &kv, &kv, &[0], shape, &mut out)
        .unwrap_err();
    assert!(matches!(err, ModelError::InvalidCall(_)), "{err}");
    // Before its producer ran this step, a sharer's positions outrun the shared cache.
    let err = gpu.attend_shared(4, &q, &[0], shape, &mut out).unwrap_err();
    assert!(matches!(err, ModelError::InvalidCall(_)), "{err}");
    // With recent windows a sharer reads the windows of its producer's last step: queries
    // beyond that step's tokens are refused, not answered with other windows.
    let windowed = Allocation::from_toml_str(
        "name = \"k4v4-w3\"\n\
         key = { codec = \"mse\", bits = 4, recent_fp_tokens = 3 }\n\
         value = { codec = \"mse\", bits = 4, recent_fp_tokens = 3 }",
    )
    .unwrap();
    let cache = model.new_cache(&windowed, 16).unwrap();
    let mut gpu = WgpuAttention::new(&ctx, &cache).unwrap();
    // Layer 2 (full, d = 64) produces for layer 5.
    let (q, kv) = (vec![0.1f32; 2 * 64], vec![0.1f32; 64]);
    let mut out = vec![0.0f32; 2 * 64];
    for t in 0..2u32 {
        let positions: Vec<u32> = (0..=t).collect();
        gpu.attend(2, &q, &kv, &kv, &positions, shape, &mut out)
            .unwrap();
    }
    gpu.attend_shared(5, &q, &[0, 1], shape, &mut out).unwrap();
    let (q2, mut out2) = (vec![0.1f32; 2 * 2 * 64], vec![0.0f32; 2 * 2 * 64]);
    let err = gpu
        .attend_shared(5, &q2, &[0, 1], shape, &mut out2)
        .unwrap_err();
    assert!(matches!(err, ModelError::Gpu(_)), "{err}");
    let qwen = tq_models::hybrid::QwenLike::new(tq_models::hybrid::QwenLikeConfig::tiny(1))
        .unwrap()
        .new_cache(&Allocation::preset("k5v4").unwrap(), 16)
        .unwrap();
    let err = WgpuAttention::new(&ctx, &qwen).unwrap_err();
    assert!(matches!(err, ModelError::Gpu(_)), "{err}");
}
