//! The KV cache of one attention layer: one key stream and one value stream per KV head, and
//! the position of every stored token.
//!
//! One entry point serves prefill, chunked prefill and decode ([`KvCache::forward`]): the caller
//! passes the full `positions` of the sequence so far and the queries, keys and values of the
//! newest `query_len` tokens; `offset = positions.len − query_len` must equal the number of
//! tokens already cached. Masks are derived from positions: a query at position `p` sees the
//! cached tokens at positions `≤ p` (causal) and, on a sliding layer of window `W`, `> p − W`.
//!
//! Sliding layers write into rings of `W + max_rewind` slots (`pos % slots`). As in the
//! stateful-decode design, tokens are written before the chunk attends, so one-token decode and
//! a prefill from position 0 in chunks ≤ W are exact; a later chunk that wraps the ring
//! overwrites the oldest in-window keys of its own non-final tokens (the final token stays
//! exact). Keep prefill chunks ≤ W − (chunk overlap) or feed long prompts token by token where
//! this matters; `tests/kv_semantics.rs` demonstrates the caveat.

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::codec::CodecScratch;
use crate::error::CacheError;
use crate::heavy_hitters::{HeavyHitters, ReceivedWeights};
use crate::stream::{Stream, StreamLayout};
use crate::token_codec::CodecSpec;
use crate::token_store::{Growth, TokenStore};

/// Growing or sliding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum KvKind {
    /// Keeps every token.
    Growing {
        /// How memory is obtained.
        growth: Growth,
    },
    /// Keeps the last `window` tokens in a ring.
    Sliding {
        /// Attention window W.
        window: usize,
    },
}

/// Shape and policy of a layer's cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvLayout {
    /// KV heads.
    pub kv_heads: usize,
    /// Head dimension.
    pub head_dim: usize,
    /// Growing or sliding.
    pub kind: KvKind,
    /// Tokens a rewind may drop exactly (extra ring slots / full-precision copies are kept).
    pub max_rewind: usize,
    /// Which key coordinates the model's RoPE turns together (read only by the plane basis,
    /// [`BasisPolicy::Planes`](crate::basis::BasisPolicy::Planes); files saved before it
    /// existed load as [`RopePairs::Adjacent`](crate::basis::RopePairs::Adjacent)).
    #[serde(default)]
    pub rope_pairs: crate::basis::RopePairs,
    /// The model's RoPE base (read only by RoPE-aware key centering, `center = "rope"`, which
    /// a layout without one refuses; files saved before it existed load as
    /// [`RopeBase::UNKNOWN`](crate::rope_center::RopeBase::UNKNOWN)).
    #[serde(default)]
    pub rope_base: crate::rope_center::RopeBase,
}

impl KvLayout {
    /// The ring size of a sliding layer.
    pub fn ring_slots(&self) -> Option<usize> {
        match self.kind {
            KvKind::Sliding { window } => Some(window + self.max_rewind),
            KvKind::Growing { .. } => None,
        }
    }

    /// The attention window, if any.
    pub fn window(&self) -> Option<usize> {
        match self.kind {
            KvKind::Sliding { window } => Some(window),
            KvKind::Growing { .. } => None,
        }
    }
}

/// The cached keys and values of one layer.
#[derive(Clone, Debug)]
pub struct KvCache {
    layout: KvLayout,
    keys: Vec<Stream>,
    values: Vec<Stream>,
    /// Position of each token, paged like the bodies (by token, or by ring slot).
    positions: TokenStore,
    len: usize,
    /// Encoder scratch per KV head, one for its keys and one for its values (a two-tier
    /// codec sizes its scratch to its split, which differs between the two), kept between calls
    /// so appending a token allocates nothing (working memory, not counted in the cache's
    /// bytes).
    scratch: Vec<[CodecScratch; 2]>,
    /// The attention weights a step's queries gave their window tokens, for the heavy-hitter
    /// counts (working memory of [`forward`](Self::forward), kept so a decode step allocates
    /// nothing; not counted, not saved).
    pub(crate) received: ReceivedWeights,
}

