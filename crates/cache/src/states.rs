//! The N typed states of a model: what a forward pass reads and mutates between calls.
//!
//! A model declares its states as data — a list of [`StateSpec`]s — instead of a fixed K/V pair:
//! - [`StateKind::Kv`]: the KV cache of an attention layer, growing or sliding (ring), with its
//!   own head count and head dimension (layers may differ: e.g. 256 on sliding layers, 512 on
//!   full ones);
//! - [`StateKind::SharedKv`]: a layer that reads another layer's cache (KV sharing: the
//!   producer writes, sharers only read; stored once);
//! - [`StateKind::Fixed`]: an f32 tensor of fixed shape (a convolution window, a recurrent
//!   state) that is never quantized and cannot be rewound — only reset.
//!
//! [`ModelCache`] holds them, runs [`ModelCache::forward_layer`] (the one entry point for
//! prefill, chunks and decode), rewinds, forks and reports memory.

use serde::{Deserialize, Serialize};

use crate::error::CacheError;
use crate::kv_cache::{KvCache, KvLayout};
use crate::stream::StreamLayout;

/// What kind of state, with its shape.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum StateKind {
    /// The KV cache of `layer`.
    Kv {
        /// The attention layer that writes it.
        layer: usize,
        /// Heads, dimension, growing or sliding.
        layout: KvLayout,
    },
    /// `layer` attends over the cache written by `source_layer`.
    SharedKv {
        /// The reading layer.
        layer: usize,
        /// The producer layer.
        source_layer: usize,
    },
    /// A fixed-shape f32 tensor (row-major).
    Fixed {
        /// Its shape, e.g. `[kernel − 1, channels]` or `[heads, d_k, d_v]`.
        shape: Vec<usize>,
    },
}

/// One declared state.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StateSpec {
    /// A name for reports and lookups (e.g. `layer3.kv`, `layer2.conv`).
    pub name: String,
    /// Kind and shape.
    pub kind: StateKind,
}

impl StateSpec {
    /// Whether a rewind may drop tokens from this state (fixed states summarize every token
    /// seen and cannot give one back).
    pub fn truncatable(&self) -> bool {
        !matches!(self.kind, StateKind::Fixed { .. })
    }

    /// The element type stored: `"f32"` for fixed states, `"codec"` for KV caches (per the
    /// allocation), nothing of its own for a sharer.
    pub fn dtype(&self) -> &'static str {
        match self.kind {
            StateKind::Kv { .. } => "codec",
            StateKind::SharedKv { .. } => "shared",
            StateKind::Fixed { .. } => "f32",
        }
    }
}

/// Attention layers the states declare: the highest layer index plus one.
pub fn layer_count(specs: &[StateSpec]) -> usize {
    specs
        .iter()
        .map(|s| match s.kind {
            StateKind::Kv { layer, .. } | StateKind::SharedKv { layer, .. } => layer + 1,
            StateKind::Fixed { .. } => 0,
        })
        .max()
        .unwrap_or(0)
}

/// The storage behind one state.
#[derive(Clone, Debug)]
enum StateStorage {
    Kv(Box<KvCache>),
    Shared { source: usize },
    Fixed { data: Vec<f32>, touched: bool },
}

/// Memory held by one state: by formula and as allocated.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StateMemory {
    /// The state's name.
    pub name: String,
    /// `kv`, `shared-kv` or `fixed`.
    pub kind: &'static str,
    /// Bytes per token slot of a KV state (0 for others).
    pub bytes_per_token: usize,
    /// Bytes by the layout formula.
    pub formula_bytes: usize,
    /// Bytes measured from the buffers.
    pub allocated_bytes: usize,
}

