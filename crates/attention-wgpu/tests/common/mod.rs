//! Builders shared by the GPU tests: the adapter (required when `CI=true`, else skipped with a
//! printed reason), codecs, layouts and deterministic vectors.
#![allow(dead_code)]

use std::sync::{Arc, OnceLock};

use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use rand_distr::{Distribution, StandardNormal};
use tq_attention_wgpu::{ContextOptions, GpuContext, SplitLimits};
use tq_cache::CodecSpec;
use tq_cache::codec::{MseSpec, ProdSpec};
use tq_cache::kv_cache::{KvCache, KvKind, KvLayout};
use tq_cache::token_store::Growth;
use tq_qjl::SketchKind;
use tq_rotation::RotationKind;

fn required() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

fn make(limits: Option<SplitLimits>) -> Option<Arc<GpuContext>> {
    match GpuContext::new(&ContextOptions {
        split_limits: limits,
        ..ContextOptions::default()
    }) {
        Ok(ctx) => {
            eprintln!(
                "GPU tests on {} ({:?}, {:?})",
                ctx.adapter_info().name,
                ctx.adapter_info().backend,
                ctx.adapter_info().device_type
            );
            Some(Arc::new(ctx))
        }
        Err(e) if required() => panic!("CI=true requires a GPU adapter (lavapipe will do): {e}"),
        Err(e) => {
            eprintln!("skipping GPU test: {e}");
            None
        }
    }
}

/// The shared context with the device's own limits (`None`: no adapter, test skipped).
pub fn context() -> Option<Arc<GpuContext>> {
    static CONTEXT: OnceLock<Option<Arc<GpuContext>>> = OnceLock::new();
    CONTEXT.get_or_init(|| make(None)).clone()
}

/// A context whose split limits are tiny, so pages hold a few tokens, partials need many
/// windows and grids fold into y and z.
pub fn tiny_context(
    max_binding_bytes: u64,
    max_workgroups_per_dimension: u32,
) -> Option<Arc<GpuContext>> {
    make(Some(SplitLimits {
        max_binding_bytes,
        max_workgroups_per_dimension,
    }))
}

/// Gaussian vectors with a few outlier channels, like real keys.
pub fn vectors(n: usize, dim: usize, seed: u64) -> Vec<f32> {
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    (0..n * dim)
        .map(|i| {
            let g: f32 = StandardNormal.sample(&mut rng);
            if i % dim % 16 == 3 { 6.0 * g } else { g }
        })
        .collect()
}

/// Codec families, indexed 0..CODECS.
pub const CODECS: usize = 9;

/// Codec `kind` at dimension `dim`: b bits for mse (1..=8) and prod (2..=9).
pub fn codec(kind: usize, dim: usize, bits: u8, seed: u64) -> CodecSpec {
    let mse = |rotation| MseSpec {
        dim,
        bits: bits.clamp(1, 8),
        rotation,
        seed,
        norm_correction: false,
    };
    match kind % CODECS {
        0 => CodecSpec::F32 { dim },
        1 => CodecSpec::F16 { dim },
        2 => CodecSpec::Mse(mse(RotationKind::Hadamard)),
        3 => CodecSpec::Mse(MseSpec {
            norm_correction: true,
            ..mse(RotationKind::Haar)
        }),
        4 => CodecSpec::DebiasedMse(mse(RotationKind::Hadamard)),
        5 => CodecSpec::Prod(ProdSpec::orthogonal(dim, bits.clamp(2, 9), seed).shrinkage(0.7)),
        6 => CodecSpec::Prod(ProdSpec::paper(dim, bits.clamp(2, 9), seed)),
        7 => {
            let mut spec = ProdSpec::orthogonal(dim, bits.clamp(2, 9), seed);
            spec.sketch.kind = SketchKind::Hadamard;
            CodecSpec::Prod(spec)
        }
        _ => CodecSpec::Mse(mse(RotationKind::Haar)),
    }
}

pub fn growing(kv_heads: usize, head_dim: usize) -> KvLayout {
    KvLayout {
        kv_heads,
        head_dim,
        kind: KvKind::Growing {
            growth: Growth::Doubling { initial: 7 },
        },
        max_rewind: 0,
        rope_pairs: tq_cache::basis::RopePairs::Adjacent,
        rope_base: Default::default(),
    }
}

pub fn sliding(kv_heads: usize, head_dim: usize, window: usize, max_rewind: usize) -> KvLayout {
    KvLayout {
        kv_heads,
        head_dim,
        kind: KvKind::Sliding { window },
        max_rewind,
        rope_pairs: tq_cache::basis::RopePairs::Adjacent,
        rope_base: Default::default(),
    }
}

/// Appends `n` tokens at positions `start..start+n` with deterministic keys and values;
/// returns them (`[n, kv_heads, head_dim]` each).
pub fn fill(
    cache: &mut KvCache,
    start: u32,
    n: usize,
    seed: u64,
) -> (Vec<f32>, Vec<f32>, Vec<u32>) {
    let width = cache.layout().kv_heads * cache.layout().head_dim;
    let keys = vectors(n, width, seed);
    let values = vectors(n, width, seed ^ 0xFFFF);
    let positions: Vec<u32> = (start..start + n as u32).collect();
    cache.append(&keys, &values, &positions).unwrap();
    (keys, values, positions)
}