/// Stream layouts with the same codec on every head, no full-precision extras and no centering.
pub fn uniform_streams(layout: &KvLayout, codec: CodecSpec) -> Vec<StreamLayout> {
    let growth = match layout.kind {
        KvKind::Growing { growth } => growth,
        KvKind::Sliding { .. } => Growth::Static { capacity: 0 },
    };
    (0..layout.kv_heads)
        .map(|_| StreamLayout {
            codec,
            outliers: None,
            channels: None,
            center: crate::center::CenterPolicy::None,
            mean: None,
            basis: crate::basis::BasisPolicy::None,
            basis_fit: None,
            basis_bits: crate::basis::GroupWidths::ALL,
            rope_pairs: layout.rope_pairs,
            rope_base: layout.rope_base,
            fp: CodecSpec::F16 {
                dim: layout.head_dim,
            },
            recent: None,
            sink_tokens: 0,
            recent_tokens: 0,
            recent_fraction: None,
            max_rewind: layout.max_rewind,
            growth,
            ring_slots: layout.ring_slots(),
            order: crate::record_order::RecordOrder::Rows,
            heavy_hitters: None,
        })
        .collect()
}

impl KvCache {
    /// A cache whose key and value streams follow the given per-head layouts.
    pub fn new(
        layout: KvLayout,
        key_streams: &[StreamLayout],
        value_streams: &[StreamLayout],
    ) -> Result<Self, CacheError> {
        if key_streams.len() != layout.kv_heads || value_streams.len() != layout.kv_heads {
            return Err(CacheError::InvalidConfig(format!(
                "{} KV heads need {} key and value stream layouts, got {} and {}",
                layout.kv_heads,
                layout.kv_heads,
                key_streams.len(),
                value_streams.len()
            )));
        }
        if let KvKind::Sliding { window: 0 } = layout.kind {
            return Err(CacheError::InvalidConfig(
                "a sliding window must hold at least one token".into(),
            ));
        }
        let build = |streams: &[StreamLayout]| -> Result<Vec<Stream>, CacheError> {
            streams
                .iter()
                .map(|s| {
                    if s.head_dim() != layout.head_dim {
                        return Err(CacheError::InvalidConfig(format!(
                            "stream codec dimension {} differs from head dimension {}",
                            s.head_dim(),
                            layout.head_dim
                        )));
                    }
                    let mut s = s.clone();
                    s.ring_slots = layout.ring_slots();
                    s.max_rewind = layout.max_rewind;
                    Stream::new(&s)
                })
                .collect()
        };
        let growth = match (layout.kind, layout.ring_slots()) {
            (_, Some(slots)) => Growth::Static { capacity: slots },
            (KvKind::Growing { growth }, None) => growth,
            (KvKind::Sliding { .. }, None) => unreachable!("sliding layouts have ring slots"),
        };
        let positions = TokenStore::new(1, 0, growth)?;
        Ok(Self {
            keys: build(key_streams)?,
            values: build(value_streams)?,
            scratch: (0..layout.kv_heads)
                .map(|_| std::array::from_fn(|_| CodecScratch::new(layout.head_dim)))
                .collect(),
            layout,
            positions,
            len: 0,
            received: ReceivedWeights::default(),
        })
    }

    /// Whether a stream keeps heavy hitters ([`heavy_hitters`](crate::heavy_hitters)): then
    /// [`forward`](Self::forward) gathers the attention each query gives its window tokens.
    pub fn keeps_heavy_hitters(&self) -> bool {
        self.keys
            .iter()
            .chain(&self.values)
            .any(|s| s.heavy_hitters().is_some())
    }

    /// Bytes of the kept heavy-hitter copies of every stream, by formula (what the cache
    /// holds beyond [`formula_bytes`](Self::formula_bytes)' per-token and fixed bytes).
    pub fn kept_bytes(&self) -> usize {
        self.keys
            .iter()
            .chain(&self.values)
            .map(Stream::kept_bytes)
            .sum()
    }

    /// Adds `received` (what one attention call's queries gave their window tokens, items
    /// in query order) to both streams of each KV head, then decides the tokens the next
    /// query no longer reads in its window.
    pub(crate) fn add_received(&mut self, received: &ReceivedWeights) -> Result<(), CacheError> {
        let kv_heads = self.layout.kv_heads;
        for k in 0..received.items.len() {
            let (row, weights) = received.item(k);
            let g = k % kv_heads;
            self.keys[g].add_received(row, weights);
            self.values[g].add_received(row, weights);
        }
        for stream in self.keys.iter_mut().chain(self.values.iter_mut()) {
            stream.settle_kept()?;
        }
        Ok(())
    }

