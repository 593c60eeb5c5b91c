//! `WgpuAttention` without the model: what the GPU path does not implement is a typed error
//! when the backend is built, inconsistent calls are typed errors, and a sequence the CPU
//! started continues on the GPU (`from_cache`) with the same attention.
//!
//! Needs a GPU adapter (skipped with a message when absent, failing when `CI=true`).

mod wgpu_common;

use tq_attention_wgpu::GpuError;
use tq_cache::allocation::Allocation;
use tq_cache::attention::{AttentionKernel, AttentionShape};
use tq_cache::kv_cache::{KvKind, KvLayout};
use tq_cache::states::{ModelCache, StateKind, StateSpec};
use tq_cache::token_store::Growth;
use tq_models::llama::{AttentionBackend, CpuAttention, ModelError, WgpuAttention};
use wgpu_common::context_or_skip;

const LAYERS: usize = 2;
const KV_HEADS: usize = 1;
const Q_HEADS: usize = 2;
const DIM: usize = 64;

fn kv_spec(layer: usize) -> StateSpec {
    StateSpec {
        name: format!("blk.{layer}.kv"),
        kind: StateKind::Kv {
            layer,
            layout: KvLayout {
                kv_heads: KV_HEADS,
                head_dim: DIM,
                kind: KvKind::Growing {
                    growth: Growth::Static { capacity: 32 },
                },
                max_rewind: 0,
                rope_pairs: tq_cache::basis::RopePairs::Adjacent,
                rope_base: Default::default(),
            },
        },
    }
}

fn cache(allocation: &Allocation) -> ModelCache {
    ModelCache::with_allocation((0..LAYERS).map(kv_spec).collect(), allocation).unwrap()
}

fn shape() -> AttentionShape {
    AttentionShape {
        q_heads: Q_HEADS,
        scale: 1.0 / (DIM as f32).sqrt(),
    }
}

/// Deterministic values in [−1, 1) that differ per call (no RNG needed: a hash of the index).
fn data(n: usize, salt: u32) -> Vec<f32> {
    (0..n as u32)
        .map(|i| {
            let h = (i ^ salt.wrapping_mul(0x9E37_79B9)).wrapping_mul(0x85EB_CA6B);
            (h >> 8) as f32 / (1u32 << 23) as f32 - 1.0
        })
        .collect()
}

fn unsupported(result: Result<WgpuAttention, ModelError>) -> String {
    match result {
        Err(ModelError::Gpu(GpuError::Unsupported(what))) => what,
        other => panic!("expected GpuError::Unsupported, got {other:?}"),
    }
}

#[test]
fn unsupported_configurations_are_typed_errors() {
    let Some(ctx) = context_or_skip() else {
        return;
    };
    let prod_tiers = Allocation::from_toml_str(
        "name = \"prod-tiers\"\nkey = { codec = \"prod\", bits = 4 }\n\
         value = { codec = \"mse\", bits = 3 }\n\
         [outliers]\nfraction = 0.25\nkey = { bits = 5 }\nvalue = { bits = 4 }\n",
    )
    .unwrap();
    let what = unsupported(WgpuAttention::new(&ctx, &cache(&prod_tiers)));
    assert!(what.contains("TQ_mse"), "{what}");

    let shared = ModelCache::with_allocation(
        vec![
            kv_spec(0),
            StateSpec {
                name: "blk.1.shared".into(),
                kind: StateKind::SharedKv {
                    layer: 1,
                    source_layer: 0,
                },
            },
        ],
        &Allocation::preset("mse-k4v4").unwrap(),
    )
    .unwrap();
    // KV sharing runs on the GPU (tests/wgpu_shared_kv.rs): the sharer reads layer 0's cache.
    let gpu = WgpuAttention::new(&ctx, &shared).unwrap();
    assert_eq!(gpu.layers(), 2);
    assert!(std::ptr::eq(gpu.layer(1).unwrap(), gpu.layer(0).unwrap()));
    // A fixed state (a recurrent layer's) is not attention's to hold.
    let fixed = ModelCache::with_allocation(
        vec![
            kv_spec(0),
            StateSpec {
                name: "blk.1.conv".into(),
                kind: StateKind::Fixed { shape: vec![3, 8] },
            },
        ],
        &Allocation::preset("mse-k4v4").unwrap(),
    )
    .unwrap();
    let what = unsupported(WgpuAttention::new(&ctx, &fixed));
    assert!(what.contains("blk.1.conv"), "{what}");
    // RoPE-aware key centering runs on the GPU for a layer's every KV head, not some of them
    // (one key descriptor per layer).
    let mut spec = kv_spec(0);
    if let StateKind::Kv { layout, .. } = &mut spec.kind {
        layout.rope_base = tq_cache::rope_center::RopeBase::new(10_000.0);
        layout.kv_heads = 2;
    }
    let rope = Allocation::from_toml_str(
        "name = \"rope\"\nkey = { codec = \"mse\", bits = 4 }\n\
         value = { codec = \"mse\", bits = 4 }\n\
         [[override]]\nlayers = [0]\nheads = [0]\nkey = { center = \"rope\" }\n",
    )
    .unwrap();
    let rope = ModelCache::with_allocation(vec![spec], &rope).unwrap();
    let what = unsupported(WgpuAttention::new(&ctx, &rope));
    assert!(what.contains("rope"), "{what}");
}

