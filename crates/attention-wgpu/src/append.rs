//! Appending to a [`GpuKvCache`]: encode new vectors on the GPU (`encode.wgsl`) or take
//! records the CPU encoded, then scatter them into the pages (`scatter.wgsl`) — one upload of
//! the new tokens and one submit per call, nothing read back.

use std::sync::Arc;

use half::f16;
use tq_cache::kv_cache::KvCache;

use crate::cache::GpuKvCache;
use crate::error::GpuError;
use crate::host_encode::HostEncoder;
use crate::kernels::encode::{self, EncodeParams};
use crate::kernels::scatter::{self, ScatterParams};
use crate::kernels::{KIND_F16, KIND_F32, Kernel};
use crate::tables::{StreamKind, StreamLayoutGpu};

/// A batch encoded on the host and not yet appended ([`GpuKvCache::encode_on_host`]): records
/// and scales `[n, kv_heads, …]`, binary16 sink copies of its first `sink_copies` tokens, ring
/// copies of every token with a recent window (`[n, kv_heads, ring_words]`), and the encoder an
/// empty cache calibrated on it.
pub(crate) struct HostBatch {
    key_records: Vec<u32>,
    key_scales: Vec<f16>,
    value_records: Vec<u32>,
    value_scales: Vec<f16>,
    key_sinks: Vec<u32>,
    value_sinks: Vec<u32>,
    sink_copies: usize,
    key_ring: Vec<u32>,
    value_ring: Vec<u32>,
    pub(crate) calibrated: Option<HostEncoder>,
}

/// Encoded tokens handed over from the CPU: `records` `[tokens, kv_heads, record_words]` and
/// `scales` `[tokens, kv_heads, scales_per_token]`, in the layout of `tq_cache::TokenCodec`.
#[derive(Clone, Copy, Debug)]
pub struct EncodedTokens<'a> {
    /// Packed records.
    pub records: &'a [u32],
    /// f16 scales (norms, then γ for TQ_prod).
    pub scales: &'a [f16],
}

impl GpuKvCache {
    /// Checks the positions of `n` new tokens: non-decreasing from the last one plus one, as
    /// `KvCache::append` requires.
    fn check_positions(&self, positions: &[u32]) -> Result<(), GpuError> {
        let mut expected = self
            .len
            .checked_sub(1)
            .and_then(|t| self.slot_of(t))
            .map(|s| self.positions[s] + 1);
        for &p in positions {
            if let Some(e) = expected
                && p < e
            {
                return Err(tq_cache::CacheError::PositionGap {
                    expected: e,
                    got: p,
                }
                .into());
            }
            expected = Some(p + 1);
        }
        Ok(())
    }

    fn stream(&self, which: StreamKind) -> &StreamLayoutGpu {
        match which {
            StreamKind::Keys => &self.key,
            StreamKind::Values => &self.value,
        }
    }

    /// Rejects what the CPU codec would reject: wrong length, non-finite values, a norm (or,
    /// for f16, a value) beyond the largest f16.
    fn check_vectors(&self, which: StreamKind, x: &[f32]) -> Result<usize, GpuError> {
        let d = self.head_dim;
        let width = self.kv_heads * d;
        if !x.len().is_multiple_of(width) {
            return Err(GpuError::Shape {
                what: "vectors [tokens, kv_heads, head_dim]",
                expected: width,
                actual: x.len(),
            });
        }
        let max = f16::MAX.to_f32();
        let kind = self.stream(which).desc.kind;
        for (v, chunk) in x.chunks_exact(d).enumerate() {
            if let Some(i) = chunk.iter().position(|a| !a.is_finite()) {
                return Err(tq_cache::codec::CodecError::NonFinite {
                    index: v * d + i,
                    value: chunk[i],
                }
                .into());
            }
            match kind {
                KIND_F32 => {}
                KIND_F16 => {
                    if let Some(&big) = chunk.iter().find(|a| a.abs() > max) {
                        return Err(
                            tq_cache::codec::CodecError::NormOutOfRange { norm: big }.into()
                        );
                    }
                }
                _ => {
                    let norm = chunk
                        .iter()
                        .map(|&a| f64::from(a) * f64::from(a))
                        .sum::<f64>()
                        .sqrt();
                    if norm > f64::from(max) {
                        return Err(tq_cache::codec::CodecError::NormOutOfRange {
                            norm: norm as f32,
                        }
                        .into());
                    }
                }
            }
        }
        Ok(x.len() / width)
    }

