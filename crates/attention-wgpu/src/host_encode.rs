//! [`HostEncoder`]: encoding on the CPU for the streams the encode kernel does not implement
//! (two tiers, data-aware bases, centering, full-precision copies), with the CPU cache's
//! calibration.
//!
//! A centered stream chooses its mean `μ` from its first appended batch and stores `x − μ` (a
//! `center = "rope"` key stream `x − c(t)`, its mean turned to token `t`'s block, so encoding
//! takes the batch's first token index); a two-tier stream chooses its outlier channels, and a basis stream its basis (a plane basis
//! weighed by the batch's queries), from the same batch (centered first), per KV head; all
//! choose again after a rewind to empty. The encoder keeps each head's stream layout and codec
//! and calibrates through `StreamLayout::calibrated` and `uncalibrated` — what the CPU stream
//! calibrates and forgets with — on the batch `tq_cache::kv_cache::head_rows` gives it, so a GPU cache
//! given the same vectors as a CPU cache stores the same records, bit for bit (tested). The
//! records then go up like any CPU-encoded token (`GpuKvCache::append_encoded`): for one decode
//! step that is a few hundred bytes per layer.

use half::f16;
use tq_cache::TokenCodec;
use tq_cache::codec::CodecScratch;
use tq_cache::kv_cache::KvCache;
use tq_cache::stream::StreamLayout;

use crate::error::GpuError;

/// One stream of one KV head: its layout (outlier plan, chosen channels) and its codec.
#[derive(Clone, Debug)]
struct HostStream {
    layout: StreamLayout,
    codec: TokenCodec,
}

impl HostStream {
    /// Whether this stream writes a token's codes from its 8-bit window copy
    /// (`Stream::defers_codes`: an 8-bit window of its own on a growing layer).
    fn defers_codes(&self) -> bool {
        let l = &self.layout;
        l.ring_slots.is_none()
            && l.has_window()
            && matches!(l.recent, Some(tq_cache::CodecSpec::Q8 { .. }))
    }

    /// Calibrates on `batch` (`[n, head_dim]`) where the stream has not chosen yet
    /// ([`StreamLayout::calibrated`], as the CPU stream does), rebuilding the codec if the
    /// outlier channels or the basis changed; whether anything changed.
    fn calibrate(&mut self, batch: &[f32], query_energy: Option<&[f64]>) -> Result<bool, GpuError> {
        let layout = self.layout.calibrated(batch, query_energy)?;
        self.replace_layout(layout)
    }

    /// Forgets the chosen mean, outlier channels and basis (as an emptied CPU stream does);
    /// whether anything changed.
    fn forget(&mut self) -> Result<bool, GpuError> {
        self.replace_layout(self.layout.uncalibrated())
    }

    /// Takes `layout` and its codec; whether it differs from the current one.
    fn replace_layout(&mut self, layout: StreamLayout) -> Result<bool, GpuError> {
        if layout == self.layout {
            return Ok(false);
        }
        if layout.channels != self.layout.channels || layout.basis_fit != self.layout.basis_fit {
            self.codec = layout.build_codec()?;
        }
        self.layout = layout;
        Ok(true)
    }
}

/// The keys' and values' codecs of every KV head, encoding on the host.
#[derive(Clone, Debug)]
pub(crate) struct HostEncoder {
    keys: Vec<HostStream>,
    values: Vec<HostStream>,
    head_dim: usize,
}

impl HostEncoder {
    /// The layouts and codecs of `cache`'s streams, calibrated as far as `cache` is.
    pub(crate) fn new(cache: &KvCache) -> Self {
        let heads = cache.layout().kv_heads;
        let stream = |s: &tq_cache::stream::Stream| HostStream {
            layout: s.layout().clone(),
            codec: s.codec().clone(),
        };
        Self {
            keys: (0..heads).map(|h| stream(cache.keys(h))).collect(),
            values: (0..heads).map(|h| stream(cache.values(h))).collect(),
            head_dim: cache.layout().head_dim,
        }
    }

    /// The keys' codecs, one per KV head.
    pub(crate) fn key_codecs(&self) -> Vec<&TokenCodec> {
        self.keys.iter().map(|s| &s.codec).collect()
    }

    /// The values' codecs, one per KV head.
    pub(crate) fn value_codecs(&self) -> Vec<&TokenCodec> {
        self.values.iter().map(|s| &s.codec).collect()
    }

    /// The values' mean per KV head for a centered stream (`None` until chosen), empty when
    /// the values are not centered.
    pub(crate) fn value_means(&self) -> Vec<Option<&[f32]>> {
        if !self.values.iter().any(|s| s.layout.center.is_centered()) {
            return Vec::new();
        }
        self.values
            .iter()
            .map(|s| s.layout.mean.as_deref())
            .collect()
    }

    /// For `center = "rope"` keys (every KV head's, or none): each head's `m` (`None` until
    /// chosen: zeros); empty for keys without it.
    pub(crate) fn key_rope_means(&self) -> Vec<Option<&[f32]>> {
        if !self
            .keys
            .iter()
            .any(|s| s.layout.center.turns_with_position())
        {
            return Vec::new();
        }
        self.keys.iter().map(|s| s.layout.mean.as_deref()).collect()
    }

