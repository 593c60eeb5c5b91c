//! The saved-cache target: `persist::from_bytes` on mutated files.

use tq_cache::attention::{AttentionKernel, AttentionShape};
use tq_cache::persist::{from_bytes, to_bytes};
use tq_cache::states::{ModelCache, StateKind};

/// Query rows above this are not worth a fuzzing iteration: the next-token check is skipped
/// for caches declaring huge heads (which the loader accepts as long as the records fit).
const MAX_NEXT_TOKEN_FLOATS: usize = 1 << 14;

/// `contents` followed by its CRC-32, the checksum a saved cache ends with.
///
/// ```
/// let file = tq_fuzz::with_crc(b"abc");
/// assert_eq!(file.len(), 7);
/// ```
pub fn with_crc(contents: &[u8]) -> Vec<u8> {
    let mut file = contents.to_vec();
    file.extend(crc32fast::hash(contents).to_le_bytes());
    file
}

/// Loads `data`, completed with its CRC-32 ([`with_crc`]: the checksum test is one comparison,
/// and without this nearly every mutation would stop there), as a saved cache. If it loads,
/// it is saved again, reloaded, and given one more token on every KV layer.
///
/// Panics when an accepted file does not save, when the second save is not bit-identical to
/// the first (what is accepted is what is kept), or when anything panics instead of returning
/// its typed error.
pub fn cache_file(data: &[u8]) {
    let Ok(mut cache) = from_bytes(&with_crc(data)) else {
        return;
    };
    let saved = to_bytes(&cache).expect("a loaded cache saves");
    let reloaded = from_bytes(&saved).expect("its own save loads");
    assert_eq!(
        to_bytes(&reloaded).expect("saves again"),
        saved,
        "save → load → save is not bit-identical"
    );
    crate::on_one_thread(|| next_token(&mut cache));
}

/// One more token through every producer layer, then every sharing layer: whatever a loaded
/// file declares, attention over it must return or refuse, never read outside the records.
fn next_token(cache: &mut ModelCache) {
    let positions: Vec<u32> = (0..=cache.len() as u32).collect();
    let specs = cache.specs().to_vec();
    let layout_of = |layer: usize| {
        specs.iter().find_map(|s| match &s.kind {
            StateKind::Kv { layer: l, layout } if *l == layer => Some(*layout),
            _ => None,
        })
    };
    // (layer, the layer whose cache it reads, whether it writes that cache)
    let mut layers: Vec<(usize, usize, bool)> = specs
        .iter()
        .filter_map(|s| match &s.kind {
            StateKind::Kv { layer, .. } => Some((*layer, *layer, true)),
            StateKind::SharedKv {
                layer,
                source_layer,
            } => Some((*layer, *source_layer, false)),
            StateKind::Fixed { .. } => None,
        })
        .collect();
    layers.sort_by_key(|&(layer, _, produces)| (!produces, layer));
    for (layer, source, produces) in layers {
        let Some(layout) = layout_of(source) else {
            continue;
        };
        let Some(floats) = layout.kv_heads.checked_mul(layout.head_dim) else {
            continue;
        };
        if floats == 0 || floats > MAX_NEXT_TOKEN_FLOATS {
            continue;
        }
        let row = vec![0.25_f32; floats];
        let mut out = vec![0.0; floats];
        let shape = AttentionShape {
            q_heads: layout.kv_heads,
            scale: 0.125,
        };
        let kv = produces.then_some((&row[..], &row[..]));
        let _ = cache.forward_layer(
            layer,
            &row,
            kv,
            &positions,
            shape,
            AttentionKernel::Fused,
            &mut out,
        );
    }
}
