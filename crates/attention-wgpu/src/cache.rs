//! [`GpuKvCache`]: the GPU copy of one layer's [`KvCache`] — paged records in the CPU cache's
//! packed layout, positions, and the codec tables — kept in step by appending one token's
//! worth per decode step (encoded on the GPU, or encoded on the CPU and uploaded).
//!
//! # Pages
//!
//! Slots (token indices; ring slots `t mod (W + max_rewind)` on a sliding layer) are grouped
//! into pages. Page `i` holds `min(B·2^i, P)` slots, `B` the attention block (≤ 256 tokens) and
//! `P` the largest power of two whose page fits one binding of
//! [`SplitLimits::max_binding_bytes`](crate::SplitLimits) (at most 65 536): memory follows the
//! context within a factor of two, and long contexts need few dispatches. A key page is one
//! buffer of u32 words:
//!
//! ```text
//! words      [kv_heads, page_tokens, key record_words]          at 0
//! scales     [kv_heads, page_tokens, key scales] binary16,      at k_scales_offset
//!            two per word, even index in the low half
//! positions  [page_tokens] u32                                   at k_positions_offset
//! ```
//!
//! and a value page the same without positions. Each record is bit for bit the CPU cache's
//! record (`tq_cache::token_codec`): the GPU reads the packed codes, sign bits and f16 scales
//! directly. Attention sinks and recent windows (growing layers) also keep the CPU stream's
//! binary16 copies in one buffer (`fp`: keys `[kv_heads, sinks + ring, ⌈d/2⌉]` words, then
//! values; the first `sinks` tokens in their own slots, the window's in a ring), which
//! attention reads instead of those tokens' records. Appending lives in `append.rs`, attention in `attention.rs`.

use std::collections::HashMap;
use std::sync::Arc;

use half::f16;
use tq_cache::kv_cache::KvCache;

use crate::context::GpuContext;
use crate::error::GpuError;
use crate::host_encode::HostEncoder;
use crate::kernels::MAX_BLOCK_TOKENS;
use crate::tables::{StreamLayoutGpu, build_stream};

/// Largest page, in tokens.
pub const MAX_PAGE_TOKENS: usize = 1 << 16;

/// Where the parts of a page lie (u32 indices) and how big the buffers are.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PageLayout {
    pub k_scales_offset: usize,
    pub k_positions_offset: usize,
    pub k_words: usize,
    pub v_scales_offset: usize,
    pub v_words: usize,
}

impl PageLayout {
    fn new(tokens: usize, heads: usize, key: &StreamLayoutGpu, value: &StreamLayoutGpu) -> Self {
        let k_scales_offset = heads * tokens * key.record_words;
        let k_positions_offset = k_scales_offset + (heads * tokens * key.scales).div_ceil(2);
        let v_scales_offset = heads * tokens * value.record_words;
        Self {
            k_scales_offset,
            k_positions_offset,
            k_words: k_positions_offset + tokens,
            v_scales_offset,
            v_words: v_scales_offset + (heads * tokens * value.scales).div_ceil(2),
        }
    }

    fn max_bytes(&self) -> u64 {
        4 * self.k_words.max(self.v_words) as u64
    }
}

/// One page of slots on the device.
pub(crate) struct Page {
    pub first_slot: usize,
    pub tokens: usize,
    pub layout: PageLayout,
    pub keys: wgpu::Buffer,
    pub values: wgpu::Buffer,
}

/// Grow-only device buffers reused across calls.
#[derive(Default)]
pub(crate) struct Scratch {
    buffers: HashMap<&'static str, wgpu::Buffer>,
}

impl Scratch {
    /// A storage buffer called `name` of at least `bytes` (reallocated when too small).
    pub(crate) fn get(&mut self, ctx: &GpuContext, name: &'static str, bytes: u64) -> wgpu::Buffer {
        let needed = bytes.max(16).next_multiple_of(16);
        match self.buffers.get(name) {
            Some(buffer) if buffer.size() >= needed => buffer.clone(),
            _ => {
                let buffer = ctx.storage_buffer(name, needed);
                self.buffers.insert(name, buffer.clone());
                buffer
            }
        }
    }
}