    /// For `center = "rope"` keys, the table of block angles covering token `t`
    /// ([`tq_cache::rope_center::center_angles`]); `None` for keys without it.
    pub(crate) fn key_center_angles(
        &self,
        t: usize,
    ) -> Option<std::sync::Arc<tq_cache::rope_center::CenterAngles>> {
        self.keys.first()?.layout.center_angles(t)
    }

    /// Whether every stream's codec and layout equals `cache`'s.
    pub(crate) fn matches(&self, cache: &KvCache) -> bool {
        self.keys.len() == cache.layout().kv_heads
            && self
                .keys
                .iter()
                .enumerate()
                .all(|(h, s)| s.layout == *cache.keys(h).layout())
            && self
                .values
                .iter()
                .enumerate()
                .all(|(h, s)| s.layout == *cache.values(h).layout())
    }

    /// Chooses the means, outlier channels and bases of every uncalibrated stream from the first
    /// batch `keys`, `values` (`[n, kv_heads, head_dim]`), per head as `KvCache::append` does
    /// (`query_energy`, per KV head, as `KvCache::append_with_queries` computes it, for a plane
    /// basis); whether anything changed.
    pub(crate) fn calibrate(
        &mut self,
        keys: &[f32],
        values: &[f32],
        query_energy: Option<&[Vec<f64>]>,
    ) -> Result<bool, GpuError> {
        let (d, heads) = (self.head_dim, self.keys.len());
        let mut changed = false;
        for (streams, data, is_key) in [
            (&mut self.keys, keys, true),
            (&mut self.values, values, false),
        ] {
            for (h, stream) in streams.iter_mut().enumerate() {
                let batch = tq_cache::kv_cache::head_rows(data, heads, d, h);
                // Queries score keys only (the allocation refuses planes on values).
                let query = query_energy
                    .filter(|_| is_key)
                    .and_then(|e| e.get(h))
                    .map(Vec::as_slice);
                changed |= stream.calibrate(&batch, query)?;
            }
        }
        Ok(changed)
    }

    /// Whether some stream has yet to calibrate (its records would be encoded with a mean,
    /// outlier channels or basis this encoder does not know).
    pub(crate) fn needs_calibration(&self) -> bool {
        self.keys
            .iter()
            .chain(&self.values)
            .any(|s| s.layout.needs_calibration())
    }

    /// Whether the next calibration fits a plane basis on some key stream (it then needs the
    /// queries' energy).
    pub(crate) fn needs_query_energy(&self) -> bool {
        self.keys.iter().any(|s| s.layout.needs_query_energy())
    }

    /// Forgets every chosen mean, outlier channel and basis (the cache was emptied); whether
    /// anything changed.
    pub(crate) fn forget_calibration(&mut self) -> Result<bool, GpuError> {
        let mut changed = false;
        for stream in self.keys.iter_mut().chain(&mut self.values) {
            changed |= stream.forget()?;
        }
        Ok(changed)
    }

    /// Encodes `x` (`[n, kv_heads, head_dim]`) with the keys' (`keys`) or values' codecs:
    /// records `[n, kv_heads, record_words]` and scales `[n, kv_heads, scales]`. With an 8-bit
    /// window the codes are those the CPU stream writes when the token leaves its window: of
    /// the 8-bit copy decoded (they depend on nothing that happens in between, so they go up
    /// with the token; the kernels read the copy while the token is in the window).
    /// `first_token`: the stream index of `x`'s first token (what a RoPE-centered stream
    /// turns its center by).
    pub(crate) fn encode(
        &self,
        keys: bool,
        x: &[f32],
        first_token: usize,
    ) -> Result<(Vec<u32>, Vec<f16>), GpuError> {
        let streams = if keys { &self.keys } else { &self.values };
        let first = &streams[0].codec;
        let through = if streams.iter().any(HostStream::defers_codes) {
            Some(self.window_codec(true)?)
        } else {
            None
        };
        self.encode_with(
            streams,
            x,
            first_token,
            |s| &s.codec,
            first,
            through.as_ref(),
        )
    }

    /// The window copies' codec: 8-bit (`q8`) or the sinks' binary16 (`fp`).
    fn window_codec(&self, q8: bool) -> Result<TokenCodec, GpuError> {
        let spec = if q8 {
            tq_cache::CodecSpec::Q8 { dim: self.head_dim }
        } else {
            self.keys[0].layout.fp
        };
        Ok(TokenCodec::new(&spec)?)
    }