    /// A cache with one codec for all keys and one for all values.
    ///
    /// ```
    /// use tq_cache::kv_cache::{KvCache, KvKind, KvLayout};
    /// use tq_cache::token_store::Growth;
    /// use tq_cache::CodecSpec;
    /// let layout = KvLayout {
    ///     kv_heads: 2,
    ///     head_dim: 8,
    ///     kind: KvKind::Growing { growth: Growth::Doubling { initial: 16 } },
    ///     max_rewind: 0,
    ///     rope_pairs: tq_cache::basis::RopePairs::Adjacent,
    ///     rope_base: Default::default(),
    /// };
    /// let f32 = CodecSpec::F32 { dim: 8 };
    /// let mut cache = KvCache::uniform(layout, f32, f32).unwrap();
    /// let k = vec![0.5f32; 2 * 8];
    /// cache.append(&k, &k, &[0]).unwrap();
    /// assert_eq!(cache.len(), 1);
    /// ```
    pub fn uniform(layout: KvLayout, key: CodecSpec, value: CodecSpec) -> Result<Self, CacheError> {
        Self::new(
            layout,
            &uniform_streams(&layout, key),
            &uniform_streams(&layout, value),
        )
    }

    /// The layout.
    pub fn layout(&self) -> &KvLayout {
        &self.layout
    }

    /// Tokens appended (on a sliding layer, including those the ring dropped).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing was appended.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Key stream of KV head `h`.
    pub fn keys(&self, h: usize) -> &Stream {
        &self.keys[h]
    }

    /// Value stream of KV head `h`.
    pub fn values(&self, h: usize) -> &Stream {
        &self.values[h]
    }

    /// Position of token `t` (if still stored).
    pub fn position(&self, t: usize) -> Option<u32> {
        if t >= self.len || t < self.first_stored() {
            return None;
        }
        let index = self.layout.ring_slots().map_or(t, |slots| t % slots);
        self.positions.record(index).map(|(words, _)| words[0])
    }

    /// The oldest token still stored.
    pub fn first_stored(&self) -> usize {
        self.keys.first().map_or(0, Stream::first_stored)
    }

    /// The stored tokens a query at position `p` attends to, as a token range.
    pub fn visible(&self, p: u32) -> std::ops::Range<usize> {
        let lo_bound = self
            .layout
            .window()
            .map(|w| p.saturating_add(1).saturating_sub(w as u32));
        let (mut lo, mut hi) = (self.first_stored(), self.len);
        // Positions increase with the token index, so both ends are found by bisection.
        let pos = |t: usize| self.position(t).unwrap_or(u32::MAX);
        let (mut a, mut b) = (lo, hi);
        while a < b {
            let m = (a + b) / 2;
            if pos(m) <= p { a = m + 1 } else { b = m }
        }
        hi = a;
        if let Some(bound) = lo_bound {
            let (mut a, mut b) = (lo, hi);
            while a < b {
                let m = (a + b) / 2;
                if pos(m) < bound { a = m + 1 } else { b = m }
            }
            lo = a;
        }
        lo..hi
    }

    /// Bytes held by every stream and the position table, measured from the buffers.
    pub fn allocated_bytes(&self) -> usize {
        self.keys
            .iter()
            .chain(&self.values)
            .map(Stream::allocated_bytes)
            .sum::<usize>()
            + self.positions.allocated_bytes()
    }

