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
//! directly. A stream whose CPU body takes the fast-scan order (`tq_cache::record_order`: a
//! TQ_mse codec of whole words, a fitted basis, two tiers of TQ_mse or TQ_prod, asked for
//! `record_order = "fast-scan"`) keeps its words in that order here too — per KV head, blocks
//! of 32 slots, each the `32·record_words` words 32 rows would take, nibble-major, codes of 3
//! and 5–8 bits as bit planes, TQ_prod's signs as 1-bit codes — the CPU store's bytes, so a body uploads block by block as it
//! is and the kernels read the layout the CPU kernel reads (pages are whole blocks: their sizes
//! are multiples of `B`; under a binding limit too small for a page of 32 slots the records go
//! in rows).
//!
//! Attention sinks and recent windows (growing layers) also keep the CPU stream's
//! binary16 copies in one buffer (`fp`: keys `[kv_heads, sinks + ring, ⌈d/2⌉]` words, then
//! values; the first `sinks` tokens in their own slots, the window's in a ring), which
//! attention reads instead of those tokens' records. Appending lives in `append.rs`, attention in `attention.rs`.

use std::collections::HashMap;
use std::sync::Arc;

use half::f16;
use tq_cache::kv_cache::KvCache;
use tq_cache::record_order::{FAST_SCAN_BLOCK, RecordOrder};
use tq_cache::token_store::RunRecords;

