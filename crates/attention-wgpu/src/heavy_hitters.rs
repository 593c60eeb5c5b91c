//! Heavy hitters on the GPU ([`tq_cache::heavy_hitters`]): tokens that drew much attention in
//! a stream's recent window keep their window copy on the device after they leave it, and the
//! kernels read it there instead of their codes.
//!
//! The decisions follow the CPU stream's rule with the CPU's tally
//! ([`KeepTally`], kept on the host): in a [`forward`](GpuKvCache::forward) call the attention
//! kernel writes the score of every token a query row reads in a window (from the earlier of
//! its key and value window starts, sinks aside), the finish kernel turns them into softmax
//! weights with the row's final max and sum, and they come back with the output; the host adds,
//! per stream, the mean over the KV head's query heads and the uniform share `1/|visible|` of
//! each row to the tokens of that stream's window (`Stream::add_received`). Tokens are settled
//! where the CPU cache settles them — before a batch's copies enter the ring (its
//! `begin_step`) and after a forward call's attention — and a kept token's copy moves on the
//! device, from the ring to the kept store. A forward call runs in chunks of 64 tokens (the
//! ring holds a window, the rewind margin and one chunk), so the tokens its later chunks push
//! out are decided between chunks, while the ring still holds their copies — stored then, but
//! read by the kernels only from the next call on (the counts the kernels see, `published`),
//! as the CPU cache's batch reads them from their codes. So a GPU cache given the same vectors and queries
//! keeps the same tokens as the CPU cache, up to the f32 rounding of the weights (a token
//! within rounding of the threshold may go either way).
//!
//! An append without queries ([`encode_and_append`](GpuKvCache::encode_and_append)) decides
//! the tokens it pushes out of a window before their copies are overwritten, with the counts
//! they have (the CPU cache decides them at its next step with the same counts). A CPU cache's
//! decisions, tallies and kept copies come over with [`upload_all`](GpuKvCache::upload_all) and
//! [`sync_from`](GpuKvCache::sync_from). KV-sharing layers read the kept copies of their
//! producer and add nothing (as on the CPU).
//!
//! The kept store (`u32` words; `lists = 2·kv_heads`, list `stream·kv_heads + head`, stream 0
//! the keys and 1 the values; `C` entries per list): `[lists]` counts, `[lists, C]` kept tokens
//! ascending, `[lists, C, ring_words]` their copies in the ring's format. It doubles `C` when a
//! list fills.

use std::ops::Range;
use std::sync::Arc;

use tq_cache::heavy_hitters::KeepTally;
use tq_cache::kv_cache::KvCache;

use crate::cache::GpuKvCache;
use crate::context::GpuContext;
use crate::error::GpuError;

/// Entries per list of a new kept store.
const FIRST_CAPACITY: usize = 16;

/// Where things are in a kept store.
#[derive(Clone, Copy, Debug)]
struct StoreLayout {
    lists: usize,
    /// Entries per list.
    capacity: usize,
    /// Words of one copy (the ring's).
    ring_words: usize,
}

impl StoreLayout {
    fn words(&self) -> usize {
        self.lists * (1 + self.capacity * (1 + self.ring_words))
    }

    /// Word of entry `e`'s token in list `list`.
    fn token_word(&self, list: usize, e: usize) -> usize {
        self.lists + list * self.capacity + e
    }

    /// Word where entry `e`'s copy in list `list` starts.
    fn copy_word(&self, list: usize, e: usize) -> usize {
        self.lists + self.lists * self.capacity + (list * self.capacity + e) * self.ring_words
    }
}

/// The kept copies of every stream of a layer on the device, their tokens and the tallies that
/// decide the next ones on the host.
pub(crate) struct KeptStore {
    /// Per list: the stream's tally (`None`: the stream keeps no heavy hitters).
    tallies: Vec<Option<KeepTally>>,
    /// Per list: the kept tokens, ascending (the device's lists, mirrored).
    kept: Vec<Vec<u32>>,
    /// Per list: the entries the kernels read (the device's counts). Tokens decided inside a
    /// forward call are stored at once but read from the next call on, as the CPU cache
    /// decides them only after the call.
    published: Vec<usize>,
    layout: StoreLayout,
    pub(crate) buffer: wgpu::Buffer,
}