    /// Bytes the cache allocates, from the layout formula: every allocated token slot costs
    /// [`bytes_per_token`](Self::bytes_per_token) (a stream with an 8-bit window has `W` code
    /// slots fewer: its window's tokens have no codes; a fast-scan body rounds its record
    /// memory up to whole blocks of 32, [`TokenStore::record_slots`]), plus what is stored once
    /// ([`fixed_bytes`](Self::fixed_bytes): full-precision copies, means of centered streams),
    /// plus the heavy hitters' kept copies at their store's capacity, their indices and the
    /// counts of the tokens not yet decided ([`HeavyHitters::formula_bytes`]). Tests check it
    /// equals [`allocated_bytes`](Self::allocated_bytes).
    pub fn formula_bytes(&self) -> usize {
        // Each stream's body at its own capacity: an 8-bit window's stream holds `W` codes
        // fewer than the position table (see `Stream::body_tokens`).
        4 * self.positions.capacity()
            + self
                .keys
                .iter()
                .chain(&self.values)
                .map(|s| {
                    let body = s.body();
                    let block_slack = body.record_slots() - body.capacity();
                    body.capacity() * s.codec().bytes_per_token()
                        + block_slack * 4 * body.record_words()
                        + s.heavy_hitters().map_or(0, HeavyHitters::formula_bytes)
                })
                .sum::<usize>()
            + self.fixed_bytes()
    }

    /// Bytes per token slot: the 4-byte position plus every head's key and value record and
    /// scales (codes, norms, QJL signs and `γ`).
    pub fn bytes_per_token(&self) -> usize {
        4 + self.body_bytes_per_token()
    }

    /// Bytes stored once rather than per token: the full-precision sink and recent copies and
    /// the means of centered streams (`4·head_dim` each, once chosen); see
    /// [`Stream::fixed_bytes`].
    pub fn fixed_bytes(&self) -> usize {
        self.keys
            .iter()
            .chain(&self.values)
            .map(Stream::fixed_bytes)
            .sum()
    }

    /// Bytes one token costs in the compressed body of every head (keys and values), from the
    /// codecs' layout formula; full-precision sinks and recent copies are extra (see
    /// [`StreamLayout`]).
    pub fn body_bytes_per_token(&self) -> usize {
        self.keys
            .iter()
            .chain(&self.values)
            .map(|s| s.codec().bytes_per_token())
            .sum()
    }

    /// Appends the keys and values `[n, kv_heads, head_dim]` of tokens at `positions` (n of them).
    ///
    /// A stream with a plane basis ([`BasisPolicy::Planes`](crate::basis::BasisPolicy::Planes))
    /// that calibrates on this batch stays on the plain codec: the fit needs the batch's
    /// queries ([`append_with_queries`](Self::append_with_queries), which the write-then-attend
    /// entry point [`forward`](Self::forward) uses).
    pub fn append(
        &mut self,
        keys: &[f32],
        values: &[f32],
        positions: &[u32],
    ) -> Result<(), CacheError> {
        self.append_calibrated(keys, values, positions, None)
    }

    /// [`append`](Self::append), with the queries `[n_q, q_heads·head_dim]` (`q_heads` a
    /// multiple of the KV heads) this batch is attended with, so that a plane-basis stream
    /// calibrating on it weighs each plane by the energy of the queries that will read it
    /// ([`fit_planes`](crate::basis::fit_planes)). The queries are read only then (an empty
    /// cache with a plane-basis stream); otherwise this is `append`.
    pub fn append_with_queries(
        &mut self,
        keys: &[f32],
        values: &[f32],
        positions: &[u32],
        queries: &[f32],
        q_heads: usize,
    ) -> Result<(), CacheError> {
        if !self.keys.iter().any(Stream::needs_query_energy) {
            return self.append_calibrated(keys, values, positions, None);
        }
        let energy = query_energy(queries, q_heads, self.layout.kv_heads, self.layout.head_dim)?;
        self.append_calibrated(keys, values, positions, Some(&energy))
    }