/// The states of one sequence.
#[derive(Clone, Debug)]
pub struct ModelCache {
    specs: Vec<StateSpec>,
    storage: Vec<StateStorage>,
    /// The heavy-hitter gathering buffer every layer's [`KvCache::forward`] borrows in turn
    /// ([`forward_layer`](Self::forward_layer)): one for the model instead of one per layer,
    /// each sized for the largest prefill chunk (3 MiB a layer on SmolLM2 at 8K tokens).
    pub(crate) received: crate::heavy_hitters::ReceivedWeights,
    /// `layer → index of the state it attends over` (producer or sharer resolved).
    layer_state: Vec<Option<usize>>,
}

impl ModelCache {
    /// Builds the states; `streams(layer, layout)` gives the key and value stream layouts of a
    /// KV state (this is where a bit allocation decides codecs per layer and head).
    pub fn new(
        specs: Vec<StateSpec>,
        mut streams: impl FnMut(
            usize,
            &KvLayout,
        ) -> Result<(Vec<StreamLayout>, Vec<StreamLayout>), CacheError>,
    ) -> Result<Self, CacheError> {
        let mut storage = Vec::with_capacity(specs.len());
        let mut producer_of_layer = std::collections::BTreeMap::new();
        for (i, spec) in specs.iter().enumerate() {
            if specs[..i].iter().any(|s| s.name == spec.name) {
                return Err(CacheError::InvalidConfig(format!(
                    "duplicate state name `{}`",
                    spec.name
                )));
            }
            storage.push(match &spec.kind {
                StateKind::Kv { layer, layout } => {
                    if producer_of_layer.insert(*layer, i).is_some() {
                        return Err(CacheError::InvalidConfig(format!(
                            "layer {layer} declares two KV states"
                        )));
                    }
                    let (keys, values) = streams(*layer, layout)?;
                    StateStorage::Kv(Box::new(KvCache::new(*layout, &keys, &values)?))
                }
                StateKind::SharedKv { .. } => StateStorage::Shared { source: usize::MAX },
                StateKind::Fixed { shape } => StateStorage::Fixed {
                    data: vec![0.0; shape.iter().product()],
                    touched: false,
                },
            });
        }
        let mut layer_state = vec![None; layer_count(&specs)];
        for (i, spec) in specs.iter().enumerate() {
            match spec.kind {
                StateKind::Kv { layer, .. } => layer_state[layer] = Some(i),
                StateKind::SharedKv {
                    layer,
                    source_layer,
                } => {
                    let source = *producer_of_layer.get(&source_layer).ok_or_else(|| {
                        CacheError::InvalidConfig(format!(
                            "state `{}` shares layer {source_layer}, which declares no KV state",
                            spec.name
                        ))
                    })?;
                    if layer_state[layer].is_some() {
                        return Err(CacheError::InvalidConfig(format!(
                            "layer {layer} declares two KV states"
                        )));
                    }
                    layer_state[layer] = Some(i);
                    storage[i] = StateStorage::Shared { source };
                }
                StateKind::Fixed { .. } => {}
            }
        }
        Ok(Self {
            specs,
            storage,
            received: Default::default(),
            layer_state,
        })
    }

    /// The declared states.
    pub fn specs(&self) -> &[StateSpec] {
        &self.specs
    }

    /// The KV state `layer` attends over: its index among the [`specs`](Self::specs), and
    /// whether the layer shares it (a KV-sharing layer's is its producer's state).
    ///
    /// Errors: a layer without a KV state ([`CacheError::InvalidConfig`]).
    pub fn kv_index(&self, layer: usize) -> Result<(usize, bool), CacheError> {
        let index = self
            .layer_state
            .get(layer)
            .copied()
            .flatten()
            .ok_or_else(|| CacheError::InvalidConfig(format!("layer {layer} has no KV state")))?;
        Ok(match self.storage[index] {
            StateStorage::Shared { source } => (source, true),
            _ => (index, false),
        })
    }

    /// Whether some KV state keeps heavy hitters ([`crate::heavy_hitters`]): then what the
    /// cache holds depends on where prefill chunks end, and a rewind keeps the decisions made.
    pub fn keeps_heavy_hitters(&self) -> bool {
        self.storage.iter().any(|s| match s {
            StateStorage::Kv(cache) => cache.keeps_heavy_hitters(),
            _ => false,
        })
    }