/// Both streams' descriptors and the device buffer of their tables, checked against the head
/// dimension and the binding limit. `value_means`: the value stream's mean per KV head for a
/// centered stream (`None` for a head whose mean is not chosen yet: zeros), empty otherwise.
fn build_tables(
    ctx: &GpuContext,
    key_codecs: &[&tq_cache::TokenCodec],
    value_codecs: &[&tq_cache::TokenCodec],
    value_means: &[Option<&[f32]>],
    head_dim: usize,
) -> Result<(StreamLayoutGpu, StreamLayoutGpu, wgpu::Buffer), GpuError> {
    let mut data = Vec::new();
    let key = build_stream(key_codecs, &mut data)?;
    let mut value = build_stream(value_codecs, &mut data)?;
    if value_means.iter().any(Option::is_some) {
        value.desc.centered = 1;
        value.desc.mean_offset = data.len() as u32;
        for mean in value_means {
            match mean {
                Some(m) if m.len() == head_dim => data.extend_from_slice(m),
                _ => data.extend(std::iter::repeat_n(0.0f32, head_dim)),
            }
        }
    }
    if key.dim != head_dim || value.dim != head_dim {
        return Err(GpuError::Shape {
            what: "codec dimension",
            expected: head_dim,
            actual: key.dim.max(value.dim),
        });
    }
    ctx.check_binding("codec tables", 4 * data.len() as u64)?;
    let tables = ctx.storage_init("tables", bytemuck::cast_slice(&data));
    Ok((key, value, tables))
}

/// The GPU copy of one layer's KV cache (see the module docs for the page layout).
///
/// ```no_run
/// # use std::sync::Arc;
/// # use tq_attention_wgpu::{ContextOptions, GpuContext, GpuKvCache};
/// # use tq_cache::allocation::Allocation;
/// # use tq_cache::attention::AttentionShape;
/// # use tq_cache::kv_cache::{KvCache, KvKind, KvLayout};
/// # use tq_cache::token_store::Growth;
/// let ctx = Arc::new(GpuContext::new(&ContextOptions::default())?);
/// let layout = KvLayout {
///     kv_heads: 2,
///     head_dim: 64,
///     kind: KvKind::Growing { growth: Growth::Doubling { initial: 64 } },
///     max_rewind: 0,
///     rope_pairs: tq_cache::basis::RopePairs::Adjacent,
/// };
/// let cpu = KvCache::with_allocation(layout, &Allocation::preset("k5v4")?, 0, 1)?;
/// let mut gpu = GpuKvCache::from_cache(&ctx, &cpu)?; // upload once
/// let (k, v) = (vec![0.1f32; 2 * 64], vec![0.2f32; 2 * 64]);
/// gpu.encode_and_append(&k, &v, &[0])?; // one token per decode step
/// let q = vec![0.3f32; 4 * 64];
/// let mut out = vec![0.0f32; 4 * 64];
/// gpu.attend(&q, &[0], AttentionShape { q_heads: 4, scale: 0.125 }, &mut out)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct GpuKvCache {
    pub(crate) ctx: Arc<GpuContext>,
    pub(crate) kv_heads: usize,
    pub(crate) head_dim: usize,
    pub(crate) key: StreamLayoutGpu,
    pub(crate) value: StreamLayoutGpu,
    pub(crate) tables: wgpu::Buffer,
    pub(crate) block_tokens: usize,
    pub(crate) max_page_tokens: usize,
    pub(crate) pages: Vec<Page>,
    pub(crate) ring_slots: Option<usize>,
    pub(crate) window: Option<usize>,
    pub(crate) len: usize,
    pub(crate) first_stored: usize,
    /// Position of the token in each written slot (host mirror, 4 bytes a slot).
    pub(crate) positions: Vec<u32>,
    pub(crate) scratch: Scratch,
    /// The CPU codecs of streams encoded on the host (two-tier, centered, with sinks), `None`
    /// when the encode kernel takes both streams.
    pub(crate) host: Option<HostEncoder>,
    /// Attention sinks: tokens `t < sinks` (growing layers) are read from their binary16
    /// copies in `fp`, keys `[kv_heads, sinks + fp_ring, ⌈d/2⌉]` words then values the same.
    pub(crate) sinks: usize,
    /// Recent window (growing layers): each query reads its newest `recent` tokens from their
    /// copies, kept in a ring of `fp_ring` slots after the sinks' (token `t` at `sinks + t mod
    /// fp_ring`).
    pub(crate) recent: usize,
    pub(crate) fp_ring: usize,
    pub(crate) max_rewind: usize,
    /// The CPU stream's `oldest_recent`: tokens before it lost their copies in the CPU's ring
    /// of `recent + max_rewind` slots (mirrored so rewinds are refused exactly where the CPU
    /// refuses them).
    pub(crate) oldest_recent: usize,
    pub(crate) fp: wgpu::Buffer,
}