    fn append_calibrated(
        &mut self,
        keys: &[f32],
        values: &[f32],
        positions: &[u32],
        query_energy: Option<&[Vec<f64>]>,
    ) -> Result<(), CacheError> {
        let n = positions.len();
        let width = self.layout.kv_heads * self.layout.head_dim;
        for (what, t) in [("keys", keys), ("values", values)] {
            if t.len() != n * width {
                return Err(CacheError::ShapeMismatch {
                    what,
                    expected: n * width,
                    actual: t.len(),
                });
            }
        }
        let last = self.len.checked_sub(1).and_then(|t| self.position(t));
        if last == Some(u32::MAX) && n > 0 {
            return Err(CacheError::PositionGap {
                expected: u32::MAX,
                got: positions[0],
            });
        }
        let mut expected = last.and_then(|p| p.checked_add(1));
        for (i, &p) in positions.iter().enumerate() {
            if let Some(e) = expected
                && p < e
            {
                return Err(CacheError::PositionGap {
                    expected: e,
                    got: p,
                });
            }
            expected = p.checked_add(1);
            if expected.is_none() && i + 1 < n {
                // Nothing comes after the last representable position.
                return Err(CacheError::PositionGap {
                    expected: u32::MAX,
                    got: positions[i + 1],
                });
            }
        }
        let start = self.len;
        let dim = self.layout.head_dim;
        let heads = self.layout.kv_heads;
        for stream in self.keys.iter_mut().chain(self.values.iter_mut()) {
            stream.begin_step();
        }
        // Heads are independent: encode them in parallel; each vector's code depends only on the
        // vector, so the result does not depend on the thread count. (`try_for_each` rather than
        // collecting per-head results: nothing is allocated per call.)
        let result = self
            .keys
            .par_iter_mut()
            .zip(self.values.par_iter_mut())
            .zip(self.scratch.par_iter_mut())
            .enumerate()
            .try_for_each(|(h, ((ks, vs), [key_scratch, value_scratch]))| {
                for (stream, data, is_key) in [(&mut *ks, keys, true), (&mut *vs, values, false)] {
                    if stream.needs_calibration() {
                        let head = head_rows(data, heads, dim, h);
                        // Queries score keys only (the allocation refuses planes on values).
                        let query = query_energy
                            .filter(|_| is_key)
                            .and_then(|e| e.get(h))
                            .map(Vec::as_slice);
                        stream.calibrate(&head, query)?;
                    }
                }
                for i in 0..n {
                    let off = (i * heads + h) * dim;
                    ks.push(&keys[off..off + dim], key_scratch)?;
                    vs.push(&values[off..off + dim], value_scratch)?;
                }
                Ok::<(), CacheError>(())
            });
        if let Err(error) = result {
            // Leave the cache as it was: drop whatever part of the batch went in.
            for s in self.keys.iter_mut().chain(self.values.iter_mut()) {
                s.truncate(start);
            }
            return Err(error);
        }
        for &p in positions {
            let slot = match self.layout.ring_slots() {
                Some(slots) if self.positions.len() == slots => {
                    self.positions.record_mut(self.len % slots)?
                }
                _ => self.positions.push()?,
            };
            slot.0[0] = p;
            self.len += 1;
        }
        Ok(())
    }

    /// Forgets every token, keeping the allocations (a reset, always exact: two-tier outlier
    /// channels and the means of centered streams are chosen again from the next first batch,
    /// as in a fresh cache).
    pub fn clear(&mut self) {
        for s in self.keys.iter_mut().chain(self.values.iter_mut()) {
            s.clear();
        }
        self.positions.truncate(0);
        self.len = 0;
    }

    /// Drops every token from `new_len` on (speculative decoding, edited prompts).
    ///
    /// Exact — the cache equals one that never saw the dropped tokens — within the limits the
    /// layout keeps: a ring must still hold every token the *next* query's window reaches (from
    /// token `new_len + 1 − window` on; with no earlier rewind a ring of `window + max_rewind`
    /// slots allows dropping `max_rewind + 1` tokens), and the full-precision recent copies of
    /// the tokens that become recent must still exist; otherwise [`CacheError::RewindTooFar`]
    /// and nothing changes (a wrapped ring refuses even a rewind to zero: use
    /// [`clear`](Self::clear)). A rewind keeps what streams calibrated on their first batch
    /// (means, outlier channels, bases: the remaining tokens were stored with them), except a
    /// rewind to zero tokens, which forgets them like [`clear`](Self::clear).
    pub fn truncate(&mut self, new_len: usize) -> Result<(), CacheError> {
        if new_len >= self.len {
            return Ok(());
        }
        for s in self.keys.iter().chain(&self.values) {
            s.check_rewind(new_len, self.layout.window())?;
        }
        for s in self.keys.iter_mut().chain(self.values.iter_mut()) {
            s.truncate(new_len);
        }
        if self
            .layout
            .ring_slots()
            .is_none_or(|slots| self.positions.len() < slots)
        {
            self.positions.truncate(new_len);
        }
        // (A wrapped ring keeps all its slots; the stale ones are past `len` and never read.)
        self.len = new_len;
        Ok(())
    }