    /// The KV cache `layer` attends over (its own, or its producer's).
    pub fn kv(&self, layer: usize) -> Result<&KvCache, CacheError> {
        let (index, _) = self.kv_index(layer)?;
        match &self.storage[index] {
            StateStorage::Kv(cache) => Ok(cache),
            _ => Err(CacheError::InvalidConfig(format!(
                "layer {layer} has no KV state"
            ))),
        }
    }

    /// Appends `keys` and `values` (`[n, kv_heads, head_dim]` each) of `n` new tokens at
    /// `positions` to `layer`'s own KV state, without attending — for callers that attend
    /// separately (or never). A layer that shares its producer's cache has nothing of its own
    /// to append to: an error naming the producer's role.
    pub fn append_layer(
        &mut self,
        layer: usize,
        keys: &[f32],
        values: &[f32],
        positions: &[u32],
    ) -> Result<(), CacheError> {
        let (index, shared) = self.kv_index(layer)?;
        if shared {
            return Err(CacheError::InvalidConfig(format!(
                "layer {layer} reads another layer's cache: append to that (producer) layer"
            )));
        }
        let cache = self
            .kv_at_mut(index)
            .ok_or_else(|| CacheError::InvalidConfig(format!("layer {layer} has no KV state")))?;
        cache.append(keys, values, positions)
    }

    /// The KV cache stored at state `index` (a [`kv_index`](Self::kv_index) result).
    pub(crate) fn kv_at_mut(&mut self, index: usize) -> Option<&mut KvCache> {
        match &mut self.storage[index] {
            StateStorage::Kv(cache) => Some(cache),
            _ => None,
        }
    }

    /// The name of the state `layer` declares (its own, for a sharer), for error messages.
    pub(crate) fn state_name_of_layer(&self, layer: usize, fallback: usize) -> String {
        self.specs[self.layer_state[layer].unwrap_or(fallback)]
            .name
            .clone()
    }

    /// A fixed state's data.
    pub fn fixed(&self, name: &str) -> Result<&[f32], CacheError> {
        match self.find(name)? {
            (_, StateStorage::Fixed { data, .. }) => Ok(data),
            _ => Err(CacheError::Unsupported {
                state: name.to_string(),
                reason: "not a fixed state",
            }),
        }
    }

    /// A fixed state's data, for the layer to update in place.
    pub fn fixed_mut(&mut self, name: &str) -> Result<&mut [f32], CacheError> {
        let index = self.find(name)?.0;
        match &mut self.storage[index] {
            StateStorage::Fixed { data, touched } => {
                *touched = true;
                Ok(data)
            }
            _ => Err(CacheError::Unsupported {
                state: name.to_string(),
                reason: "not a fixed state",
            }),
        }
    }

    fn find(&self, name: &str) -> Result<(usize, &StateStorage), CacheError> {
        self.specs
            .iter()
            .position(|s| s.name == name)
            .map(|i| (i, &self.storage[i]))
            .ok_or_else(|| CacheError::InvalidConfig(format!("no state named `{name}`")))
    }

    /// Tokens seen (the longest KV state).
    pub fn len(&self) -> usize {
        self.storage
            .iter()
            .filter_map(|s| match s {
                StateStorage::Kv(c) => Some(c.len()),
                _ => None,
            })
            .max()
            .unwrap_or(0)
    }

