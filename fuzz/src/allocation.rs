//! The allocation target: TOML in, a resolved plan and a working cache out.

use crate::sample;
use tq_cache::CacheError;
use tq_cache::allocation::{Allocation, LayerKind, ModelShape, StreamKind};

/// A Gemma-3-like mix: two sliding-window layers, then a global one, at another head size.
const MIXED: ModelShape = ModelShape {
    num_layers: 3,
    num_kv_heads: 1,
    head_dim: 24,
};
const MIXED_KINDS: [LayerKind; 3] = [LayerKind::Sliding, LayerKind::Sliding, LayerKind::Global];

/// Parses `data` as an allocation file and, if it is accepted, writes it back, resolves it
/// against two model shapes and builds and fills a small cache with it.
///
/// Panics when an accepted allocation does not survive TOML → value → TOML unchanged, when
/// one that [`Allocation::validate_for`] accepted then fails to resolve a stream, reports
/// non-positive or non-finite bits, or cannot build (and fill) the cache of that shape for any
/// reason but memory ([`CacheError::StorageTooLarge`]), or when anything panics instead of
/// returning its typed error.
pub fn allocation(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(allocation) = Allocation::from_toml_str(text) else {
        return;
    };
    let written = allocation
        .to_toml_string()
        .expect("an accepted allocation writes");
    let reread = Allocation::from_toml_str(&written).expect("its own TOML reads back");
    assert_eq!(reread, allocation, "TOML round trip of\n{written}");

    for (shape, kinds) in [(sample::SHAPE, &[][..]), (MIXED, &MIXED_KINDS[..])] {
        if allocation.validate_for(&shape).is_err() {
            continue;
        }
        for stream in StreamKind::BOTH {
            let bits = allocation
                .bits_per_value_in(&shape, kinds, stream)
                .expect("a validated allocation resolves");
            assert!(bits.is_finite() && bits > 0.0, "{bits} bits per value");
        }
    }
    if allocation.validate_for(&sample::SHAPE).is_ok() {
        let mut cache = match sample::cache(&allocation) {
            // Validation checks the schema, not memory: `recent_fp_tokens = 299999999999` is a
            // valid allocation whose full-precision copies no machine can hold (found by this
            // target; before `TokenStore::new` checked, the process aborted).
            Err(CacheError::StorageTooLarge { .. }) => return,
            built => built.expect("a validated allocation builds"),
        };
        crate::on_one_thread(|| {
            // The first batch is longer than the head dimension, so a basis is fitted.
            for (tokens, seed) in [(17, 1), (1, 2)] {
                sample::append(&mut cache, tokens, seed).expect("a validated allocation stores");
            }
        });
    }
}