impl std::fmt::Debug for GpuKvCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuKvCache")
            .field("kv_heads", &self.kv_heads)
            .field("head_dim", &self.head_dim)
            .field("len", &self.len)
            .field("pages", &self.pages.len())
            .field("block_tokens", &self.block_tokens)
            .finish_non_exhaustive()
    }
}

/// One window per layer: every stream of `cache` outside a ring must keep `sinks` sink copies
/// and a `recent`-token window (the GPU copies ring and the kernels' window starts are one per
/// layer). An allocation can give streams windows of their own (`recent_fp_tokens` in a stream
/// table): a stream with none beside one with some is refused too, as is a CPU cache whose
/// windows are not the ones a GPU copy was built with (it would read codes where the CPU reads
/// copies). The copies must be binary16: f32 copies are not implemented, and an 8-bit window's
/// tokens have no codes at all on the CPU (`recent_dtype = "q8"`).
pub(crate) fn check_windows(cache: &KvCache, sinks: usize, recent: usize) -> Result<(), GpuError> {
    let f16 = |spec: &tq_cache::CodecSpec| matches!(spec, tq_cache::CodecSpec::F16 { .. });
    for h in 0..cache.layout().kv_heads {
        for (name, stream) in [("keys", cache.keys(h)), ("values", cache.values(h))] {
            let l = stream.layout();
            if l.ring_slots.is_none()
                && l.sink_tokens + l.recent_tokens > 0
                && !(f16(&l.fp) && l.recent.as_ref().is_none_or(f16))
            {
                return Err(GpuError::Unsupported(format!(
                    "attention sinks or recent windows other than binary16 copies (the {name} of \
                     KV head {h}: an f32 or 8-bit window, fp_dtype / recent_dtype)"
                )));
            }
            if l.ring_slots.is_none() && (l.sink_tokens != sinks || l.recent_tokens != recent) {
                return Err(GpuError::Unsupported(format!(
                    "attention sinks and recent windows with the same counts in every stream of \
                     a layer: the {name} of KV head {h} keep {} sinks and a {}-token window, \
                     the layer's GPU cache {sinks} and {recent}",
                    l.sink_tokens, l.recent_tokens
                )));
            }
        }
    }
    Ok(())
}

