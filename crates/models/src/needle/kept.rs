//! What a cache with heavy hitters ([`tq_cache::heavy_hitters`]) kept by the end of a cell:
//! the share of its decided tokens, and per layer the share of the needle's own tokens.

use tq_cache::states::ModelCache;

/// Heavy hitters kept by a cache at the end of a needle cell.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct KeptTokens {
    /// Kept tokens over the tokens decided (those that left the windows, sinks aside), over
    /// every stream of every layer that keeps heavy hitters.
    pub share: f64,
    /// Per layer, the share of the needle's tokens its key streams kept (mean over KV heads;
    /// 0 for a layer that keeps none).
    pub needle: Vec<f64>,
}

impl KeptTokens {
    /// The kept tokens of `cache` (`layers` layers; `None` when no stream keeps heavy
    /// hitters), the needle at tokens `needle`.
    pub fn of(cache: &ModelCache, layers: usize, needle: std::ops::Range<usize>) -> Option<Self> {
        let (mut kept, mut decided, mut any) = (0usize, 0usize, false);
        let mut per_layer = Vec::with_capacity(layers);
        for layer in 0..layers {
            let Ok(kv) = cache.kv(layer) else {
                per_layer.push(0.0);
                continue;
            };
            let heads = kv.layout().kv_heads;
            let mut needle_kept = 0usize;
            for g in 0..heads {
                for (stream, is_key) in [(kv.keys(g), true), (kv.values(g), false)] {
                    let Some(heavy) = stream.heavy_hitters() else {
                        continue;
                    };
                    any = true;
                    let tokens = heavy.kept();
                    kept += tokens.len();
                    decided += stream.recent_start().saturating_sub(stream.sink_end());
                    if is_key {
                        needle_kept += tokens
                            .iter()
                            .filter(|&&t| needle.contains(&(t as usize)))
                            .count();
                    }
                }
            }
            per_layer.push(needle_kept as f64 / (needle.len() * heads).max(1) as f64);
        }
        any.then(|| Self {
            share: kept as f64 / decided.max(1) as f64,
            needle: per_layer,
        })
    }
}