    /// The copies of the attention sinks (the stream's `fp` codec, binary16 for the GPU) of the
    /// first `tokens` tokens of `x` (`[n, kv_heads, head_dim]`, its first token at stream index
    /// `first_token`): `[tokens, kv_heads, ⌈d/2⌉]` words.
    pub(crate) fn encode_sink_copies(
        &self,
        keys: bool,
        x: &[f32],
        first_token: usize,
        tokens: usize,
    ) -> Result<Vec<u32>, GpuError> {
        let streams = if keys { &self.keys } else { &self.values };
        let fp = TokenCodec::new(&streams[0].layout.fp)?;
        let width = streams.len() * self.head_dim;
        let x = &x[..(tokens * width).min(x.len())];
        Ok(self
            .encode_with(streams, x, first_token, |_| &fp, &fp, None)?
            .0)
    }

    /// The recent window's copies of every token of `x` (`[n, kv_heads, head_dim]`), 8-bit
    /// (`q8`, the layer's `recent_dtype`) or binary16: `[n, kv_heads, ring_words]` words, each
    /// copy's record followed by its scales, one per word.
    pub(crate) fn encode_ring_copies(
        &self,
        keys: bool,
        x: &[f32],
        first_token: usize,
        q8: bool,
    ) -> Result<Vec<u32>, GpuError> {
        let streams = if keys { &self.keys } else { &self.values };
        let codec = self.window_codec(q8)?;
        let (records, scales) =
            self.encode_with(streams, x, first_token, |_| &codec, &codec, None)?;
        Ok(ring_words_of(&codec, &records, &scales))
    }

    /// Encodes every vector of `x` with `codec(stream)` of its KV head's stream (`first`: the
    /// sizes), the stream's mean subtracted first as `Stream::push` does (a RoPE-centered
    /// stream's `c(t)`, `t` counted from `first_token`) — for a stream that
    /// defers its codes, through the 8-bit window codec `through` first (encoded, decoded,
    /// then encoded by the codec, as its token is when it leaves the window).
    fn encode_with<'a>(
        &self,
        streams: &'a [HostStream],
        x: &[f32],
        first_token: usize,
        codec: impl Fn(&'a HostStream) -> &'a TokenCodec,
        first: &TokenCodec,
        through: Option<&TokenCodec>,
    ) -> Result<(Vec<u32>, Vec<f16>), GpuError> {
        let d = self.head_dim;
        let (rw, sc) = (first.record_words(), first.scales_per_token());
        let vectors = x.len() / d;
        let mut records = vec![0u32; vectors * rw];
        let mut scales = vec![f16::ZERO; vectors * sc];
        let mut scratch = CodecScratch::new(d);
        let mut centered = vec![0.0f32; d];
        // One table of block angles covering the whole batch (RoPE-centered streams only).
        let last_token = first_token + (vectors / streams.len().max(1)).saturating_sub(1);
        let angles = streams
            .iter()
            .find_map(|s| s.layout.center_angles(last_token));
        let mut copy = through.map(|c| {
            (
                vec![0u32; c.record_words()],
                vec![f16::ZERO; c.scales_per_token()],
                vec![0.0f32; d],
            )
        });
        for (v, vector) in x.chunks_exact(d).enumerate() {
            let stream = &streams[v % streams.len()];
            // A centered stream stores `x − μ` (body and copies), computed as `Stream::push` does;
            // a RoPE-centered one `x − c(t)`.
            let stored = match (&stream.layout.mean, &angles) {
                (Some(mean), Some(angles)) if stream.layout.center.turns_with_position() => {
                    let t = first_token + v / streams.len();
                    let pairs = stream.layout.rope_pairs;
                    tq_cache::rope_center::center_at(mean, t, pairs, angles, &mut centered);
                    for (c, &a) in centered.iter_mut().zip(vector) {
                        *c = a - *c;
                    }
                    &centered[..]
                }
                (Some(mean), _) => {
                    for ((c, &a), &m) in centered.iter_mut().zip(vector).zip(mean) {
                        *c = a - m;
                    }
                    &centered[..]
                }
                (None, _) => vector,
            };
            let stored = match (through, &mut copy) {
                (Some(window), Some((record, halves, decoded))) if stream.defers_codes() => {
                    window.encode_into(stored, &mut scratch, record, halves)?;
                    window.decode_into(record, halves, &mut scratch, decoded)?;
                    &decoded[..]
                }
                _ => stored,
            };
            codec(stream).encode_into(
                stored,
                &mut scratch,
                &mut records[v * rw..(v + 1) * rw],
                &mut scales[v * sc..(v + 1) * sc],
            )?;
        }
        Ok((records, scales))
    }
}

/// Records `[n, record_words]` and scales `[n, scales]` of `codec` as ring copies
/// (`[n, ring_words]`).
pub(crate) fn ring_words_of(codec: &TokenCodec, records: &[u32], scales: &[f16]) -> Vec<u32> {
    let (rw, sc) = (codec.record_words(), codec.scales_per_token());
    let n = records.len() / rw.max(1);
    let mut out = Vec::with_capacity(n * (rw + sc));
    for i in 0..n {
        out.extend_from_slice(&records[i * rw..(i + 1) * rw]);
        out.extend(
            scales[i * sc..(i + 1) * sc]
                .iter()
                .map(|h| u32::from(h.to_bits())),
        );
    }
    out
}