impl GpuKvCache {
    /// An empty GPU cache with the codecs, layout and policy of `cache` (its tokens are not
    /// copied; see [`upload_all`](Self::upload_all)).
    ///
    /// Two-tier streams (TQ_mse tiers), data-aware bases, mean-centered streams, attention
    /// sinks and recent windows are scored and summed by the kernels and encoded on the host
    /// with `cache`'s codecs, calibrating from the first batch (means, outlier channels, bases)
    /// as the CPU cache does and writing the binary16 copies.
    ///
    /// Errors: sinks or windows with f32 copies or different counts per stream (an allocation's
    /// per-stream `recent_fp_tokens`), a two-tier codec with a QJL or debiased tier, heads of one stream with
    /// different codec kinds, a head dimension above 512, or a page of one token that does not
    /// fit one binding.
    pub fn new(ctx: &Arc<GpuContext>, cache: &KvCache) -> Result<Self, GpuError> {
        let layout = *cache.layout();
        let heads = layout.kv_heads;
        let first = cache.keys(0).layout();
        check_windows(cache, first.sink_tokens, first.recent_tokens)?;
        let (sinks, recent) = match layout.ring_slots() {
            Some(_) => (0, 0),
            None => {
                let l = cache.keys(0).layout();
                (l.sink_tokens, l.recent_tokens)
            }
        };
        // The copies' ring holds every token a query may read from its window: the window, the
        // rewind margin, and one chunk of `forward`.
        let fp_ring = if recent > 0 {
            recent + layout.max_rewind + crate::attention::RECENT_CHUNK
        } else {
            0
        };
        // Two-tier and centered streams, and the full-precision copies of attention sinks, are
        // encoded on the host (the encode kernel implements neither the tiers nor the mean and
        // its calibration, and writes no copies).
        let host = (sinks + recent > 0
            || (0..heads)
                .flat_map(|h| [cache.keys(h), cache.values(h)])
                .any(|s| {
                    let l = s.layout();
                    l.outliers.is_some() || l.center.is_centered() || l.basis.fits_basis()
                }))
        .then(|| HostEncoder::new(cache));
        let (key, value, tables) = match &host {
            Some(host) => build_tables(
                ctx,
                &host.key_codecs(),
                &host.value_codecs(),
                &host.value_means(),
                layout.head_dim,
            )?,
            None => {
                let key_codecs: Vec<_> = (0..heads).map(|h| cache.keys(h).codec()).collect();
                let value_codecs: Vec<_> = (0..heads).map(|h| cache.values(h).codec()).collect();
                build_tables(ctx, &key_codecs, &value_codecs, &[], layout.head_dim)?
            }
        };
        let limit = ctx.split_limits().max_binding_bytes;
        let mut max_page_tokens = MAX_PAGE_TOKENS;
        while max_page_tokens > 1
            && PageLayout::new(max_page_tokens, heads, &key, &value).max_bytes() > limit
        {
            max_page_tokens /= 2;
        }
        let one = PageLayout::new(max_page_tokens, heads, &key, &value).max_bytes();
        if one > limit {
            return Err(GpuError::TooLarge {
                what: "a page of one token",
                needed: one,
                limit,
            });
        }
        let fp_words = 2 * heads * (sinks + fp_ring) * layout.head_dim.div_ceil(2);
        ctx.check_binding("full-precision copies", 4 * fp_words as u64)?;
        let fp = ctx.storage_buffer("full-precision copies", 4 * fp_words as u64);
        Ok(Self {
            ctx: Arc::clone(ctx),
            kv_heads: heads,
            head_dim: layout.head_dim,
            sinks,
            recent,
            fp_ring,
            max_rewind: layout.max_rewind,
            oldest_recent: 0,
            fp,
            key,
            value,
            tables,
            block_tokens: MAX_BLOCK_TOKENS.min(max_page_tokens),
            max_page_tokens,
            pages: Vec::new(),
            ring_slots: layout.ring_slots(),
            window: layout.window(),
            len: 0,
            first_stored: 0,
            positions: Vec::new(),
            scratch: Scratch::default(),
            host,
        })
    }

    /// Takes `cache`'s outlier channels (chosen from its first batch, or none yet) for the
    /// host-encoded streams when this copy is empty or about to be replaced (`replacing`), so
    /// that its records read right; a copy that holds tokens under other channels cannot take
    /// more (`Unsupported`).
    pub(crate) fn adopt_calibration(
        &mut self,
        cache: &KvCache,
        replacing: bool,
    ) -> Result<(), GpuError> {
        let Some(host) = &self.host else {
            return Ok(());
        };
        if host.matches(cache) {
            return Ok(());
        }
        if self.len > 0 && !replacing {
            return Err(GpuError::Unsupported(
                "records of a cache whose outlier channels differ from this copy's".into(),
            ));
        }
        self.replace_host(HostEncoder::new(cache))
    }

    /// Writes the CPU stream's full-precision copies of tokens `from..cache.len()` that this
    /// cache keeps: the sinks, and with a recent window the window's.
    pub(crate) fn upload_copies(&self, cache: &KvCache, from: usize) -> Result<(), GpuError> {
        // The CPU stream shows its window's copies only (`full_precision` past its recent
        // start), though its ring may hold `max_rewind` older ones.
        let ring_from = cache.len().saturating_sub(self.recent);
        let copied = |t: usize| t < self.sinks || (self.recent > 0 && t >= ring_from);
        let mut run: Option<(usize, Vec<u32>, Vec<u32>)> = None;
        for t in from..cache.len() {
            if !copied(t) {
                if let Some((first, ks, vs)) = run.take() {
                    self.write_copies(first, &ks, &vs);
                }
                continue;
            }
            let (_, ks, vs) = run.get_or_insert_with(|| (t, Vec::new(), Vec::new()));
            for h in 0..self.kv_heads {
                for (stream, out) in [(cache.keys(h), &mut *ks), (cache.values(h), &mut *vs)] {
                    let (_, record, _) = stream.full_precision(t).ok_or(GpuError::Shape {
                        what: "full-precision copy",
                        expected: t,
                        actual: stream.len(),
                    })?;
                    out.extend_from_slice(record);
                }
            }
        }
        if let Some((first, ks, vs)) = run {
            self.write_copies(first, &ks, &vs);
        }
        Ok(())
    }