    /// Checks a batch of new tokens — `keys` and `values` `[n, kv_heads, head_dim]` as
    /// [`check_vectors`](Self::check_vectors) wants them, `n` positions continuing the
    /// cache's — and returns `n`.
    pub(crate) fn check_batch(
        &self,
        keys: &[f32],
        values: &[f32],
        positions: &[u32],
    ) -> Result<usize, GpuError> {
        let n = self.check_vectors(StreamKind::Keys, keys)?;
        let nv = self.check_vectors(StreamKind::Values, values)?;
        if n != positions.len() || nv != n {
            return Err(GpuError::Shape {
                what: "tokens (positions, keys, values)",
                expected: positions.len(),
                actual: n.min(nv),
            });
        }
        self.check_positions(positions)?;
        Ok(n)
    }

    /// Records the encode dispatch of `n·kv_heads` vectors already in `input`.
    fn record_encode(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        which: StreamKind,
        vectors: usize,
        input: &wgpu::Buffer,
        records: &wgpu::Buffer,
        scales: &wgpu::Buffer,
    ) -> Result<(), GpuError> {
        let grid = self.ctx.grid(vectors)?;
        let params = EncodeParams {
            desc: self.stream(which).desc,
            vectors: vectors as u32,
            kv_heads: self.kv_heads as u32,
            grid_x: grid.x,
            grid_y: grid.y,
        };
        let params = self
            .ctx
            .uniform_init("encode params", bytemuck::bytes_of(&params));
        let group = encode::bind_group(&self.ctx, &params, input, &self.tables, records, scales);
        let pipeline = self.ctx.pipeline(Kernel::Encode, 0)?;
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some("encode"),
            timestamp_writes: None,
        });
        self.ctx.dispatch(&mut pass, &pipeline, &group, grid);
        Ok(())
    }

    /// Encodes `x` (`[tokens, kv_heads, head_dim]`) with the keys' or values' codec on the GPU
    /// and reads the records back (`[tokens, kv_heads, record_words]`, `[tokens, kv_heads,
    /// scales]`), without appending: what the tests compare with the CPU codec.
    pub fn encode_records(
        &mut self,
        which: StreamKind,
        x: &[f32],
    ) -> Result<(Vec<u32>, Vec<f16>), GpuError> {
        if self.host.is_some() {
            return Err(GpuError::Unsupported(
                "the encode kernel on a cache whose streams are encoded on the host (two-tier \
                 codecs)"
                    .into(),
            ));
        }
        let n = self.check_vectors(which, x)?;
        let vectors = n * self.kv_heads;
        let (record_words, per_token) = {
            let stream = self.stream(which);
            (stream.record_words, stream.scales)
        };
        let ctx = Arc::clone(&self.ctx);
        let input = self.scratch.get(&ctx, "encode input", 4 * x.len() as u64);
        let records =
            self.scratch
                .get(&ctx, "encoded records", 4 * (vectors * record_words) as u64);
        let scales = self
            .scratch
            .get(&ctx, "encoded scales", 4 * (vectors * per_token) as u64);
        ctx.write(&input, 0, bytemuck::cast_slice(x));
        ctx.submit("encode", |encoder| {
            self.record_encode(encoder, which, vectors, &input, &records, &scales)
        })?;
        let words: Vec<u32> = bytemuck::pod_collect_to_vec(&ctx.read(
            &records,
            0,
            4 * (vectors * record_words) as u64,
        )?);
        let halves: Vec<u32> = bytemuck::pod_collect_to_vec(&ctx.read(
            &scales,
            0,
            4 * (vectors * per_token) as u64,
        )?);
        Ok((
            words,
            halves.iter().map(|&h| f16::from_bits(h as u16)).collect(),
        ))
    }

    /// Appends `n` tokens encoded on the GPU: `keys` and `values` `[n, kv_heads, head_dim]`,
    /// `positions` `[n]`. One upload of the new vectors, one submit; nothing is read back.
    /// Two-tier streams, which the encode kernel does not implement, are encoded on the host
    /// with the CPU codecs and their records uploaded instead.
    pub fn encode_and_append(
        &mut self,
        keys: &[f32],
        values: &[f32],
        positions: &[u32],
    ) -> Result<(), GpuError> {
        let n = self.check_batch(keys, values, positions)?;
        if n == 0 {
            return Ok(());
        }
        if self.host.is_some() {
            return self.encode_on_host_and_append(keys, values, positions);
        }
        let vectors = n * self.kv_heads;
        let ctx = Arc::clone(&self.ctx);
        // Sizes only (a stream's layout also holds its bit planes: not copied per step).
        let (key_words, key_scales) = (self.key.record_words, self.key.scales);
        let (value_words, value_scales) = (self.value.record_words, self.value.scales);
        let kin = self.scratch.get(&ctx, "key input", 4 * keys.len() as u64);
        let vin = self
            .scratch
            .get(&ctx, "value input", 4 * values.len() as u64);
        let kr = self
            .scratch
            .get(&ctx, "key records", 4 * (vectors * key_words) as u64);
        let ks = self
            .scratch
            .get(&ctx, "key scales", 4 * (vectors * key_scales) as u64);
        let vr = self
            .scratch
            .get(&ctx, "value records", 4 * (vectors * value_words) as u64);
        let vs = self
            .scratch
            .get(&ctx, "value scales", 4 * (vectors * value_scales) as u64);
        ctx.write(&kin, 0, bytemuck::cast_slice(keys));
        ctx.write(&vin, 0, bytemuck::cast_slice(values));
        self.scatter(positions, |this, encoder| {
            this.record_encode(encoder, StreamKind::Keys, vectors, &kin, &kr, &ks)?;
            this.record_encode(encoder, StreamKind::Values, vectors, &vin, &vr, &vs)?;
            Ok([kr.clone(), ks.clone(), vr.clone(), vs.clone()])
        })
    }

    /// Encodes a checked batch (`keys`, `values` `[n, kv_heads, head_dim]`) on the host without
    /// changing the cache: an empty cache calibrates on the batch first (with `query_energy`
    /// for a plane basis), into an encoder returned for [`commit_calibration`]
    /// (Self::commit_calibration); records and scales of every token, and the full-precision
    /// copies this cache keeps (every token with a recent window, else the batch's sink
    /// tokens). Every encoding error comes from here, before anything is appended.
    pub(crate) fn encode_on_host(
        &self,
        keys: &[f32],
        values: &[f32],
        query_energy: Option<&[Vec<f64>]>,
    ) -> Result<HostBatch, GpuError> {
        let Some(host) = &self.host else {
            return Err(GpuError::Unsupported(
                "host encoding on a cache whose streams the encode kernel takes".into(),
            ));
        };
        let mut calibrated = None;
        if self.len == 0 {
            let mut fresh = host.clone();
            if fresh.calibrate(keys, values, query_energy)? {
                calibrated = Some(fresh);
            }
        }
        let encoder = calibrated.as_ref().unwrap_or(host);
        // The batch's first token is the stream's next index (what a RoPE center turns by).
        let t0 = self.len;
        let (key_records, key_scales) = encoder.encode(true, keys, t0)?;
        let (value_records, value_scales) = encoder.encode(false, values, t0)?;
        let n = keys.len() / (self.kv_heads * self.head_dim).max(1);
        let sink_copies = self.sinks.saturating_sub(self.len).min(n);
        let (key_sinks, value_sinks) = if sink_copies > 0 {
            (
                encoder.encode_sink_copies(true, keys, t0, sink_copies)?,
                encoder.encode_sink_copies(false, values, t0, sink_copies)?,
            )
        } else {
            (Vec::new(), Vec::new())
        };
        let (key_ring, value_ring) = if self.windows.any() {
            (
                encoder.encode_ring_copies(true, keys, t0, self.window_q8)?,
                encoder.encode_ring_copies(false, values, t0, self.window_q8)?,
            )
        } else {
            (Vec::new(), Vec::new())
        };
        Ok(HostBatch {
            key_records,
            key_scales,
            value_records,
            value_scales,
            key_sinks,
            value_sinks,
            sink_copies,
            key_ring,
            value_ring,
            calibrated,
        })
    }

    /// Takes the encoder an empty cache calibrated on its first batch (if any), with tables
    /// built before anything is replaced.
    pub(crate) fn commit_calibration(
        &mut self,
        calibrated: Option<HostEncoder>,
    ) -> Result<(), GpuError> {
        if let Some(fresh) = calibrated {
            let (key, value, tables) = self.tables_for(&fresh)?;
            (self.key, self.value, self.tables) = (key, value, tables);
            self.host = Some(fresh);
        }
        Ok(())
    }

    /// Appends tokens `range` of a host-encoded batch (`positions`: theirs, checked) with
    /// their full-precision copies. Heavy hitters: the tokens no query of the batch reads in a
    /// window are decided first, while the ring still holds their copies (`settle`: the length
    /// whose windows end them — the cache's own for a batch whose queries follow — and whether
    /// the kernels read the decisions at once; `GpuKvCache::settle_kept`).
    pub(crate) fn append_host_batch(
        &mut self,
        batch: &HostBatch,
        range: std::ops::Range<usize>,
        positions: &[u32],
        (settle_at, publish): (usize, bool),
    ) -> Result<(), GpuError> {
        self.settle_kept(settle_at, publish)?;
        let heads = self.kv_heads;
        let (kw, vw) = (
            heads * self.key.record_words,
            heads * self.value.record_words,
        );
        let (ks, vs) = (heads * self.key.scales, heads * self.value.scales);
        let words = heads * self.head_dim.div_ceil(2);
        for i in range.start..range.end.min(batch.sink_copies) {
            self.write_sink_copies(
                self.len + i - range.start,
                &batch.key_sinks[i * words..(i + 1) * words],
                &batch.value_sinks[i * words..(i + 1) * words],
            );
        }
        if self.windows.any() {
            self.ensure_ring(self.len + range.len())?;
            let words = heads * self.ring_words();
            self.write_ring_copies(
                self.len,
                &batch.key_ring[range.start * words..range.end * words],
                &batch.value_ring[range.start * words..range.end * words],
            );
        }
        let first = self.len;
        self.append_records(
            EncodedTokens {
                records: &batch.key_records[range.start * kw..range.end * kw],
                scales: &batch.key_scales[range.start * ks..range.end * ks],
            },
            EncodedTokens {
                records: &batch.value_records[range.start * vw..range.end * vw],
                scales: &batch.value_scales[range.start * vs..range.end * vs],
            },
            positions,
        )?;
        self.track_kept(first, range.len());
        Ok(())
    }

    /// [`encode_and_append`](Self::encode_and_append) for a cache with host-encoded streams
    /// (checked input): an empty cache first calibrates on this batch, as the CPU cache does,
    /// and keeps the calibration only if the batch encodes.
    fn encode_on_host_and_append(
        &mut self,
        keys: &[f32],
        values: &[f32],
        positions: &[u32],
    ) -> Result<(), GpuError> {
        // No queries here: a plane basis stays on the plain codec, as `KvCache::append`.
        let mut batch = self.encode_on_host(keys, values, None)?;
        self.commit_calibration(batch.calibrated.take())?;
        // No query reads this batch: tokens it pushes out of a window are decided with the
        // counts they have (the CPU stream decides them at its next step, with the same).
        let settle_at = self.len + positions.len();
        self.append_host_batch(&batch, 0..positions.len(), positions, (settle_at, true))
    }

    /// Appends `n` tokens encoded on the CPU (`tq_cache::TokenCodec::encode_into`), e.g. the
    /// newest records of the CPU cache: one token's records per decode step.
    ///
    /// Records alone cannot make the full-precision copies of attention sinks or of a recent
    /// window, nor tell an uncalibrated copy the mean, outlier channels or basis they were
    /// encoded with: on a cache with a window, for tokens that would be sinks, and on streams
    /// not calibrated yet, this is refused (`Unsupported`); append them with
    /// [`encode_and_append`](Self::encode_and_append) or [`sync_from`](Self::sync_from).
    pub fn append_encoded(
        &mut self,
        keys: EncodedTokens<'_>,
        values: EncodedTokens<'_>,
        positions: &[u32],
    ) -> Result<(), GpuError> {
        if (self.len < self.sinks || self.windows.any()) && !positions.is_empty() {
            return Err(GpuError::Unsupported(
                "records without the full-precision copies of attention sinks or a recent \
                 window"
                    .into(),
            ));
        }
        // Records of streams whose mean, outlier channels or basis this copy has not chosen
        // would be read with the wrong tables.
        if self
            .host
            .as_ref()
            .is_some_and(HostEncoder::needs_calibration)
            && !positions.is_empty()
        {
            return Err(GpuError::Unsupported(
                "records of streams this copy has not calibrated yet (mean, outlier channels, \
                 basis): append them with encode_and_append or sync_from"
                    .into(),
            ));
        }
        self.append_records(keys, values, positions)
    }

    /// [`append_encoded`](Self::append_encoded) without the sink check (the caller wrote
    /// the copies).
    fn append_records(
        &mut self,
        keys: EncodedTokens<'_>,
        values: EncodedTokens<'_>,
        positions: &[u32],
    ) -> Result<(), GpuError> {
        let n = positions.len();
        let vectors = n * self.kv_heads;
        for (what, got, expected) in [
            (
                "key records",
                keys.records.len(),
                vectors * self.key.record_words,
            ),
            ("key scales", keys.scales.len(), vectors * self.key.scales),
            (
                "value records",
                values.records.len(),
                vectors * self.value.record_words,
            ),
            (
                "value scales",
                values.scales.len(),
                vectors * self.value.scales,
            ),
        ] {
            if got != expected {
                return Err(GpuError::Shape {
                    what,
                    expected,
                    actual: got,
                });
            }
        }
        self.check_positions(positions)?;
        if n == 0 {
            return Ok(());
        }
        let ctx = Arc::clone(&self.ctx);
        let widen = |s: &[f16]| -> Vec<u32> { s.iter().map(|h| u32::from(h.to_bits())).collect() };
        let buffers = [
            (
                "key records",
                bytemuck::cast_slice::<u32, u8>(keys.records).to_vec(),
            ),
            (
                "key scales",
                bytemuck::cast_slice(&widen(keys.scales)).to_vec(),
            ),
            (
                "value records",
                bytemuck::cast_slice(values.records).to_vec(),
            ),
            (
                "value scales",
                bytemuck::cast_slice(&widen(values.scales)).to_vec(),
            ),
        ]
        .map(|(name, bytes)| {
            let buffer = self.scratch.get(&ctx, name, bytes.len() as u64);
            ctx.write(&buffer, 0, &bytes);
            buffer
        });
        self.scatter(positions, |_, _| Ok(buffers))
    }

    /// Appends the CPU cache's tokens this GPU cache does not hold yet (`self.len()..cache.len()`),
    /// uploading their records: the decode-step path when the CPU cache encodes. `cache` must
    /// keep the sinks and windows this copy was built with ([`GpuError::Unsupported`]).
    pub fn sync_from(&mut self, cache: &KvCache) -> Result<(), GpuError> {
        if cache.len() < self.len {
            return Err(GpuError::Shape {
                what: "CPU cache length (behind the GPU copy)",
                expected: self.len,
                actual: cache.len(),
            });
        }
        crate::cache::check_windows(cache, self.sinks, &self.windows, self.window_q8)?;
        self.adopt_calibration(cache, false)?;
        let tokens: Vec<usize> = (self.len..cache.len()).collect();
        let mut positions = Vec::with_capacity(tokens.len());
        let mut key_records = Vec::new();
        let mut key_scales = Vec::new();
        let mut value_records = Vec::new();
        let mut value_scales = Vec::new();
        // The CPU stream shows the copies of its window only: tokens synced before it get none,
        // so this copy cannot rewind into them.
        self.windows.followed(self.len, cache.len());
        self.upload_copies(cache, self.len)?;
        let mut scratch = tq_cache::codec::CodecScratch::new(self.head_dim);
        for &t in &tokens {
            positions.push(cache.position(t).ok_or(GpuError::Shape {
                what: "stored token",
                expected: t,
                actual: cache.first_stored(),
            })?);
            for h in 0..self.kv_heads {
                for (stream, records, scales) in [
                    (cache.keys(h), &mut key_records, &mut key_scales),
                    (cache.values(h), &mut value_records, &mut value_scales),
                ] {
                    // The body record (`token` would name a sink's full-precision copy), or
                    // the codes an 8-bit window's token will have.
                    let (record, halves) = crate::cache::stored_codes(stream, t, &mut scratch)?;
                    records.extend_from_slice(&record);
                    scales.extend_from_slice(&halves);
                }
            }
        }
        self.append_records(
            EncodedTokens {
                records: &key_records,
                scales: &key_scales,
            },
            EncodedTokens {
                records: &value_records,
                scales: &value_scales,
            },
            &positions,
        )?;
        // The CPU stream decided its heavy hitters: take its decisions and tallies.
        self.mirror_kept(cache)
    }

    /// Records `produce` (which returns the new key records, key scales, value records, value
    /// scales buffers) and the scatter dispatches into every touched page, submits, and
    /// advances the cache by `positions.len()` tokens.
    fn scatter(
        &mut self,
        positions: &[u32],
        produce: impl FnOnce(&Self, &mut wgpu::CommandEncoder) -> Result<[wgpu::Buffer; 4], GpuError>,
    ) -> Result<(), GpuError> {
        let n = positions.len();
        let first_token = self.len;
        let new_len = first_token + n;
        // A forward call records its step's windows after its appends.
        self.step_windows = None;
        let ring_slots = self.ring_slots;
        let slot_of = move |t: usize| ring_slots.map_or(t, |r| t % r);
        let written = ring_slots.map_or(new_len, |r| new_len.min(r));
        self.ensure_slots(written);
        let touched: Vec<usize> = (0..self.pages.len())
            .filter(|&i| {
                let p = &self.pages[i];
                (first_token..new_len).any(|t| {
                    let s = slot_of(t);
                    s >= p.first_slot && s < p.first_slot + p.tokens
                })
            })
            .collect();
        let ctx = Arc::clone(&self.ctx);
        let vectors = n * self.kv_heads;
        let grid = ctx.grid(vectors)?;
        let align = (size_of::<ScatterParams>() as u64).next_multiple_of(ctx.uniform_alignment());
        let mut params = vec![0u8; (align as usize) * 2 * touched.len().max(1)];
        for (k, &i) in touched.iter().enumerate() {
            let page = &self.pages[i];
            for (s, stream) in [(0usize, &self.key), (1, &self.value)] {
                let p = ScatterParams {
                    vectors: vectors as u32,
                    kv_heads: self.kv_heads as u32,
                    record_words: stream.record_words as u32,
                    scales: stream.scales as u32,
                    first_slot: slot_of(first_token) as u32,
                    ring_slots: self.ring_slots.unwrap_or(0) as u32,
                    page_first_slot: page.first_slot as u32,
                    page_tokens: page.tokens as u32,
                    scales_offset: if s == 0 {
                        page.layout.k_scales_offset
                    } else {
                        page.layout.v_scales_offset
                    } as u32,
                    write_positions: u32::from(s == 0),
                    positions_offset: page.layout.k_positions_offset as u32,
                    grid_x: grid.x,
                    grid_y: grid.y,
                    skip_tokens: ring_slots.map_or(0, |r| n.saturating_sub(r)) as u32,
                    order: stream.desc.order,
                    planes_offset: stream.desc.planes_offset,
                };
                let at = (2 * k + s) * align as usize;
                params[at..at + size_of::<ScatterParams>()].copy_from_slice(bytemuck::bytes_of(&p));
            }
        }
        let params = ctx.uniform_init("scatter params", &params);
        let pos = self.scratch.get(&ctx, "new positions", 4 * n as u64);
        ctx.write(&pos, 0, bytemuck::cast_slice(positions));
        let pipeline = ctx.pipeline(Kernel::Scatter, 0)?;
        ctx.submit("append", |encoder| {
            let [kr, ks, vr, vs] = produce(self, encoder)?;
            let groups: Vec<wgpu::BindGroup> = touched
                .iter()
                .enumerate()
                .flat_map(|(k, &i)| {
                    let page = &self.pages[i];
                    [
                        scatter::bind_group(
                            &ctx,
                            &params,
                            (2 * k) as u64 * align,
                            &kr,
                            &ks,
                            &page.keys,
                            &pos,
                            &self.tables,
                        ),
                        scatter::bind_group(
                            &ctx,
                            &params,
                            (2 * k + 1) as u64 * align,
                            &vr,
                            &vs,
                            &page.values,
                            &pos,
                            &self.tables,
                        ),
                    ]
                })
                .collect();
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("scatter"),
                timestamp_writes: None,
            });
            for group in &groups {
                ctx.dispatch(&mut pass, &pipeline, group, grid);
            }
            Ok(())
        })?;
        for (t, &p) in (first_token..new_len).zip(positions) {
            let s = slot_of(t);
            if s == self.positions.len() {
                self.positions.push(p);
            } else {
                self.positions[s] = p;
            }
        }
        self.len = new_len;
        if let Some(ring) = self.ring_slots {
            self.first_stored = self.first_stored.max(new_len.saturating_sub(ring));
        }
        self.windows.appended(new_len);
        Ok(())
    }
}