use crate::context::GpuContext;
use crate::error::GpuError;
use crate::heavy_hitters::KeptStore;
use crate::host_encode::HostEncoder;
use crate::kernels::MAX_BLOCK_TOKENS;
use crate::page_records;
use crate::tables::{StreamLayoutGpu, build_stream};
use crate::windows::{RecentWindows, WindowRule};

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
/// centered stream (`None` for a head whose mean is not chosen yet: zeros), empty otherwise;
/// `key_rope_means` the same for `center = "rope"` keys (their `m`).
#[allow(clippy::too_many_arguments)]
fn build_tables(
    ctx: &GpuContext,
    key_codecs: &[&tq_cache::TokenCodec],
    value_codecs: &[&tq_cache::TokenCodec],
    value_means: &[Option<&[f32]>],
    key_rope_means: &[Option<&[f32]>],
    head_dim: usize,
    window_q8: bool,
    orders: [RecordOrder; 2],
) -> Result<(StreamLayoutGpu, StreamLayoutGpu, wgpu::Buffer), GpuError> {
    let mut data = Vec::new();
    // An 8-bit window's rotation Π₈ first (offset 0, `q8_rotation` in the kernels'
    // parameters): the prepare kernel rotates the queries with it, the finish kernel turns the
    // copies' weighted sum back.
    if window_q8 {
        let window = tq_cache::codec::Q8Window::new(head_dim)?;
        data.extend(crate::tables::column_major(
            &window.rotation().to_dense_f64(),
            head_dim,
        ));
    }
    let mut key = build_stream(key_codecs, orders[0], &mut data)?;
    let mut value = build_stream(value_codecs, orders[1], &mut data)?;
    let mut append_means = |means: &[Option<&[f32]>]| {
        let offset = data.len() as u32;
        for mean in means {
            match mean {
                Some(m) if m.len() == head_dim => data.extend_from_slice(m),
                _ => data.extend(std::iter::repeat_n(0.0f32, head_dim)),
            }
        }
        offset
    };
    if value_means.iter().any(Option::is_some) {
        value.desc.centered = 1;
        value.desc.mean_offset = append_means(value_means);
    }
    if !key_rope_means.is_empty() {
        key.desc.centered = crate::kernels::CENTER_ROPE;
        key.desc.mean_offset = append_means(key_rope_means);
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
///     rope_base: Default::default(),
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
    /// The record orders asked of the keys and values (the CPU layout's, or rows where pages
    /// are too small for whole blocks); each stream takes it where its codec allows
    /// ([`StreamLayoutGpu::fast_scan`]).
    pub(crate) orders: [RecordOrder; 2],
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
    /// Recent windows (growing layers): each query reads a stream's newest tokens (its
    /// window's rule at the tokens held) from their copies, kept in one ring of `fp_ring`
    /// slots after the sinks' (token `t` at `sinks + t mod fp_ring`); the ring grows with a
    /// window that grows with the context ([`ensure_ring`](Self::ensure_ring)).
    pub(crate) windows: RecentWindows,
    pub(crate) fp_ring: usize,
    /// The window starts `[n, 2, kv_heads]` of the queries of the last [`forward`] call with
    /// recent windows (its `n` tokens the newest), for [`attend_in_step`]; cleared by any
    /// other append, a truncation or an upload.
    ///
    /// [`forward`]: Self::forward
    /// [`attend_in_step`]: Self::attend_in_step
    pub(crate) step_windows: Option<Vec<u32>>,
    /// The ring holds 8-bit copies (`recent_dtype = "q8"`, [`ring_words`](Self::ring_words)
    /// words a slot: codes, then the f16 step) rather than binary16 ones.
    pub(crate) window_q8: bool,
    pub(crate) fp: wgpu::Buffer,
    /// `center = "rope"` keys: the model's RoPE pair layout (`None`: keys without it).
    pub(crate) rope_pairs: Option<tq_cache::basis::RopePairs>,
    /// Their table of block angles on the device and the blocks it covers (from block 0; grown
    /// as the cache grows, [`ensure_center_angles`](Self::ensure_center_angles)).
    pub(crate) center_angles: Option<(usize, wgpu::Buffer)>,
    /// Heavy hitters ([`crate::heavy_hitters`]): the kept copies and the tallies deciding them
    /// (`None`: no stream keeps any).
    pub(crate) kept: Option<KeptStore>,
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

/// The sinks and windows `cache`'s streams keep (`[keys per head.., values per head..]`; none
/// on a sliding layer).
pub(crate) fn windows_of(cache: &KvCache) -> (usize, RecentWindows) {
    let heads = cache.layout().kv_heads;
    if cache.layout().ring_slots().is_some() {
        return (0, RecentWindows::none(heads));
    }
    let streams = || {
        (0..heads)
            .map(|h| cache.keys(h))
            .chain((0..heads).map(|h| cache.values(h)))
    };
    let rules = streams()
        .map(|s| WindowRule {
            tokens: s.layout().recent_tokens,
            fraction: s.layout().recent_fraction,
        })
        .collect();
    let slots = streams().map(|s| s.recent_slots()).collect();
    (
        cache.keys(0).layout().sink_tokens,
        RecentWindows::new(heads, rules, slots, cache.layout().max_rewind),
    )
}

/// A GPU copy built with `sinks` sinks and `windows` reads `cache`'s records right only if
/// `cache` keeps the same (else it would read codes where the CPU reads copies): the same sinks
/// in every stream (one sink count per layer), the same window per stream and KV head (windows
/// may differ between streams and heads: an allocation's per-stream `recent_fp_tokens`).
/// Sink copies must be binary16 (f32 copies are not implemented), window copies binary16 or
/// 8-bit (`recent_dtype = "q8"`), the same in every stream (`window_q8`: one ring layout per
/// layer).
pub(crate) fn check_windows(
    cache: &KvCache,
    sinks: usize,
    windows: &RecentWindows,
    window_q8: bool,
) -> Result<(), GpuError> {
    use tq_cache::CodecSpec;
    let f16 = |spec: &CodecSpec| matches!(spec, CodecSpec::F16 { .. });
    for h in 0..cache.layout().kv_heads {
        for (s, name, stream) in [(0, "keys", cache.keys(h)), (1, "values", cache.values(h))] {
            let l = stream.layout();
            if l.ring_slots.is_some() {
                continue;
            }
            let windowed = windows.rule(s, h).is_some();
            if (l.sink_tokens > 0 || windowed) && !f16(&l.fp) {
                return Err(GpuError::Unsupported(format!(
                    "attention sinks or recent windows with f32 copies (the {name} of KV head \
                     {h}: fp_dtype)"
                )));
            }
            let q8 = matches!(l.recent, Some(CodecSpec::Q8 { .. }));
            if windowed && q8 != window_q8 {
                return Err(GpuError::Unsupported(format!(
                    "a recent window whose copies differ from the layer's GPU copy (the {name} \
                     of KV head {h} keep {} copies, the GPU cache {}: recent_dtype)",
                    if q8 { "8-bit" } else { "binary16" },
                    if window_q8 { "8-bit" } else { "binary16" },
                )));
            }
            if l.sink_tokens != sinks {
                return Err(GpuError::Unsupported(format!(
                    "attention sinks with the same count in every stream of a layer: the {name} \
                     of KV head {h} keep {}, the layer's GPU cache {sinks}",
                    l.sink_tokens
                )));
            }
            let rule = WindowRule {
                tokens: l.recent_tokens,
                fraction: l.recent_fraction,
            };
            if rule != windows.rule(s, h) {
                return Err(GpuError::Unsupported(format!(
                    "a CPU cache with other recent windows than this GPU copy was built with: \
                     the {name} of KV head {h} keep {rule:?}, the GPU copy {:?}",
                    windows.rule(s, h)
                )));
            }
        }
    }
    Ok(())
}

/// Token `t`'s record and scales as `stream` stores them — or, for a token of an 8-bit window
/// that has no codes yet, as it will store them when the token leaves the window: its window
/// copy decoded, then encoded (`Stream::push`). The GPU writes every token's codes when it
/// arrives and reads the copy while the token is in the window.
pub(crate) fn stored_codes(
    stream: &tq_cache::stream::Stream,
    t: usize,
    scratch: &mut tq_cache::codec::CodecScratch,
) -> Result<(Vec<u32>, Vec<f16>), GpuError> {
    let missing = GpuError::Shape {
        what: "stored token",
        expected: t,
        actual: stream.first_stored(),
    };
    if t >= stream.first_stored() && t < stream.body_tokens(stream.len()) {
        let (record, halves) = stream
            .body()
            .record_copy(stream.body_slot(t))
            .ok_or(missing)?;
        return Ok((record.into_owned(), halves.to_vec()));
    }
    let (window, record, halves) = stream.recent_copy(t).ok_or(missing)?;
    let mut decoded = vec![0.0f32; stream.layout().head_dim()];
    window.decode_into(record, halves, scratch, &mut decoded)?;
    let codec = stream.codec();
    let mut codes = vec![0u32; codec.record_words()];
    let mut scales = vec![f16::ZERO; codec.scales_per_token()];
    codec.encode_into(&decoded, scratch, &mut codes, &mut scales)?;
    Ok((codes, scales))
}

/// Words of one ring slot: binary16 copies `⌈d/2⌉`; 8-bit copies `⌈d/4⌉` of codes and one
/// holding the f16 step (`host_encode::ring_words_of`).
fn ring_slot_words(head_dim: usize, window_q8: bool) -> usize {
    if window_q8 {
        head_dim.div_ceil(4) + 1
    } else {
        head_dim.div_ceil(2)
    }
}

/// The copies' ring holds every token a query may read from its window with `held` tokens
/// held: the longest ring of the CPU streams (window and rewind margin), and one chunk of
/// `forward` (0 without windows).
fn ring_slots_for(windows: &RecentWindows, held: usize) -> usize {
    if windows.any() {
        windows.slots_at(held) + crate::attention::RECENT_CHUNK
    } else {
        0
    }
}

/// Words of one KV head's copies of one stream: its binary16 sink slots, then its ring.
fn fp_head_words(sinks: usize, fp_ring: usize, head_dim: usize, window_q8: bool) -> usize {
    sinks * head_dim.div_ceil(2) + fp_ring * ring_slot_words(head_dim, window_q8)
}

impl GpuKvCache {
    /// An empty GPU cache with the codecs, layout and policy of `cache` (its tokens are not
    /// copied; see [`upload_all`](Self::upload_all)).
    ///
    /// Two-tier streams (TQ_mse tiers), data-aware bases, mean-centered streams, attention
    /// sinks and recent windows are scored and summed by the kernels and encoded on the host
    /// with `cache`'s codecs, calibrating from the first batch (means, outlier channels, bases)
    /// as the CPU cache does and writing the copies (binary16 sinks; binary16 or 8-bit windows,
    /// one per stream and KV head).
    ///
    /// RoPE-aware key centering (`center = "rope"`) is encoded on the host too, each token's
    /// center turned to its block; the prepare kernel computes each query's score correction
    /// per center block from a table of block angles kept on the device
    /// ([`tq_cache::rope_center`]).
    ///
    /// Heavy hitters ([`tq_cache::heavy_hitters`]) keep their copies on the device and decide
    /// them with the CPU stream's rule ([`KeepTally`](tq_cache::heavy_hitters::KeepTally)), from
    /// the weights the attention kernels hand back.
    ///
    /// Errors: RoPE-aware key centering on some KV heads only, sinks or windows with f32 copies,
    /// sink counts that differ between streams, a two-tier codec with a QJL or debiased tier,
    /// heads of one stream with different codec kinds, a head dimension above 512, or a page of
    /// one token that does not fit one binding.
    pub fn new(ctx: &Arc<GpuContext>, cache: &KvCache) -> Result<Self, GpuError> {
        let layout = *cache.layout();
        let heads = layout.kv_heads;
        // RoPE-aware key centering: every KV head's keys or none (one descriptor per stream).
        let rope_keys = (0..heads)
            .filter(|&h| cache.keys(h).center().turns_with_position())
            .count();
        if rope_keys != 0 && rope_keys != heads {
            return Err(GpuError::Unsupported(
                "RoPE-aware key centering (center = \"rope\") on some KV heads of a layer only"
                    .into(),
            ));
        }
        let rope_pairs = (rope_keys != 0).then_some(layout.rope_pairs);
        let (sinks, windows) = windows_of(cache);
        let window_q8 = windows.any()
            && (0..heads)
                .flat_map(|h| [cache.keys(h), cache.values(h)])
                .any(|s| {
                    s.recent_slots() > 0
                        && matches!(s.layout().recent, Some(tq_cache::CodecSpec::Q8 { .. }))
                });
        check_windows(cache, sinks, &windows, window_q8)?;
        let fp_ring = ring_slots_for(&windows, 0);
        // The record orders the CPU streams were asked for: the pages take the one their
        // bodies take, so a fast-scan body's blocks upload as they are.
        let mut orders = [cache.keys(0).layout().order, cache.values(0).layout().order];
        // Two-tier and centered streams, and the full-precision copies of attention sinks, are
        // encoded on the host (the encode kernel implements neither the tiers nor the mean and
        // its calibration, and writes no copies).
        let host = (sinks > 0
            || windows.any()
            || (0..heads)
                .flat_map(|h| [cache.keys(h), cache.values(h)])
                .any(|s| {
                    let l = s.layout();
                    l.outliers.is_some() || l.center.is_centered() || l.basis.fits_basis()
                }))
        .then(|| HostEncoder::new(cache));
        let tables_for = |orders| match &host {
            Some(host) => build_tables(
                ctx,
                &host.key_codecs(),
                &host.value_codecs(),
                &host.value_means(),
                &host.key_rope_means(),
                layout.head_dim,
                window_q8,
                orders,
            ),
            None => {
                let key_codecs: Vec<_> = (0..heads).map(|h| cache.keys(h).codec()).collect();
                let value_codecs: Vec<_> = (0..heads).map(|h| cache.values(h).codec()).collect();
                build_tables(
                    ctx,
                    &key_codecs,
                    &value_codecs,
                    &[],
                    &[],
                    layout.head_dim,
                    false,
                    orders,
                )
            }
        };
        let (mut key, mut value, mut tables) = tables_for(orders)?;
        let limit = ctx.split_limits().max_binding_bytes;
        let mut max_page_tokens = MAX_PAGE_TOKENS;
        while max_page_tokens > 1
            && PageLayout::new(max_page_tokens, heads, &key, &value).max_bytes() > limit
        {
            max_page_tokens /= 2;
        }
        // Pages of fewer than 32 slots (a binding limit far below any GPU's) cannot hold whole
        // blocks: the records go in rows there (the page sizes do not depend on the order).
        if max_page_tokens < FAST_SCAN_BLOCK && orders.contains(&RecordOrder::FastScan) {
            orders = [RecordOrder::Rows; 2];
            (key, value, tables) = tables_for(orders)?;
        }
        let one = PageLayout::new(max_page_tokens, heads, &key, &value).max_bytes();
        if one > limit {
            return Err(GpuError::TooLarge {
                what: "a page of one token",
                needed: one,
                limit,
            });
        }
        let fp_words = 2 * heads * fp_head_words(sinks, fp_ring, layout.head_dim, window_q8);
        ctx.check_binding("full-precision copies", 4 * fp_words as u64)?;
        let fp = ctx.storage_buffer("full-precision copies", 4 * fp_words as u64);
        let kept = KeptStore::new(ctx, cache, ring_slot_words(layout.head_dim, window_q8));
        Ok(Self {
            ctx: Arc::clone(ctx),
            kv_heads: heads,
            head_dim: layout.head_dim,
            sinks,
            windows,
            fp_ring,
            window_q8,
            step_windows: None,
            fp,
            key,
            value,
            tables,
            block_tokens: MAX_BLOCK_TOKENS.min(max_page_tokens),
            max_page_tokens,
            orders,
            pages: Vec::new(),
            ring_slots: layout.ring_slots(),
            window: layout.window(),
            len: 0,
            first_stored: 0,
            positions: Vec::new(),
            scratch: Scratch::default(),
            host,
            rope_pairs,
            center_angles: None,
            kept,
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

    /// Writes the CPU stream's copies of tokens `from..cache.len()` that this cache keeps: the
    /// sinks' (binary16), and with a recent window the window's (binary16 or 8-bit).
    pub(crate) fn upload_copies(&mut self, cache: &KvCache, from: usize) -> Result<(), GpuError> {
        let missing = |t: usize, stream: &tq_cache::stream::Stream| GpuError::Shape {
            what: "full-precision copy",
            expected: t,
            actual: stream.len(),
        };
        let sink_end = self.sinks.min(cache.len());
        for t in from..sink_end {
            let (mut ks, mut vs) = (Vec::new(), Vec::new());
            for h in 0..self.kv_heads {
                for (stream, out) in [(cache.keys(h), &mut ks), (cache.values(h), &mut vs)] {
                    let (_, record, _) = stream.full_precision(t).ok_or(missing(t, stream))?;
                    out.extend_from_slice(record);
                }
            }
            self.write_sink_copies(t, &ks, &vs);
        }
        if !self.windows.any() {
            return Ok(());
        }
        self.ensure_ring(cache.len())?;
        // The CPU stream shows its window's copies only (`recent_copy` past its recent start),
        // though its ring may hold `max_rewind` older ones; a stream with a shorter window than
        // the longest gets zeros it never reads. A sink's window copy is never read here (the
        // sink's own copy is).
        let first = from
            .max(
                cache
                    .len()
                    .saturating_sub(self.windows.longest_at(cache.len())),
            )
            .max(self.sinks);
        let words = self.ring_words();
        let (mut ks, mut vs) = (Vec::new(), Vec::new());
        for t in first..cache.len() {
            for h in 0..self.kv_heads {
                for (s, stream, out) in [(0, cache.keys(h), &mut ks), (1, cache.values(h), &mut vs)]
                {
                    if t + self.windows.rule(s, h).at(cache.len()) < cache.len() {
                        out.extend(std::iter::repeat_n(0u32, words));
                        continue;
                    }
                    let (codec, record, scales) =
                        stream.recent_copy(t).ok_or(missing(t, stream))?;
                    out.extend(crate::host_encode::ring_words_of(codec, record, scales));
                }
            }
        }
        self.write_ring_copies(first, &ks, &vs);
        Ok(())
    }

    /// Words of one ring copy: binary16 `⌈d/2⌉`, or 8-bit `⌈d/4⌉` codes and the step.
    pub(crate) fn ring_words(&self) -> usize {
        ring_slot_words(self.head_dim, self.window_q8)
    }

    /// Word offset of the value copies in `fp` (the keys' start at 0).
    pub(crate) fn fp_values(&self) -> usize {
        self.kv_heads * fp_head_words(self.sinks, self.fp_ring, self.head_dim, self.window_q8)
    }

    /// Word offset of slot `slot` of KV head `h` in the keys' copies (`fp` holds, per head,
    /// `sinks` binary16 slots, then `fp_ring` ring slots).
    pub(crate) fn fp_slot(&self, h: usize, slot: usize) -> usize {
        let head = h * fp_head_words(self.sinks, self.fp_ring, self.head_dim, self.window_q8);
        let sink_words = self.head_dim.div_ceil(2);
        if slot < self.sinks {
            head + slot * sink_words
        } else {
            head + self.sinks * sink_words + (slot - self.sinks) * self.ring_words()
        }
    }

    /// For `center = "rope"` keys, makes the device's table of block angles cover every stored
    /// token: the host's table (`tq_cache::rope_center::center_angles`, grown by doubling, so
    /// this uploads a few times in a context's life), uploaded whole. Nothing for other keys.
    pub(crate) fn ensure_center_angles(&mut self) -> Result<(), GpuError> {
        if self.rope_pairs.is_none() || self.len == 0 {
            return Ok(());
        }
        let last_block = (self.len - 1) / tq_cache::rope_center::CENTER_BLOCK;
        if matches!(&self.center_angles, Some((blocks, _)) if *blocks > last_block) {
            return Ok(());
        }
        let Some(table) = self
            .host
            .as_ref()
            .and_then(|h| h.key_center_angles(self.len - 1))
        else {
            return Err(GpuError::Unsupported(
                "RoPE-centered keys without their host encoder".into(),
            ));
        };
        let values: Vec<f32> = (0..table.blocks())
            .flat_map(|b| table.block(b).iter().copied())
            .collect();
        self.ctx
            .check_binding("RoPE center angles", 4 * values.len() as u64)?;
        let buffer = self
            .ctx
            .storage_init("RoPE center angles", bytemuck::cast_slice(&values));
        self.center_angles = Some((table.blocks(), buffer));
        Ok(())
    }

    /// Makes the copies' ring long enough for `held` tokens held (a window that grows with the
    /// context needs more slots as it does): a longer ring, at least twice as long, takes
    /// every copy of the old one to its token's new slot (`t mod fp_ring`), on the device.
    pub(crate) fn ensure_ring(&mut self, held: usize) -> Result<(), GpuError> {
        let needed = ring_slots_for(&self.windows, held);
        if needed <= self.fp_ring {
            return Ok(());
        }
        let slots = needed.max(2 * self.fp_ring);
        let head_words = fp_head_words(self.sinks, slots, self.head_dim, self.window_q8);
        let fp_words = 2 * self.kv_heads * head_words;
        self.ctx
            .check_binding("full-precision copies", 4 * fp_words as u64)?;
        let fp = self
            .ctx
            .storage_buffer("full-precision copies", 4 * fp_words as u64);
        let sink_words = self.sinks * self.head_dim.div_ceil(2);
        let words = self.ring_words();
        // The tokens the old ring holds (some slots may never have been written: copying
        // them moves zeros).
        let first = self.len.saturating_sub(self.fp_ring);
        let old_values = self.fp_values();
        let old_head = fp_head_words(self.sinks, self.fp_ring, self.head_dim, self.window_q8);
        let mut runs = Vec::new();
        let mut t = first;
        while t < self.len {
            let (from, to) = (t % self.fp_ring, t % slots);
            let n = (self.len - t).min(self.fp_ring - from).min(slots - to);
            runs.push((from, to, n));
            t += n;
        }
        self.ctx.submit("grow the recent ring", |encoder| {
            for (old_base, new_base) in [(0, 0), (old_values, self.kv_heads * head_words)] {
                for h in 0..self.kv_heads {
                    let (old, new) = (old_base + h * old_head, new_base + h * head_words);
                    let mut copy = |from: usize, to: usize, n: usize| {
                        if n > 0 {
                            encoder.copy_buffer_to_buffer(
                                &self.fp,
                                4 * from as u64,
                                &fp,
                                4 * to as u64,
                                4 * n as u64,
                            );
                        }
                    };
                    copy(old, new, sink_words);
                    for &(from, to, n) in &runs {
                        copy(
                            old + sink_words + from * words,
                            new + sink_words + to * words,
                            n * words,
                        );
                    }
                }
            }
            Ok(())
        })?;
        self.fp = fp;
        self.fp_ring = slots;
        Ok(())
    }

    /// Writes the binary16 sink copies of token `t` (< sinks): `[kv_heads, ⌈d/2⌉]` words each
    /// for keys and values.
    pub(crate) fn write_sink_copies(&self, t: usize, keys: &[u32], values: &[u32]) {
        let words = self.head_dim.div_ceil(2);
        self.write_slots(t, words, keys, values);
    }

    /// Writes the ring copies of tokens `first..first + n` (`[n, kv_heads, ring_words]` words
    /// each for keys and values): the last `fp_ring` of them, the others would be overwritten.
    pub(crate) fn write_ring_copies(&self, first: usize, keys: &[u32], values: &[u32]) {
        let words = self.ring_words();
        let n = keys.len() / (self.kv_heads * words).max(1);
        for i in n.saturating_sub(self.fp_ring)..n {
            let t = first + i;
            let at = i * self.kv_heads * words;
            let end = at + self.kv_heads * words;
            self.write_slots(
                self.sinks + t % self.fp_ring,
                words,
                &keys[at..end],
                &values[at..end],
            );
        }
    }

    /// Writes one slot of every KV head, keys and values (`[kv_heads, words]` each).
    fn write_slots(&self, slot: usize, words: usize, keys: &[u32], values: &[u32]) {
        let value_offset = self.fp_values();
        for h in 0..self.kv_heads {
            let at = self.fp_slot(h, slot);
            let from = h * words;
            for (base, data) in [(0, keys), (value_offset, values)] {
                self.ctx.write(
                    &self.fp,
                    4 * (base + at) as u64,
                    bytemuck::cast_slice(&data[from..from + words]),
                );
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
            &host.key_rope_means(),
            self.head_dim,
            self.window_q8,
            self.orders,
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

    /// Bytes the pages hold on the device (allocated, not filled), and the heavy hitters' kept
    /// store.
    pub fn device_bytes(&self) -> u64 {
        self.pages
            .iter()
            .map(|p| p.keys.size() + p.values.size())
            .sum::<u64>()
            + self.kept.as_ref().map_or(0, |k| k.buffer.size())
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
        check_windows(cache, self.sinks, &self.windows, self.window_q8)?;
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
        self.step_windows = None;
        // An 8-bit window's tokens have no codes on the CPU yet: their slots follow the body's,
        // with the codes they will have (`stored_codes`).
        let body_slots = cache.keys(0).body().len();
        let slots = if self.window_q8 {
            cache.len()
        } else {
            body_slots
        };
        self.positions = vec![0; slots];
        for slot in 0..slots {
            let t = self.token_in_slot(slot);
            if let Some(p) = cache.position(t) {
                self.positions[slot] = p;
            }
        }
        self.ensure_slots(slots);
        let mut scratch = tq_cache::codec::CodecScratch::new(self.head_dim);
        for page in &self.pages {
            let filled = slots.saturating_sub(page.first_slot).min(page.tokens);
            if filled == 0 {
                continue;
            }
            let l = page.layout;
            let mut kw = vec![0u32; l.k_words];
            let mut vw = vec![0u32; l.v_words];
            for h in 0..self.kv_heads {
                for (stream, words, layout, scales_at) in [
                    (cache.keys(h), &mut kw, &self.key, l.k_scales_offset),
                    (cache.values(h), &mut vw, &self.value, l.v_scales_offset),
                ] {
                    let (rw, spt) = (layout.record_words, layout.scales);
                    let body = stream.body();
                    let put_scales = |words: &mut Vec<u32>, row: usize, halves: &[f16]| {
                        for (i, s) in halves.iter().enumerate() {
                            let index = row * spt + i;
                            words[scales_at + index / 2] |=
                                u32::from(s.to_bits()) << (16 * (index % 2));
                        }
                    };
                    // The body's runs are copied as they are (rows, or whole fast-scan blocks
                    // from a block's first slot: the page holds the CPU store's bytes); other
                    // tokens (an 8-bit window's, a block's tail after a partial one) record by
                    // record.
                    let mut local = 0;
                    while local < filled {
                        let slot = page.first_slot + local;
                        let run = (slot < body.len())
                            .then(|| body.records(slot, filled - local))
                            .flatten();
                        let row = h * page.tokens + local;
                        match (run, layout.fast_scan()) {
                            (Some((RunRecords::Rows(records), halves, n)), false) => {
                                words[row * rw..(row + n) * rw].copy_from_slice(records);
                                put_scales(words, row, halves);
                                local += n;
                                continue;
                            }
                            (Some((RunRecords::FastScan { codes, lead: 0 }, halves, n)), true)
                                if body.planes() == layout.planes[h].as_ref() =>
                            {
                                page_records::put_blocks(
                                    words,
                                    rw,
                                    h,
                                    page.tokens,
                                    local,
                                    codes,
                                    n,
                                );
                                put_scales(words, row, halves);
                                local += n;
                                continue;
                            }
                            _ => {}
                        }
                        let t = self.token_in_slot(slot);
                        let (record, halves) = stored_codes(stream, t, &mut scratch)?;
                        page_records::put_record(words, layout, h, page.tokens, local, &record);
                        put_scales(words, row, &halves);
                        local += 1;
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
        self.windows.uploaded(cache.len());
        self.upload_copies(cache, 0)?;
        self.truncate_kept(0);
        self.mirror_kept(cache)?;
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
        if self.windows.rewind_blocked(new_len) {
            return Err(tq_cache::CacheError::RewindTooFar {
                requested: self.len - new_len,
                reason: "full-precision copies of the tokens that would become recent are gone \
                         (raise max_rewind)",
            }
            .into());
        }
        self.windows.truncated(new_len);
        self.truncate_kept(new_len);
        self.step_windows = None;
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
                out.key_records.extend(page_records::take_record(
                    k,
                    &self.key,
                    h,
                    page.tokens,
                    local,
                ));
                out.value_records.extend(page_records::take_record(
                    v,
                    &self.value,
                    h,
                    page.tokens,
                    local,
                ));
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