    /// Word offset of the value copies in `fp`, and words per copy.
    pub(crate) fn fp_layout(&self) -> (usize, usize) {
        let words = self.head_dim.div_ceil(2);
        (self.kv_heads * (self.sinks + self.fp_ring) * words, words)
    }

    /// Writes binary16 copies of tokens `first..first + n` (`[n, kv_heads, ⌈d/2⌉]` words each
    /// for keys and values) into `fp`: sink tokens into their slots, and, with a recent
    /// window, the batch's last `fp_ring` tokens into the ring.
    pub(crate) fn write_copies(&self, first: usize, keys: &[u32], values: &[u32]) {
        let (value_offset, words) = self.fp_layout();
        let n = keys.len() / (self.kv_heads * words).max(1);
        let slots = self.sinks + self.fp_ring;
        for i in 0..n {
            let t = first + i;
            let slot = if t < self.sinks {
                t
            } else if self.fp_ring > 0 && i + self.fp_ring >= n {
                self.sinks + t % self.fp_ring
            } else {
                continue;
            };
            for h in 0..self.kv_heads {
                let at = (h * slots + slot) * words;
                let from = (i * self.kv_heads + h) * words;
                for (base, data) in [(0, keys), (value_offset, values)] {
                    self.ctx.write(
                        &self.fp,
                        4 * (base + at) as u64,
                        bytemuck::cast_slice(&data[from..from + words]),
                    );
                }
            }
        }
    }

    /// Both streams' descriptors and tables for `host`'s codecs and means.
    pub(crate) fn tables_for(
        &self,
        host: &HostEncoder,
    ) -> Result<(StreamLayoutGpu, StreamLayoutGpu, wgpu::Buffer), GpuError> {
        build_tables(
            &self.ctx,
            &host.key_codecs(),
            &host.value_codecs(),
            &host.value_means(),
            self.head_dim,
        )
    }

    /// Takes `host` (calibrated or emptied: Π depends on outlier channels and bases, the
    /// tables on means; record sizes do not change), its tables built before anything is
    /// replaced.
    pub(crate) fn replace_host(&mut self, host: HostEncoder) -> Result<(), GpuError> {
        let (key, value, tables) = self.tables_for(&host)?;
        (self.key, self.value, self.tables) = (key, value, tables);
        self.host = Some(host);
        Ok(())
    }

    /// [`new`](Self::new), then [`upload_all`](Self::upload_all).
    pub fn from_cache(ctx: &Arc<GpuContext>, cache: &KvCache) -> Result<Self, GpuError> {
        let mut gpu = Self::new(ctx, cache)?;
        gpu.upload_all(cache)?;
        Ok(gpu)
    }

    /// Tokens appended (on a sliding layer, including those the ring dropped).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing was appended.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The oldest token still stored.
    pub fn first_stored(&self) -> usize {
        self.first_stored
    }

    /// KV heads.
    pub fn kv_heads(&self) -> usize {
        self.kv_heads
    }

    /// Head dimension.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Tokens per attention block (pass 1 of decode attention).
    pub fn block_tokens(&self) -> usize {
        self.block_tokens
    }

    /// Slots of the largest page.
    pub fn max_page_tokens(&self) -> usize {
        self.max_page_tokens
    }

    /// Pages allocated on the device.
    pub fn pages(&self) -> usize {
        self.pages.len()
    }

    /// Bytes the pages hold on the device (allocated, not filled).
    pub fn device_bytes(&self) -> u64 {
        self.pages
            .iter()
            .map(|p| p.keys.size() + p.values.size())
            .sum()
    }

    /// Bytes one token costs in the pages: every head's key and value record and scales, plus
    /// its 4-byte position (what pass 1 of attention reads per token).
    pub fn bytes_per_token(&self) -> usize {
        let stream = |s: &StreamLayoutGpu| 4 * s.record_words + 2 * s.scales;
        self.kv_heads * (stream(&self.key) + stream(&self.value)) + 4
    }

    /// The slot of token `t`, if it is still stored.
    pub fn slot_of(&self, t: usize) -> Option<usize> {
        (t >= self.first_stored && t < self.len)
            .then(|| self.ring_slots.map_or(t, |slots| t % slots))
    }

    /// Slots holding a record (ring: at most its size).
    pub(crate) fn written_slots(&self) -> usize {
        self.positions.len()
    }