    /// Whether no token was seen.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Rewinds every KV state to `new_len` tokens. Refused — with nothing changed — if a fixed
    /// state has absorbed tokens (a recurrent state cannot give one back: reset and re-run the
    /// prefix instead) or if a KV state cannot rewind that far exactly.
    pub fn truncate(&mut self, new_len: usize) -> Result<(), CacheError> {
        if new_len >= self.len() {
            return Ok(());
        }
        for (spec, storage) in self.specs.iter().zip(&self.storage) {
            if let StateStorage::Fixed { touched: true, .. } = storage {
                return Err(CacheError::Unsupported {
                    state: spec.name.clone(),
                    reason: "fixed (conv/recurrent) states cannot be rewound; reset the cache and re-run the prefix",
                });
            }
        }
        // Check every cache first so a refusal leaves all of them untouched.
        let mut trial = self.clone();
        for storage in &mut trial.storage {
            if let StateStorage::Kv(cache) = storage {
                cache.truncate(new_len)?;
            }
        }
        *self = trial;
        Ok(())
    }

    /// Empties every state (KV caches to zero tokens, fixed states to zeros).
    pub fn reset(&mut self) {
        for storage in &mut self.storage {
            match storage {
                StateStorage::Kv(cache) => cache.clear(),
                StateStorage::Fixed { data, touched } => {
                    data.fill(0.0);
                    *touched = false;
                }
                StateStorage::Shared { .. } => {}
            }
        }
    }

    /// An independent copy sharing nothing (fork a cache to reuse a prompt prefix).
    pub fn fork(&self) -> Self {
        self.clone()
    }

    /// Memory per state, by formula and as allocated.
    pub fn memory(&self) -> Vec<StateMemory> {
        self.specs
            .iter()
            .zip(&self.storage)
            .map(|(spec, storage)| match storage {
                StateStorage::Kv(c) => StateMemory {
                    name: spec.name.clone(),
                    kind: "kv",
                    bytes_per_token: c.bytes_per_token(),
                    formula_bytes: c.formula_bytes(),
                    allocated_bytes: c.allocated_bytes(),
                },
                StateStorage::Shared { .. } => StateMemory {
                    name: spec.name.clone(),
                    kind: "shared-kv",
                    bytes_per_token: 0,
                    formula_bytes: 0,
                    allocated_bytes: 0,
                },
                StateStorage::Fixed { data, .. } => StateMemory {
                    name: spec.name.clone(),
                    kind: "fixed",
                    bytes_per_token: 0,
                    formula_bytes: 4 * data.len(),
                    allocated_bytes: 4 * data.capacity(),
                },
            })
            .collect()
    }

    /// The stream layouts of every KV state, in state order (`None` for other kinds).
    pub(crate) fn kv_stream_layouts(&self) -> Vec<Option<(Vec<StreamLayout>, Vec<StreamLayout>)>> {
        self.storage
            .iter()
            .map(|s| match s {
                StateStorage::Kv(c) => Some(c.stream_layouts()),
                _ => None,
            })
            .collect()
    }

    /// Appends every state's contents to a saved-cache body.
    pub(crate) fn write_to(&self, out: &mut crate::persist::ByteWriter) {
        for storage in &self.storage {
            match storage {
                StateStorage::Kv(c) => c.write_to(out),
                StateStorage::Shared { .. } => {}
                StateStorage::Fixed { data, touched } => {
                    out.u64(u64::from(*touched));
                    out.u64(data.len() as u64);
                    for v in data {
                        out.u32(v.to_bits());
                    }
                }
            }
        }
    }

    /// Restores what [`write_to`](Self::write_to) wrote into freshly built, empty states.
    pub(crate) fn read_from(
        &mut self,
        input: &mut crate::persist::ByteReader<'_>,
    ) -> Result<(), crate::persist::PersistError> {
        for storage in &mut self.storage {
            match storage {
                StateStorage::Kv(c) => c.read_from(input)?,
                StateStorage::Shared { .. } => {}
                StateStorage::Fixed { data, touched } => {
                    *touched = input.u64()? != 0;
                    if input.usize()? != data.len() {
                        return Err(crate::persist::PersistError::Inconsistent(
                            "fixed state size",
                        ));
                    }
                    for v in data.iter_mut() {
                        *v = f32::from_bits(input.u32()?);
                    }
                }
            }
        }
        Ok(())
    }
}
