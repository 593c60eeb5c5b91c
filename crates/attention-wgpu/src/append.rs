//! Appending to a [`GpuKvCache`]: encode new vectors on the GPU (`encode.wgsl`) or take
//! records the CPU encoded, then scatter them into the pages (`scatter.wgsl`) — one upload of
//! the new tokens and one submit per call, nothing read back.

use std::sync::Arc;

use half::f16;
use tq_cache::kv_cache::KvCache;

use crate::cache::GpuKvCache;
use crate::error::GpuError;
use crate::kernels::encode::{self, EncodeParams};
use crate::kernels::scatter::{self, ScatterParams};
use crate::kernels::{KIND_F16, KIND_F32, Kernel};
use crate::tables::{StreamKind, StreamLayoutGpu};

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
    pub(crate) fn check_vectors(&self, which: StreamKind, x: &[f32]) -> Result<usize, GpuError> {
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
        let stream = *self.stream(which);
        let ctx = Arc::clone(&self.ctx);
        let input = self.scratch.get(&ctx, "encode input", 4 * x.len() as u64);
        let records = self.scratch.get(
            &ctx,
            "encoded records",
            4 * (vectors * stream.record_words) as u64,
        );
        let scales = self
            .scratch
            .get(&ctx, "encoded scales", 4 * (vectors * stream.scales) as u64);
        ctx.write(&input, 0, bytemuck::cast_slice(x));
        ctx.submit("encode", |encoder| {
            self.record_encode(encoder, which, vectors, &input, &records, &scales)
        })?;
        let words: Vec<u32> = bytemuck::pod_collect_to_vec(&ctx.read(
            &records,
            0,
            4 * (vectors * stream.record_words) as u64,
        )?);
        let halves: Vec<u32> = bytemuck::pod_collect_to_vec(&ctx.read(
            &scales,
            0,
            4 * (vectors * stream.scales) as u64,
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
        if n == 0 {
            return Ok(());
        }
        if self.host.is_some() {
            return self.encode_on_host_and_append(keys, values, positions);
        }
        let vectors = n * self.kv_heads;
        let ctx = Arc::clone(&self.ctx);
        let (key, value) = (self.key, self.value);
        let kin = self.scratch.get(&ctx, "key input", 4 * keys.len() as u64);
        let vin = self
            .scratch
            .get(&ctx, "value input", 4 * values.len() as u64);
        let kr = self
            .scratch
            .get(&ctx, "key records", 4 * (vectors * key.record_words) as u64);
        let ks = self
            .scratch
            .get(&ctx, "key scales", 4 * (vectors * key.scales) as u64);
        let vr = self.scratch.get(
            &ctx,
            "value records",
            4 * (vectors * value.record_words) as u64,
        );
        let vs = self
            .scratch
            .get(&ctx, "value scales", 4 * (vectors * value.scales) as u64);
        ctx.write(&kin, 0, bytemuck::cast_slice(keys));
        ctx.write(&vin, 0, bytemuck::cast_slice(values));
        self.scatter(positions, |this, encoder| {
            this.record_encode(encoder, StreamKind::Keys, vectors, &kin, &kr, &ks)?;
            this.record_encode(encoder, StreamKind::Values, vectors, &vin, &vr, &vs)?;
            Ok([kr.clone(), ks.clone(), vr.clone(), vs.clone()])
        })
    }

    /// Calibrates the host-encoded streams of an empty cache on a first batch (`keys`,
    /// `values` `[n, kv_heads, head_dim]`) and rebuilds the tables if anything was chosen.
    pub(crate) fn calibrate_on_host(
        &mut self,
        keys: &[f32],
        values: &[f32],
        query_energy: Option<&[Vec<f64>]>,
    ) -> Result<(), GpuError> {
        let Some(host) = &self.host else {
            return Ok(());
        };
        let mut fresh = host.clone();
        if fresh.calibrate(keys, values, query_energy)? {
            self.host = Some(fresh);
            self.rebuild_tables()?;
        }
        Ok(())
    }

    /// [`encode_and_append`](Self::encode_and_append) for a cache with host-encoded streams
    /// (checked input): an empty cache first chooses its outlier channels from this batch, as
    /// the CPU cache does, and keeps them only if the batch encodes.
    fn encode_on_host_and_append(
        &mut self,
        keys: &[f32],
        values: &[f32],
        positions: &[u32],
    ) -> Result<(), GpuError> {
        let Some(host) = &self.host else {
            return Ok(());
        };
        let mut calibrated = None;
        if self.len == 0 {
            let mut fresh = host.clone();
            // No queries here: a plane basis stays on the plain codec, as `KvCache::append`.
            if fresh.calibrate(keys, values, None)? {
                calibrated = Some(fresh);
            }
        }
        let encoder = calibrated.as_ref().unwrap_or(host);
        let (key_records, key_scales) = encoder.encode(true, keys)?;
        let (value_records, value_scales) = encoder.encode(false, values)?;
        let first = self.len;
        // Full-precision copies: of the batch's sink tokens, or of the whole batch with a
        // recent window (`write_copies` keeps what the ring holds).
        let copied = if self.recent > 0 {
            positions.len()
        } else {
            self.sinks.saturating_sub(first).min(positions.len())
        };
        let copies = if copied > 0 {
            Some((
                encoder.encode_copies(true, keys, copied)?,
                encoder.encode_copies(false, values, copied)?,
            ))
        } else {
            None
        };
        if let Some(fresh) = calibrated {
            self.host = Some(fresh);
            self.rebuild_tables()?;
        }
        if let Some((k, v)) = copies {
            self.write_copies(first, &k, &v);
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
            positions,
        )
    }

    /// Appends `n` tokens encoded on the CPU (`tq_cache::TokenCodec::encode_into`), e.g. the
    /// newest records of the CPU cache: one token's records per decode step.
    ///
    /// Records alone cannot make the full-precision copies of attention sinks or of a recent
    /// window: on a cache with a window, and for tokens that would be sinks, this is refused
    /// (`Unsupported`); append them with [`encode_and_append`](Self::encode_and_append) or
    /// [`sync_from`](Self::sync_from).
    pub fn append_encoded(
        &mut self,
        keys: EncodedTokens<'_>,
        values: EncodedTokens<'_>,
        positions: &[u32],
    ) -> Result<(), GpuError> {
        if (self.len < self.sinks || self.recent > 0) && !positions.is_empty() {
            return Err(GpuError::Unsupported(
                "records without the full-precision copies of attention sinks or a recent \
                 window"
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
    /// uploading their records: the decode-step path when the CPU cache encodes.
    pub fn sync_from(&mut self, cache: &KvCache) -> Result<(), GpuError> {
        if cache.len() < self.len {
            return Err(GpuError::Shape {
                what: "CPU cache length (behind the GPU copy)",
                expected: self.len,
                actual: cache.len(),
            });
        }
        self.adopt_calibration(cache, false)?;
        let tokens: Vec<usize> = (self.len..cache.len()).collect();
        let mut positions = Vec::with_capacity(tokens.len());
        let mut key_records = Vec::new();
        let mut key_scales = Vec::new();
        let mut value_records = Vec::new();
        let mut value_scales = Vec::new();
        if self.recent > 0 {
            self.oldest_recent = self
                .oldest_recent
                .max(cache.len().saturating_sub(self.recent + self.max_rewind));
        }
        self.upload_copies(cache, self.len)?;
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
                    // The body record (`token` would name a sink's full-precision copy).
                    let (record, halves) = stream
                        .body()
                        .record(stream.body_slot(t))
                        .filter(|_| t >= stream.first_stored())
                        .ok_or(GpuError::Shape {
                            what: "stored token",
                            expected: t,
                            actual: stream.first_stored(),
                        })?;
                    records.extend_from_slice(record);
                    scales.extend_from_slice(halves);
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
        )
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
                    _pad: [0; 2],
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
                        ),
                        scatter::bind_group(
                            &ctx,
                            &params,
                            (2 * k + 1) as u64 * align,
                            &vr,
                            &vs,
                            &page.values,
                            &pos,
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
        if self.recent > 0 {
            // As the CPU stream's ring of `recent + max_rewind` copies forgets the oldest.
            self.oldest_recent = self
                .oldest_recent
                .max(new_len.saturating_sub(self.recent + self.max_rewind));
        }
        Ok(())
    }
}