impl KeptStore {
    /// The store for `cache`'s streams (`None` when none keeps heavy hitters), copies of
    /// `ring_words` words.
    pub(crate) fn new(ctx: &GpuContext, cache: &KvCache, ring_words: usize) -> Option<Self> {
        if !cache.keeps_heavy_hitters() {
            return None;
        }
        let heads = cache.layout().kv_heads;
        let tallies = (0..2 * heads)
            .map(|list| {
                let stream = if list < heads {
                    cache.keys(list)
                } else {
                    cache.values(list - heads)
                };
                stream.heavy_hitters().map(|h| h.tally().emptied())
            })
            .collect();
        let layout = StoreLayout {
            lists: 2 * heads,
            capacity: FIRST_CAPACITY,
            ring_words,
        };
        Some(Self {
            tallies,
            kept: vec![Vec::new(); 2 * heads],
            published: vec![0; 2 * heads],
            layout,
            buffer: ctx.storage_buffer("kept copies", 4 * layout.words() as u64),
        })
    }

    /// Entries per list (the kernels' `kept_capacity`).
    pub(crate) fn capacity(&self) -> usize {
        self.layout.capacity
    }

    /// The kept tokens of list `list`.
    pub(crate) fn kept(&self, list: usize) -> &[u32] {
        &self.kept[list]
    }

    /// Bytes of the kept copies and their tokens.
    pub(crate) fn kept_bytes(&self) -> usize {
        self.kept.iter().map(Vec::len).sum::<usize>() * 4 * (self.layout.ring_words + 1)
    }

    /// Makes room for `needed` entries in every list (doubling), moving the entries held.
    fn reserve(&mut self, ctx: &GpuContext, needed: usize) -> Result<(), GpuError> {
        if needed <= self.layout.capacity {
            return Ok(());
        }
        let old = self.layout;
        let new = StoreLayout {
            capacity: needed.max(2 * old.capacity),
            ..old
        };
        let total = 4 * new.words() as u64;
        ctx.check_binding("kept copies", total)?;
        let buffer = ctx.storage_buffer("kept copies", total);
        // The counts are written after (never copied: a write issued before this submit would
        // land first and be overwritten).
        ctx.submit("grow the kept copies", |encoder| {
            for (list, kept) in self.kept.iter().enumerate() {
                let n = kept.len();
                if n == 0 {
                    continue;
                }
                for (from, to, count) in [
                    (old.token_word(list, 0), new.token_word(list, 0), n),
                    (
                        old.copy_word(list, 0),
                        new.copy_word(list, 0),
                        n * old.ring_words,
                    ),
                ] {
                    encoder.copy_buffer_to_buffer(
                        &self.buffer,
                        4 * from as u64,
                        &buffer,
                        4 * to as u64,
                        4 * count as u64,
                    );
                }
            }
            Ok(())
        })?;
        self.layout = new;
        self.buffer = buffer;
        self.write_counts(ctx);
        Ok(())
    }

    /// Writes every list's published count.
    fn write_counts(&self, ctx: &GpuContext) {
        let counts: Vec<u32> = self.published.iter().map(|&n| n as u32).collect();
        ctx.write(&self.buffer, 0, bytemuck::cast_slice(&counts));
    }

    /// Lets the kernels read every kept token.
    fn publish(&mut self, ctx: &GpuContext) {
        for (published, kept) in self.published.iter_mut().zip(&self.kept) {
            *published = kept.len();
        }
        self.write_counts(ctx);
    }

    /// Adds token `t` to list `list` (room reserved); the word its copy goes to.
    fn push(&mut self, ctx: &GpuContext, list: usize, t: usize) -> usize {
        let e = self.kept[list].len();
        self.kept[list].push(t as u32);
        ctx.write(
            &self.buffer,
            4 * self.layout.token_word(list, e) as u64,
            bytemuck::bytes_of(&(t as u32)),
        );
        self.layout.copy_word(list, e)
    }

    /// Keeps the tokens `moves` (list, token, word of its copy in `fp`), in order, each copied
    /// on the device from `fp`; `publish`: the kernels read them (and every earlier one) from
    /// now on.
    fn keep_from_ring(
        &mut self,
        ctx: &GpuContext,
        fp: &wgpu::Buffer,
        moves: &[(usize, usize, usize)],
        publish: bool,
    ) -> Result<(), GpuError> {
        let most = (0..self.layout.lists)
            .map(|list| self.kept[list].len() + moves.iter().filter(|m| m.0 == list).count())
            .max()
            .unwrap_or(0);
        self.reserve(ctx, most)?;
        let copies: Vec<(usize, usize)> = moves
            .iter()
            .map(|&(list, t, from)| (from, self.push(ctx, list, t)))
            .collect();
        if publish {
            self.publish(ctx);
        }
        if copies.is_empty() {
            return Ok(());
        }
        let bytes = 4 * self.layout.ring_words as u64;
        ctx.submit("keep heavy hitters", |encoder| {
            for &(from, to) in &copies {
                encoder.copy_buffer_to_buffer(
                    fp,
                    4 * from as u64,
                    &self.buffer,
                    4 * to as u64,
                    bytes,
                );
            }
            Ok(())
        })
    }

