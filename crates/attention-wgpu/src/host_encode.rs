//! [`HostEncoder`]: encoding on the CPU for the streams the encode kernel does not implement
//! (two-tier codecs), with the CPU cache's calibration.
//!
//! A two-tier stream chooses its outlier channels from its first appended batch, per KV head
//! (`tq_cache::two_tier::select_outlier_channels`), and chooses again after a rewind to empty.
//! The encoder keeps each head's stream layout and codec and does exactly that, so a GPU cache
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
    /// Chooses the outlier channels from `batch` (`[n, head_dim]`) if the stream has none yet;
    /// whether the codec changed.
    fn calibrate(&mut self, batch: &[f32], head_dim: usize) -> Result<bool, GpuError> {
        let Some(plan) = self.layout.outliers else {
            return Ok(false);
        };
        if self.layout.channels.is_some() {
            return Ok(false);
        }
        let channels = tq_cache::two_tier::select_outlier_channels(batch, head_dim, plan.channels)
            .map_err(tq_cache::CacheError::from)?;
        let mut layout = self.layout.clone();
        layout.channels = Some(channels);
        self.codec = layout.build_codec()?;
        self.layout = layout;
        Ok(true)
    }

    /// Forgets chosen outlier channels (as an emptied CPU stream does); whether the codec changed.
    fn forget(&mut self) -> Result<bool, GpuError> {
        if self.layout.outliers.is_none() || self.layout.channels.is_none() {
            return Ok(false);
        }
        self.layout.channels = None;
        self.codec = self.layout.build_codec()?;
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

    /// Chooses the outlier channels of every uncalibrated stream from the first batch `keys`,
    /// `values` (`[n, kv_heads, head_dim]`), per head as `KvCache::append` does; whether any
    /// codec changed.
    pub(crate) fn calibrate(&mut self, keys: &[f32], values: &[f32]) -> Result<bool, GpuError> {
        let (d, heads) = (self.head_dim, self.keys.len());
        let mut changed = false;
        for (streams, data) in [(&mut self.keys, keys), (&mut self.values, values)] {
            for (h, stream) in streams.iter_mut().enumerate() {
                let batch: Vec<f32> = data
                    .chunks_exact(d)
                    .skip(h)
                    .step_by(heads)
                    .flatten()
                    .copied()
                    .collect();
                changed |= stream.calibrate(&batch, d)?;
            }
        }
        Ok(changed)
    }

    /// Forgets every chosen outlier channel (the cache was emptied); whether any codec changed.
    pub(crate) fn forget_calibration(&mut self) -> Result<bool, GpuError> {
        let mut changed = false;
        for stream in self.keys.iter_mut().chain(&mut self.values) {
            changed |= stream.forget()?;
        }
        Ok(changed)
    }

    /// Encodes `x` (`[n, kv_heads, head_dim]`) with the keys' (`keys`) or values' codecs:
    /// records `[n, kv_heads, record_words]` and scales `[n, kv_heads, scales]`.
    pub(crate) fn encode(&self, keys: bool, x: &[f32]) -> Result<(Vec<u32>, Vec<f16>), GpuError> {
        let streams = if keys { &self.keys } else { &self.values };
        let d = self.head_dim;
        let first = &streams[0].codec;
        let (rw, sc) = (first.record_words(), first.scales_per_token());
        let vectors = x.len() / d;
        let mut records = vec![0u32; vectors * rw];
        let mut scales = vec![f16::ZERO; vectors * sc];
        let mut scratch = CodecScratch::new(d);
        for (v, vector) in x.chunks_exact(d).enumerate() {
            streams[v % streams.len()].codec.encode_into(
                vector,
                &mut scratch,
                &mut records[v * rw..(v + 1) * rw],
                &mut scales[v * sc..(v + 1) * sc],
            )?;
        }
        Ok((records, scales))
    }
}
