//! What each crash the fuzz targets found was, checked directly (the inputs also replay
//! through the targets in `replay.rs`). `docs/fuzzing.md` lists them.

use std::path::Path;
use std::sync::Arc;
use tq_cache::allocation::Allocation;
use tq_models::causal_lm::CausalLm;
use tq_models::gemma3::Gemma3;
use tq_models::gguf::Gguf;

fn regression(target: &str, name: &str) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("regressions")
        .join(target)
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The tiny Gemma 3 seed with `gemma3.attention.sliding_window` mutated to 2,432,696,324 and
/// a context of 8: its ring was sized by the window, and the f16 cache for 2 tokens asked for
/// 78 GB, which aborted the process. A window beyond the context is now the whole context.
#[test]
fn a_window_beyond_the_context_is_the_context() {
    let file = Gguf::from_bytes(regression("gguf", "gemma3-window-beyond-context.gguf")).unwrap();
    assert_eq!(
        file.metadata_u32("gemma3.attention.sliding_window")
            .unwrap(),
        2_432_696_324
    );
    let model = Gemma3::from_gguf(Arc::new(file)).unwrap();
    assert_eq!(model.config.context_length, 8);
    assert_eq!(model.config.sliding_window, 8);
    let cache = model
        .new_cache(&Allocation::preset("f16").unwrap(), 2)
        .unwrap();
    let bytes: usize = cache.memory().iter().map(|m| m.allocated_bytes).sum();
    assert!(bytes < 1 << 20, "{bytes} bytes");
}

/// A saved cache whose last stored position was mutated to `u32::MAX` (the CRC recomputed):
/// the next token's position overflowed (`p + 1`), a panic with overflow checks and a wrapped
/// position without. Such a file loads (its positions still increase), and the next token is
/// now a typed error: no position comes after `u32::MAX`.
#[test]
fn no_position_after_the_last_representable_one() {
    let file = tq_fuzz::with_crc(&regression("cache_file", "last-position-u32-max.tqc"));
    let mut cache = tq_cache::persist::from_bytes(&file).unwrap();
    let positions: Vec<u32> = (0..=cache.len() as u32).collect();
    let spec = cache.specs()[0].clone();
    let tq_cache::states::StateKind::Kv { layer, layout } = spec.kind else {
        panic!("{spec:?}")
    };
    let row = vec![0.25; layout.kv_heads * layout.head_dim];
    let mut out = row.clone();
    let shape = tq_cache::attention::AttentionShape {
        q_heads: layout.kv_heads,
        scale: 0.125,
    };
    let err = cache
        .forward_layer(
            layer,
            &row,
            Some((&row, &row)),
            &positions,
            shape,
            tq_cache::attention::AttentionKernel::Fused,
            &mut out,
        )
        .unwrap_err();
    assert!(
        matches!(
            err,
            tq_cache::CacheError::PositionGap {
                expected: u32::MAX,
                ..
            }
        ),
        "{err}"
    );
}

/// An allocation keeping 299,999,999,999 recent tokens in f32 passes validation (the schema
/// has no memory bound) and its cache cannot be built: the up-front store of recent copies is
/// `CacheError::StorageTooLarge`, where it used to abort the process.
#[test]
fn recent_copies_beyond_memory_are_a_typed_error() {
    let text = regression("allocation", "recent-copies-beyond-memory.toml");
    let allocation = Allocation::from_toml_str(std::str::from_utf8(&text).unwrap()).unwrap();
    assert_eq!(allocation.recent_fp_tokens, 299_999_999_999);
    allocation.validate_for(&tq_fuzz::sample::SHAPE).unwrap();
    let err = tq_fuzz::sample::cache(&allocation).unwrap_err();
    assert!(
        matches!(
            err,
            tq_cache::CacheError::StorageTooLarge {
                tokens: 300_000_000_001,
                ..
            }
        ),
        "{err}"
    );
}