    /// The key and value stream layouts (what a saved cache records to rebuild the codecs).
    pub fn stream_layouts(&self) -> (Vec<StreamLayout>, Vec<StreamLayout>) {
        (
            self.keys.iter().map(|s| s.layout().clone()).collect(),
            self.values.iter().map(|s| s.layout().clone()).collect(),
        )
    }

    /// Appends the cache's contents to a saved-cache body.
    pub(crate) fn write_to(&self, out: &mut crate::persist::ByteWriter) {
        out.u64(self.len as u64);
        out.store(&self.positions);
        for s in self.keys.iter().chain(&self.values) {
            s.write_to(out);
        }
    }

    /// Restores what [`write_to`](Self::write_to) wrote into a freshly built, empty cache.
    pub(crate) fn read_from(
        &mut self,
        input: &mut crate::persist::ByteReader<'_>,
    ) -> Result<(), crate::persist::PersistError> {
        self.len = input.usize()?;
        input.store(&mut self.positions)?;
        for s in self.keys.iter_mut().chain(self.values.iter_mut()) {
            s.read_from(input)?;
            if s.len() != self.len {
                return Err(crate::persist::PersistError::Inconsistent(
                    "stream and cache lengths disagree",
                ));
            }
        }
        let expected = self
            .layout
            .ring_slots()
            .map_or(self.len, |slots| self.len.min(slots));
        if self.positions.len() != expected
            && self.layout.ring_slots() != Some(self.positions.len())
        {
            return Err(crate::persist::PersistError::Inconsistent(
                "position table length",
            ));
        }
        // Appends only ever store increasing positions; a table that does not is damage the
        // CRC missed or a file written by hand, and its masks would be wrong.
        let mut previous = None;
        for t in self.first_stored()..self.len {
            let position = self.position(t);
            if position.is_none() || position <= previous {
                return Err(crate::persist::PersistError::Inconsistent(
                    "stored positions do not increase",
                ));
            }
            previous = position;
        }
        Ok(())
    }
}

/// The rows of KV head `h` in `data` (`[n, kv_heads, head_dim]`): `[n, head_dim]`, the batch a
/// stream of that head calibrates on.
pub fn head_rows(data: &[f32], kv_heads: usize, head_dim: usize, h: usize) -> Vec<f32> {
    data.chunks_exact(head_dim)
        .skip(h)
        .step_by(kv_heads.max(1))
        .flatten()
        .copied()
        .collect()
}

/// The energy a plane basis is fitted with ([`fit_planes`](crate::basis::fit_planes)): per KV
/// head, the mean square of each query coordinate over the rows of `queries`
/// (`[n_q, q_heads·head_dim]`) and the KV head's query heads, summed in a fixed order (the fit,
/// and so the codes, must not depend on the thread count).
///
/// Errors: `q_heads` zero or not a multiple of `kv_heads`, or `queries` not whole rows.
pub fn query_energy(
    queries: &[f32],
    q_heads: usize,
    kv_heads: usize,
    head_dim: usize,
) -> Result<Vec<Vec<f64>>, CacheError> {
    let width = q_heads * head_dim;
    if q_heads == 0 || !q_heads.is_multiple_of(kv_heads) || !queries.len().is_multiple_of(width) {
        return Err(CacheError::ShapeMismatch {
            what: "queries of a plane-basis fit",
            expected: queries.len().next_multiple_of(width.max(1)),
            actual: queries.len(),
        });
    }
    let group = q_heads / kv_heads;
    let rows = queries.len() / width;
    let mut energy = vec![vec![0.0f64; head_dim]; kv_heads];
    for row in queries.chunks_exact(width) {
        for (q_head, head) in row.chunks_exact(head_dim).enumerate() {
            for (e, &v) in energy[q_head / group].iter_mut().zip(head) {
                *e += f64::from(v) * f64::from(v);
            }
        }
    }
    let count = (rows * group).max(1) as f64;
    for e in energy.iter_mut().flatten() {
        *e /= count;
    }
    Ok(energy)
}