#[test]
fn inconsistent_calls_are_typed_errors() {
    let Some(ctx) = context_or_skip() else {
        return;
    };
    let mut gpu = WgpuAttention::new(&ctx, &cache(&Allocation::preset("k5v4").unwrap())).unwrap();
    let (q, kv) = (data(Q_HEADS * DIM, 1), data(KV_HEADS * DIM, 2));
    let mut out = vec![0.0f32; q.len()];
    // Layer beyond the model.
    let err = gpu
        .attend(LAYERS, &q, &kv, &kv, &[0], shape(), &mut out)
        .unwrap_err();
    assert!(matches!(err, ModelError::InvalidCall(_)), "{err:?}");
    // Positions claim one cached token the GPU cache does not hold.
    let err = gpu
        .attend(0, &q, &kv, &kv, &[0, 1], shape(), &mut out)
        .unwrap_err();
    assert!(matches!(err, ModelError::InvalidCall(_)), "{err:?}");
    // Queries that are not whole tokens.
    let err = gpu
        .attend(0, &q[1..], &kv, &kv, &[0], shape(), &mut out)
        .unwrap_err();
    assert!(
        matches!(err, ModelError::Gpu(GpuError::Shape { .. })),
        "{err:?}"
    );
    // A non-finite key is rejected before anything is appended.
    let mut bad = kv.clone();
    bad[3] = f32::NAN;
    let err = gpu
        .attend(0, &q, &bad, &kv, &[0], shape(), &mut out)
        .unwrap_err();
    assert!(
        matches!(err, ModelError::Gpu(GpuError::Codec(_))),
        "{err:?}"
    );
    assert!(gpu.is_empty(), "failed calls append nothing");
    gpu.attend(0, &q, &kv, &kv, &[0], shape(), &mut out)
        .unwrap();
    assert_eq!(gpu.layer(0).map(|c| c.len()), Some(1));
}

/// A prompt prefilled on the CPU, uploaded with `from_cache`, then one decode step on each
/// backend: the same attention within the f32 summation-order bound of the crate's tests
/// (1e-4 of the largest |output|).
#[test]
fn from_cache_continues_a_cpu_sequence() {
    let Some(ctx) = context_or_skip() else {
        return;
    };
    for preset in [
        "mse-k4v4",
        "k5v4",
        "f16",
        "tq3.5",
        "mse-k4v4-c",
        "rec3.25-global",
        "rec4.25",
    ] {
        let allocation = Allocation::preset(preset).unwrap();
        let mut cpu_cache = cache(&allocation);
        let prefill = 11;
        let positions: Vec<u32> = (0..=prefill as u32).collect();
        let mut out = vec![0.0f32; prefill * Q_HEADS * DIM];
        for layer in 0..LAYERS {
            let salt = 10 * layer as u32;
            CpuAttention {
                cache: &mut cpu_cache,
                kernel: AttentionKernel::Fused,
            }
            .attend(
                layer,
                &data(prefill * Q_HEADS * DIM, salt),
                &data(prefill * KV_HEADS * DIM, salt + 1),
                &data(prefill * KV_HEADS * DIM, salt + 2),
                &positions[..prefill],
                shape(),
                &mut out,
            )
            .unwrap();
        }
        let mut gpu = WgpuAttention::from_cache(&ctx, &cpu_cache).unwrap();
        assert_eq!(gpu.len(), prefill, "{preset}");
        for layer in 0..LAYERS {
            let salt = 10 * layer as u32 + 100;
            let (q, k, v) = (
                data(Q_HEADS * DIM, salt),
                data(KV_HEADS * DIM, salt + 1),
                data(KV_HEADS * DIM, salt + 2),
            );
            let mut expected = vec![0.0f32; q.len()];
            CpuAttention {
                cache: &mut cpu_cache,
                kernel: AttentionKernel::Fused,
            }
            .attend(layer, &q, &k, &v, &positions, shape(), &mut expected)
            .unwrap();
            let mut got = vec![0.0f32; q.len()];
            gpu.attend(layer, &q, &k, &v, &positions, shape(), &mut got)
                .unwrap();
            let top = expected.iter().fold(0.0f32, |m, x| m.max(x.abs()));
            assert!(top > 0.0, "{preset}: a non-trivial output");
            for (i, (a, b)) in got.iter().zip(&expected).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-4 * top,
                    "{preset} layer {layer} output {i}: wgpu {a} vs cpu {b} (max {top})"
                );
            }
        }
        assert_eq!(gpu.len(), prefill + 1, "{preset}");
    }
}