    /// Keeps token `t` in list `list` with the copy `words` given by the host.
    fn keep_from_host(
        &mut self,
        ctx: &GpuContext,
        list: usize,
        t: usize,
        words: &[u32],
    ) -> Result<(), GpuError> {
        self.reserve(ctx, self.kept[list].len() + 1)?;
        let at = self.push(ctx, list, t);
        ctx.write(&self.buffer, 4 * at as u64, bytemuck::cast_slice(words));
        Ok(())
    }

    /// Drops the kept tokens and counts from `new_len` on.
    fn truncate(&mut self, ctx: &GpuContext, new_len: usize) {
        for (kept, tally) in self.kept.iter_mut().zip(&mut self.tallies) {
            kept.truncate(kept.partition_point(|&k| (k as usize) < new_len));
            if let Some(tally) = tally {
                tally.truncate(new_len);
            }
        }
        self.publish(ctx);
    }
}

impl GpuKvCache {
    /// The tokens stream `stream` (0 keys, 1 values) of KV head `head` keeps as heavy hitters,
    /// ascending (empty for a stream without them).
    pub fn kept_tokens(&self, stream: usize, head: usize) -> &[u32] {
        self.kept
            .as_ref()
            .map_or(&[], |k| k.kept(stream * self.kv_heads + head))
    }

    /// Bytes of the kept heavy-hitter copies and their tokens on the device: `KvCache::kept_bytes`
    /// of the CPU cache that keeps the same tokens, but for an 8-bit copy's step, which takes a
    /// whole word here (2 bytes more per copy).
    pub fn kept_bytes(&self) -> usize {
        self.kept.as_ref().map_or(0, KeptStore::kept_bytes)
    }

    /// The kept store's buffer to bind (the copies' buffer stands in without heavy hitters:
    /// never read).
    pub(crate) fn kept_buffer(&self) -> &wgpu::Buffer {
        self.kept.as_ref().map_or(&self.fp, |k| &k.buffer)
    }

    /// The kernels' `kept_capacity` (0: no heavy hitters).
    pub(crate) fn kept_capacity(&self) -> usize {
        self.kept.as_ref().map_or(0, KeptStore::capacity)
    }

    /// The tokens a query at position `p` sees: `first_stored ..` the last with a position at
    /// most `p` (heavy hitters live on growing layers only).
    fn visible(&self, p: u32) -> Range<usize> {
        let stored = &self.positions[self.first_stored..self.len.min(self.positions.len())];
        self.first_stored..self.first_stored + stored.partition_point(|&q| q <= p)
    }

    /// The first token query `i` gathers scores for in KV head `g` (`attend.wgsl`'s
    /// `gather_first`): the earlier of its key and value window starts, sinks aside.
    fn gather_first(&self, windows: &[u32], i: usize, g: usize) -> usize {
        let kv = self.kv_heads;
        let row = &windows[i * 2 * kv..(i + 1) * 2 * kv];
        (row[g].min(row[kv + g]) as usize).max(self.sinks.min(self.len))
    }

    /// Scores per row the attention kernel gathers for `positions` with window starts
    /// `windows` (`[n, 2, kv_heads]`): the longest gathered range (0: nothing to gather).
    pub(crate) fn gather_stride(&self, positions: &[u32], windows: &[u32]) -> usize {
        if self.kept.is_none() {
            return 0;
        }
        let mut stride = 0;
        for (i, &p) in positions.iter().enumerate() {
            let end = self.visible(p).end;
            for g in 0..self.kv_heads {
                stride = stride.max(end.saturating_sub(self.gather_first(windows, i, g)));
            }
        }
        stride
    }

    /// Adds what the queries at `positions` (window starts `windows`) gave their window tokens
    /// — `weights` `[n, q_heads, stride]`, softmax weights from each row's gather start — to
    /// the tallies of the streams of each KV head, as `Stream::add_received` does.
    pub(crate) fn add_received(
        &mut self,
        positions: &[u32],
        windows: &[u32],
        weights: &[f32],
        stride: usize,
        q_heads: usize,
    ) {
        let kv = self.kv_heads;
        let group = q_heads / kv;
        let sink_end = self.sinks.min(self.len);
        let rows: Vec<(Range<usize>, Vec<usize>)> = positions
            .iter()
            .enumerate()
            .map(|(i, &p)| {
                let firsts = (0..kv).map(|g| self.gather_first(windows, i, g)).collect();
                (self.visible(p), firsts)
            })
            .collect();
        let Some(store) = &mut self.kept else {
            return;
        };
        for (i, (range, firsts)) in rows.iter().enumerate() {
            let uniform = 1.0 / range.len().max(1) as f32;
            for g in 0..kv {
                let first = firsts[g];
                let row0 = (i * q_heads + g * group) * stride;
                for stream in 0..2 {
                    let Some(tally) = &mut store.tallies[stream * kv + g] else {
                        continue;
                    };
                    let start = (windows[(i * 2 + stream) * kv + g] as usize)
                        .max(sink_end)
                        .max(first)
                        .max(range.start);
                    for t in start..range.end {
                        let j = t - first;
                        if j >= stride {
                            break;
                        }
                        let sum: f32 = (0..group).map(|h| weights[row0 + h * stride + j]).sum();
                        tally.add(t, sum / group as f32, uniform);
                    }
                }
            }
        }
    }