    /// Allocates pages until `slots` slots exist.
    pub(crate) fn ensure_slots(&mut self, slots: usize) {
        let mut capacity = self.pages.last().map_or(0, |p| p.first_slot + p.tokens);
        while capacity < slots {
            let doubled = self.block_tokens << self.pages.len().min(20);
            let mut tokens = doubled.min(self.max_page_tokens);
            if let Some(ring) = self.ring_slots {
                tokens = tokens.min((ring - capacity).next_multiple_of(self.block_tokens));
            }
            let layout = PageLayout::new(tokens, self.kv_heads, &self.key, &self.value);
            let index = self.pages.len();
            let keys = self
                .ctx
                .storage_buffer(&format!("key page {index}"), 4 * layout.k_words as u64);
            let values = self
                .ctx
                .storage_buffer(&format!("value page {index}"), 4 * layout.v_words as u64);
            self.pages.push(Page {
                first_slot: capacity,
                tokens,
                layout,
                keys,
                values,
            });
            capacity += tokens;
        }
    }

    /// The token living in slot `slot` (the newest one, on a ring).
    fn token_in_slot(&self, slot: usize) -> usize {
        match self.ring_slots {
            Some(ring) => slot + ring * ((self.len - 1 - slot) / ring),
            None => slot,
        }
    }

    /// Copies every stored token of `cache` (records, scales, positions) to the device,
    /// replacing what the GPU cache held. `cache` must have the layout, codecs, sinks and
    /// windows this cache was built from (other windows: [`GpuError::Unsupported`]).
    pub fn upload_all(&mut self, cache: &KvCache) -> Result<(), GpuError> {
        let layout = cache.layout();
        if layout.kv_heads != self.kv_heads || layout.head_dim != self.head_dim {
            return Err(GpuError::Shape {
                what: "KV heads × head dimension",
                expected: self.kv_heads * self.head_dim,
                actual: layout.kv_heads * layout.head_dim,
            });
        }
        check_windows(cache, self.sinks, self.recent)?;
        self.adopt_calibration(cache, true)?;
        for h in 0..self.kv_heads {
            let (k, v) = (cache.keys(h).codec(), cache.values(h).codec());
            if k.record_words() != self.key.record_words
                || v.record_words() != self.value.record_words
            {
                return Err(GpuError::Shape {
                    what: "record words",
                    expected: self.key.record_words,
                    actual: k.record_words(),
                });
            }
        }
        self.len = cache.len();
        self.first_stored = cache.first_stored();
        let slots = cache.keys(0).body().len();
        self.positions = vec![0; slots];
        for slot in 0..slots {
            let t = self.token_in_slot(slot);
            if let Some(p) = cache.position(t) {
                self.positions[slot] = p;
            }
        }
        self.ensure_slots(slots);
        for page in &self.pages {
            let filled = slots.saturating_sub(page.first_slot).min(page.tokens);
            if filled == 0 {
                continue;
            }
            let l = page.layout;
            let mut kw = vec![0u32; l.k_words];
            let mut vw = vec![0u32; l.v_words];
            for h in 0..self.kv_heads {
                for (stream, words, rw, spt, scales_at) in [
                    (
                        cache.keys(h),
                        &mut kw,
                        self.key.record_words,
                        self.key.scales,
                        l.k_scales_offset,
                    ),
                    (
                        cache.values(h),
                        &mut vw,
                        self.value.record_words,
                        self.value.scales,
                        l.v_scales_offset,
                    ),
                ] {
                    let body = stream.body();
                    let mut local = 0;
                    while local < filled {
                        let Some((records, halves, n)) =
                            body.run(page.first_slot + local, filled - local)
                        else {
                            break;
                        };
                        let row = h * page.tokens + local;
                        words[row * rw..(row + n) * rw].copy_from_slice(records);
                        for (i, s) in halves.iter().enumerate() {
                            let index = row * spt + i;
                            words[scales_at + index / 2] |=
                                u32::from(s.to_bits()) << (16 * (index % 2));
                        }
                        local += n;
                    }
                }
            }
            kw[l.k_positions_offset..l.k_positions_offset + filled]
                .copy_from_slice(&self.positions[page.first_slot..page.first_slot + filled]);
            self.ctx.write(&page.keys, 0, bytemuck::cast_slice(&kw));
            self.ctx.write(&page.values, 0, bytemuck::cast_slice(&vw));
        }
        // The copies the CPU stream shows: its sinks and its window. Older ones it may keep for
        // rewinds are not readable, so this copy cannot rewind past its window (a typed
        // `RewindTooFar`, where the CPU cache might still rewind).
        self.oldest_recent = cache.len().saturating_sub(self.recent);
        self.upload_copies(cache, 0)?;
        self.ctx.submit("upload", |_| Ok(()))
    }