    /// Starts counting for the tokens `first..first + n` just appended (sinks aside).
    pub(crate) fn track_kept(&mut self, first: usize, n: usize) {
        let sinks = self.sinks;
        if let Some(store) = &mut self.kept {
            for tally in store.tallies.iter_mut().flatten() {
                for t in (first..first + n).filter(|&t| t >= sinks) {
                    tally.track(t);
                }
            }
        }
    }

    /// Decides, per stream, the pending tokens that a query at `len_at − 1` no longer reads in
    /// its window (before `len_at − window(len_at)`): those that drew the factor keep their
    /// ring copy (where the CPU stream still shows one). `publish`: the kernels read them (and
    /// all kept before) from now on; inside a forward call, tokens decided between its chunks
    /// wait for its end (the CPU cache decides them then).
    pub(crate) fn settle_kept(&mut self, len_at: usize, publish: bool) -> Result<(), GpuError> {
        let kv = self.kv_heads;
        let (len, sinks, ring) = (self.len, self.sinks, self.fp_ring);
        let Some(store) = &mut self.kept else {
            return Ok(());
        };
        let mut decided = Vec::new();
        for (list, tally) in store.tallies.iter_mut().enumerate() {
            let Some(tally) = tally else {
                continue;
            };
            let (stream, head) = (list / kv, list % kv);
            let end = len_at.saturating_sub(self.windows.rule(stream, head).at(len_at));
            let _ = tally.settle(end, |t| {
                // A pending token was in its window at the last settle, so the ring (the
                // longest window, the rewind margin and a chunk of `forward`) still holds its
                // copy, as the CPU stream (its ring or its step's copies) does.
                if t >= sinks && t < len && t + ring >= len {
                    decided.push((list, t));
                }
                Ok::<(), std::convert::Infallible>(())
            });
        }
        let values = self.fp_values();
        let moves: Vec<(usize, usize, usize)> = decided
            .into_iter()
            .map(|(list, t)| {
                let base = if list < kv { 0 } else { values };
                (list, t, base + self.fp_slot(list % kv, sinks + t % ring))
            })
            .collect();
        let ctx = Arc::clone(&self.ctx);
        let fp = self.fp.clone();
        match &mut self.kept {
            Some(store) => store.keep_from_ring(&ctx, &fp, &moves, publish),
            None => Ok(()),
        }
    }

    /// Drops the kept tokens and counts from `new_len` on.
    pub(crate) fn truncate_kept(&mut self, new_len: usize) {
        let ctx = Arc::clone(&self.ctx);
        if let Some(store) = &mut self.kept {
            store.truncate(&ctx, new_len);
        }
    }

    /// Takes `cache`'s heavy-hitter state: its tallies, its kept tokens (uploading the copies
    /// of those this copy does not keep yet, dropping those it keeps and the CPU does not).
    pub(crate) fn mirror_kept(&mut self, cache: &KvCache) -> Result<(), GpuError> {
        let ctx = Arc::clone(&self.ctx);
        let kv = self.kv_heads;
        let Some(store) = &mut self.kept else {
            return Ok(());
        };
        for list in 0..2 * kv {
            let stream = if list < kv {
                cache.keys(list)
            } else {
                cache.values(list - kv)
            };
            let Some(cpu) = stream.heavy_hitters() else {
                continue;
            };
            store.tallies[list] = Some(cpu.tally().clone());
            let same = store.kept[list]
                .iter()
                .zip(cpu.kept())
                .take_while(|(a, b)| a == b)
                .count();
            store.kept[list].truncate(same);
            for &t in &cpu.kept()[same..] {
                let (record, scales) = cpu.copy(t as usize).ok_or(GpuError::Shape {
                    what: "kept heavy-hitter copy",
                    expected: t as usize,
                    actual: cpu.kept().len(),
                })?;
                let words =
                    crate::host_encode::ring_words_of(stream.recent_codec(), record, scales);
                store.keep_from_host(&ctx, list, t as usize, &words)?;
            }
        }
        store.publish(&ctx);
        Ok(())
    }
}