    /// Drops every token from `new_len` on, with the CPU cache's rule: a ring must still hold
    /// the window of the new last token (else `RewindTooFar` and nothing changes).
    pub fn truncate(&mut self, new_len: usize) -> Result<(), GpuError> {
        if new_len >= self.len {
            return Ok(());
        }
        let needed = self.window.map_or(0, |w| (new_len + 1).saturating_sub(w));
        if self.first_stored > needed {
            return Err(tq_cache::CacheError::RewindTooFar {
                requested: self.len - new_len,
                reason: "the ring buffer has overwritten tokens the window would need again",
            }
            .into());
        }
        if self.recent > 0 && self.oldest_recent > new_len.saturating_sub(self.recent) {
            return Err(tq_cache::CacheError::RewindTooFar {
                requested: self.len - new_len,
                reason: "full-precision copies of the tokens that would become recent are gone \
                         (raise max_rewind)",
            }
            .into());
        }
        self.oldest_recent = self.oldest_recent.min(new_len);
        // An emptied CPU stream calibrates again on its next first batch.
        if new_len == 0
            && let Some(host) = &self.host
        {
            let mut fresh = host.clone();
            if fresh.forget_calibration()? {
                self.replace_host(fresh)?;
            }
        }
        self.len = new_len;
        self.first_stored = self.first_stored.min(new_len);
        if self.ring_slots.is_none_or(|r| self.positions.len() < r) {
            self.positions.truncate(new_len);
        }
        Ok(())
    }

    /// Reads the stored tokens back (token order, `first_stored..len`): key records
    /// `[tokens, kv_heads, record_words]`, key scales, value records, value scales, positions.
    pub fn download(&self) -> Result<Downloaded, GpuError> {
        let mut out = Downloaded::default();
        let mut pages = Vec::with_capacity(self.pages.len());
        for page in &self.pages {
            let k: Vec<u32> = bytemuck::pod_collect_to_vec(&self.ctx.read(
                &page.keys,
                0,
                4 * page.layout.k_words as u64,
            )?);
            let v: Vec<u32> = bytemuck::pod_collect_to_vec(&self.ctx.read(
                &page.values,
                0,
                4 * page.layout.v_words as u64,
            )?);
            pages.push((k, v));
        }
        let half = |words: &[u32], index: usize| {
            f16::from_bits((words[index / 2] >> (16 * (index % 2))) as u16)
        };
        for t in self.first_stored..self.len {
            let Some(slot) = self.slot_of(t) else {
                continue;
            };
            let Some(i) = self
                .pages
                .iter()
                .position(|p| slot >= p.first_slot && slot < p.first_slot + p.tokens)
            else {
                continue;
            };
            let page = &self.pages[i];
            let local = slot - page.first_slot;
            let (k, v) = &pages[i];
            out.positions
                .push(k[page.layout.k_positions_offset + local]);
            for h in 0..self.kv_heads {
                let row = h * page.tokens + local;
                let (kr, vr) = (self.key.record_words, self.value.record_words);
                out.key_records
                    .extend_from_slice(&k[row * kr..(row + 1) * kr]);
                out.value_records
                    .extend_from_slice(&v[row * vr..(row + 1) * vr]);
                for s in 0..self.key.scales {
                    let scales = &k[page.layout.k_scales_offset..];
                    out.key_scales.push(half(scales, row * self.key.scales + s));
                }
                for s in 0..self.value.scales {
                    let scales = &v[page.layout.v_scales_offset..];
                    out.value_scales
                        .push(half(scales, row * self.value.scales + s));
                }
            }
        }
        Ok(out)
    }
}

/// Records read back from the device by [`GpuKvCache::download`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Downloaded {
    /// `[tokens, kv_heads, key record_words]`.
    pub key_records: Vec<u32>,
    /// `[tokens, kv_heads, key scales]`.
    pub key_scales: Vec<f16>,
    /// `[tokens, kv_heads, value record_words]`.
    pub value_records: Vec<u32>,
    /// `[tokens, kv_heads, value scales]`.
    pub value_scales: Vec<f16>,
    /// `[tokens]`.
    pub positions: Vec<u32>,
}
