//! Decode attention on a [`GpuKvCache`]: prepare → pass 1 per page → merge per window →
//! finish, in one submit per call (see `kernels/` for each kernel's layout).
//!
//! Shapes follow `tq_cache::attention`: queries and outputs `[query_len, q_heads, head_dim]`,
//! query head `h` reads KV head `h / (q_heads / kv_heads)` (GQA), scores `scale·⟨q, k⟩`
//! (times the debiasing factor for debiased-MSE keys), causal and window masks from positions.
//! Calls with many query tokens run in chunks so that one page's partials fit one binding and
//! all partials fit one buffer.

use std::sync::Arc;

use tq_cache::attention::AttentionShape;
use tq_cache::rope_center::CENTER_BLOCK;

use crate::cache::GpuKvCache;
use crate::error::GpuError;
use crate::kernels::attend::{self, AttnParams, LaunchParams};
use crate::kernels::{
    Grid, KIND_F16, KIND_F32, KIND_PROD, Kernel, MAX_GROUP, finish, merge, prepare, scores,
};

/// Partials of one call never exceed this many bytes (nor the device's largest buffer).
const PARTIALS_BUDGET: u64 = 256 << 20;

/// Tokens per chunk of [`GpuKvCache::forward`] on a stream with a full-precision recent window
/// (the copies ring holds the window, the rewind margin and one chunk).
pub(crate) const RECENT_CHUNK: usize = 64;

/// What one call needs to know about its shape.
struct CallPlan {
    params: AttnParams,
    rows: usize,
    /// f32 per partial record.
    rec: usize,
    /// f32 per block of partials (aligned).
    block_stride: usize,
    /// Pages holding written slots (a prefix of the page list).
    pages: usize,
    /// Blocks of those pages.
    blocks: usize,
}

/// A dispatch to record: kernel, grid, launch parameters, and what to bind.
struct Launch {
    kernel: Kernel,
    pipeline: wgpu::ComputePipeline,
    grid: Grid,
    params: LaunchParams,
    /// Page index (attend, scores) or partials window in blocks (merge).
    page: usize,
    window: (usize, usize),
}

impl GpuKvCache {
    fn check_attention(
        &self,
        queries: &[f32],
        query_positions: &[u32],
        shape: AttentionShape,
        out_len: usize,
    ) -> Result<usize, GpuError> {
        if shape.q_heads == 0 || !shape.q_heads.is_multiple_of(self.kv_heads) {
            return Err(tq_cache::CacheError::InvalidConfig(format!(
                "{} query heads cannot share {} KV heads evenly",
                shape.q_heads, self.kv_heads
            ))
            .into());
        }
        let n = query_positions.len();
        let width = shape.q_heads * self.head_dim;
        for (what, len) in [("queries", queries.len()), ("attention output", out_len)] {
            if len != n * width {
                return Err(GpuError::Shape {
                    what,
                    expected: n * width,
                    actual: len,
                });
            }
        }
        if let Some((index, &value)) = queries.iter().enumerate().find(|(_, v)| !v.is_finite()) {
            return Err(tq_cache::codec::CodecError::NonFinite { index, value }.into());
        }
        Ok(n)
    }

    fn plan(&self, queries: usize, shape: AttentionShape) -> CallPlan {
        let group = shape.q_heads / self.kv_heads;
        // The largest divisor of the group that one workgroup can score: every chunk is full,
        // so the kernel's head loops have the constant trip count CHUNK.
        let chunk_heads = (1..=group.min(MAX_GROUP))
            .rev()
            .find(|c| group.is_multiple_of(*c))
            .unwrap_or(1);
        let rows = queries * shape.q_heads;
        // Attention sinks and recent windows: their copies' values accumulate in the original
        // domain after the others, and coded keys need `scale·q` beside the prepared query to
        // score their copies.
        let fp_coords = if self.sinks > 0 || self.windows.any() {
            self.head_dim
        } else {
            0
        };
        // An 8-bit ring: its copies' values accumulate in the window rotation's coordinates
        // after those, scored against the query rotated once (`Π₈·scale·q`, after the rest of
        // a prepared row).
        let q8_coords = if self.window_q8 { self.head_dim } else { 0 };
        let rec = 2 + self.value.dim + self.value.sketch_dim + fp_coords + q8_coords;
        let align = (self.ctx.storage_alignment() / 4).max(1) as usize;
        let block_stride = (rows * rec).next_multiple_of(align);
        let written = self.written_slots();
        let pages = self
            .pages
            .iter()
            .take_while(|p| p.first_slot < written)
            .count();
        let blocks = self.pages[..pages]
            .iter()
            .map(|p| p.tokens / self.block_tokens)
            .sum();
        let prepared = self.key.dim
            + if self.key.desc.kind == KIND_PROD {
                self.key.sketch_dim
            } else {
                0
            };
        let plain_keys = matches!(self.key.desc.kind, KIND_F32 | KIND_F16);
        let fp_query = if fp_coords > 0 && !plain_keys {
            prepared
        } else {
            0
        };
        let plain_query = prepared + if fp_query > 0 { self.head_dim } else { 0 };
        let q8_query = if q8_coords > 0 { plain_query } else { 0 };
        let qstride = plain_query + q8_coords;
        let fp_values = self.fp_values();
        // RoPE-centered keys: one score correction per row and center block holding a stored
        // token (`ensure_center_angles` has the angles on the device).
        let (center_first_block, center_blocks) = match self.rope_pairs {
            Some(_) if self.len > 0 => {
                let ring_oldest = self.ring_slots.map_or(0, |r| self.len.saturating_sub(r));
                let oldest = self.first_stored.max(ring_oldest).min(self.len - 1);
                let first = oldest / CENTER_BLOCK;
                (first, (self.len - 1) / CENTER_BLOCK + 1 - first)
            }
            _ => (0, 0),
        };
        let params = AttnParams {
            key: self.key.desc,
            value: self.value.desc,
            queries: queries as u32,
            q_heads: shape.q_heads as u32,
            kv_heads: self.kv_heads as u32,
            group: group as u32,
            chunk_heads: chunk_heads as u32,
            chunks: group.div_ceil(chunk_heads) as u32,
            qstride: qstride as u32,
            positions_offset: (rows * qstride) as u32,
            scale: shape.scale,
            len: self.len as u32,
            first_stored: self.first_stored as u32,
            ring_slots: self.ring_slots.unwrap_or(0) as u32,
            window: self.window.unwrap_or(0) as u32,
            block_tokens: self.block_tokens as u32,
            rec: rec as u32,
            block_stride: block_stride as u32,
            rows: rows as u32,
            score_stride: written as u32,
            sink_end: self.sinks.min(self.len) as u32,
            fp_slots: (self.sinks + self.fp_ring) as u32,
            fp_ring: self.fp_ring as u32,
            fp_query: fp_query as u32,
            fp_values: fp_values as u32,
            fp_coords: fp_coords as u32,
            ring_words: self.ring_words() as u32,
            q8_query: q8_query as u32,
            q8_coords: q8_coords as u32,
            // `build_tables` puts Π₈ first.
            q8_rotation: 0,
            // Set where the prepared buffer's layout is known (`upload_queries`).
            center_bias: 0,
            center_first_block: center_first_block as u32,
            center_blocks: center_blocks as u32,
            rope_halves: u32::from(self.rope_pairs == Some(tq_cache::basis::RopePairs::Halves)),
            kept_capacity: self.kept_capacity() as u32,
            // Set by a call that gathers (`attend_chunk`).
            gather_stride: 0,
            _pad_a: 0,
            _pad_b: 0,
        };
        CallPlan {
            params,
            rows,
            rec,
            block_stride,
            pages,
            blocks,
        }
    }

    /// The most query tokens one call may take: a page's partials fit one binding and all
    /// partials fit [`PARTIALS_BUDGET`] and the device's largest buffer.
    fn queries_per_call(&self, shape: AttentionShape, total: usize) -> Result<usize, GpuError> {
        let limit = self.ctx.split_limits().max_binding_bytes;
        let budget = PARTIALS_BUDGET.min(self.ctx.device_limits().max_buffer_size);
        let largest = self.pages.iter().map(|p| p.tokens).max().unwrap_or(0) / self.block_tokens;
        let device = self.ctx.device_limits();
        let device_binding = device
            .max_storage_buffer_binding_size
            .min(device.max_buffer_size);
        let fits = |nq: usize| {
            let plan = self.plan(nq, shape);
            let stride = 4 * plan.block_stride as u64;
            // The prepared rows, positions, window starts and center corrections: one binding
            // (never split, so held to the device's limit, not the split limit).
            let prepared = plan.params.positions_offset as usize
                + nq * (1 + 2 * self.kv_heads)
                + plan.rows * plan.params.center_blocks as usize;
            stride * largest as u64 <= limit
                && stride * plan.blocks as u64 <= budget
                && stride <= limit
                && 4 * prepared as u64 <= device_binding
        };
        if !fits(1) {
            let plan = self.plan(1, shape);
            return Err(GpuError::TooLarge {
                what: "attention partials of one query token per page",
                needed: 4 * (plan.block_stride * largest.max(1)) as u64,
                limit,
            });
        }
        let mut n = 1;
        while n < total && fits(2 * n) {
            n *= 2;
        }
        Ok(n.min(total))
    }

    /// Attention of `query_positions.len()` query tokens against the stored tokens (causal and
    /// window masks from positions), like `tq_cache::attention::attend`: queries and `out`
    /// `[query_len, q_heads, head_dim]`. A query that sees no token outputs zeros.
    pub fn attend(
        &mut self,
        queries: &[f32],
        query_positions: &[u32],
        shape: AttentionShape,
        out: &mut [f32],
    ) -> Result<(), GpuError> {
        let n = self.check_attention(queries, query_positions, shape, out.len())?;
        // Attention over the stored cache: every query reads each stream's recent window.
        let windows = self.windows.stored_starts(self.len).repeat(n);
        self.attend_with_windows(queries, query_positions, &windows, shape, out, false)
    }

    /// Attention of the queries of the newest `query_positions.len()` tokens, each reading each
    /// stream's recent window as in the step that appended them (as [`forward`](Self::forward)
    /// gave them, and `tq_cache::attention::attend_in_step`): what a KV-sharing layer reads
    /// of its producer's cache after the producer's forward call. Without recent windows it
    /// equals [`attend`](Self::attend).
    ///
    /// Errors: more queries than stored tokens (`Shape`); with recent windows, more queries
    /// than the last `forward` call wrote, or a cache changed since (`Unsupported`: those
    /// windows are not kept); and those of [`attend`](Self::attend).
    pub fn attend_in_step(
        &mut self,
        queries: &[f32],
        query_positions: &[u32],
        shape: AttentionShape,
        out: &mut [f32],
    ) -> Result<(), GpuError> {
        let n = self.check_attention(queries, query_positions, shape, out.len())?;
        if n > self.len {
            return Err(GpuError::Shape {
                what: "queries of the newest tokens (at most the tokens stored)",
                expected: self.len,
                actual: n,
            });
        }
        if !self.windows.any() {
            return self.attend(queries, query_positions, shape, out);
        }
        // The window starts the last forward call gave its queries (computed from the copies
        // held before each of its pieces went in, which later appends forget).
        let streams = 2 * self.kv_heads;
        let windows = match &self.step_windows {
            Some(starts) if n * streams <= starts.len() => {
                starts[starts.len() - n * streams..].to_vec()
            }
            _ => {
                return Err(GpuError::Unsupported(format!(
                    "attention in step for {n} queries: with recent windows only the queries of \
                     the last forward call's tokens (its windows are not kept otherwise)"
                )));
            }
        };
        self.attend_with_windows(queries, query_positions, &windows, shape, out, false)
    }

    /// [`attend`](Self::attend) with each query's window starts given (`[n, 2, kv_heads]`:
    /// from there on a stream's tokens are read from their copies); `gather`: the weights the
    /// queries give their window tokens go to the heavy hitters' tallies.
    fn attend_with_windows(
        &mut self,
        queries: &[f32],
        query_positions: &[u32],
        windows: &[u32],
        shape: AttentionShape,
        out: &mut [f32],
        gather: bool,
    ) -> Result<(), GpuError> {
        let n = query_positions.len();
        if n == 0 {
            return Ok(());
        }
        let per_call = self.queries_per_call(shape, n)?;
        let width = shape.q_heads * self.head_dim;
        let streams = 2 * self.kv_heads;
        let mut start = 0;
        while start < n {
            let end = (start + per_call).min(n);
            let (positions, windows) = (
                &query_positions[start..end],
                &windows[start * streams..end * streams],
            );
            let gathered = self.attend_chunk(
                &queries[start * width..end * width],
                positions,
                windows,
                shape,
                &mut out[start * width..end * width],
                gather,
            )?;
            if let Some((weights, stride)) = gathered {
                self.add_received(positions, windows, &weights, stride, shape.q_heads);
            }
            start = end;
        }
        Ok(())
    }

    /// Appends the new tokens (GPU encode), then attends: the decode step of a layer, like
    /// `KvCache::forward` with `new_positions` the positions of the new tokens.
    pub fn forward(
        &mut self,
        queries: &[f32],
        keys: &[f32],
        values: &[f32],
        new_positions: &[u32],
        shape: AttentionShape,
        out: &mut [f32],
    ) -> Result<(), GpuError> {
        if self.host.is_none() {
            self.encode_and_append(keys, values, new_positions)?;
            return self.attend(queries, new_positions, shape, out);
        }
        // Host-encoded streams: the whole batch is checked and encoded before anything goes in
        // (an empty cache calibrating on it, with the queries' energy for a plane basis, as
        // `KvCache::forward` through `append_with_queries` does), so a bad batch changes nothing.
        self.check_attention(queries, new_positions, shape, out.len())?;
        let n = self.check_batch(keys, values, new_positions)?;
        let q = shape.q_heads * self.head_dim;
        if n == 0 {
            return Ok(());
        }
        let energy = if self.len == 0 {
            self.query_energy(queries, shape.q_heads)
        } else {
            None
        };
        let mut batch = self.encode_on_host(keys, values, energy.as_deref())?;
        self.commit_calibration(batch.calibrated.take())?;
        if !self.windows.any() {
            self.append_host_batch(&batch, 0..n, new_positions, (self.len, true))?;
            return self.attend(queries, new_positions, shape, out);
        }
        // Recent windows: each new query reads each stream's own newest tokens from their
        // copies, as `KvCache::forward` does (`Stream::window_start` in a step). Chunks of at
        // most RECENT_CHUNK tokens give every query the same window as the whole batch would (a
        // query's window ends at itself) and keep the copies it reads inside the ring. Heavy
        // hitters: each chunk's queries hand back the weights of their window tokens; the tokens
        // the next query no longer reads in its window are decided after the last chunk (as
        // `KvCache::forward` does), those no later chunk's query reads before each chunk goes in
        // (stored then, while the ring holds their copies, but read from the next call on).
        let gather = self.kept.is_some();
        let mut start = 0;
        let mut step_windows = Vec::new();
        while start < n {
            let end = (start + RECENT_CHUNK).min(n);
            let before = self.len;
            // From what the copies held before the chunk went in; the chunk adds end − start
            // tokens.
            let windows = self
                .windows
                .chunk_starts(before, end - start, before + end - start);
            let settle = (before, start == 0);
            self.append_host_batch(&batch, start..end, &new_positions[start..end], settle)?;
            self.attend_with_windows(
                &queries[start * q..end * q],
                &new_positions[start..end],
                &windows,
                shape,
                &mut out[start * q..end * q],
                gather,
            )?;
            step_windows.extend_from_slice(&windows);
            start = end;
        }
        self.settle_kept(self.len + 1, true)?;
        // Kept for `attend_in_step` (a KV-sharing layer reads this step as this call did).
        self.step_windows = Some(step_windows);
        Ok(())
    }

    /// The queries' energy a plane basis is fitted with (`tq_cache::kv_cache::query_energy`,
    /// as `KvCache::append_with_queries` computes it) — `None` unless one is about to be.
    fn query_energy(&self, queries: &[f32], q_heads: usize) -> Option<Vec<Vec<f64>>> {
        if !self.host.as_ref().is_some_and(|h| h.needs_query_energy()) {
            return None;
        }
        // The shapes were checked with the call (`check_attention`).
        tq_cache::kv_cache::query_energy(queries, q_heads, self.kv_heads, self.head_dim).ok()
    }

    /// Uploads the queries and positions and returns the prepared-query buffer plus the
    /// uniform parameters of the call.
    fn upload_queries(
        &mut self,
        queries: &[f32],
        positions: &[u32],
        windows: &[u32],
        plan: &CallPlan,
    ) -> (wgpu::Buffer, wgpu::Buffer, wgpu::Buffer) {
        let ctx = Arc::clone(&self.ctx);
        let qin = self.scratch.get(&ctx, "queries", 4 * queries.len() as u64);
        let mut call = plan.params;
        // The RoPE centers' score corrections follow the positions and window starts.
        call.center_bias = call.positions_offset + (positions.len() + windows.len()) as u32;
        let prepared_len = call.center_bias as usize + plan.rows * call.center_blocks as usize;
        let prepared = self
            .scratch
            .get(&ctx, "prepared queries", 4 * prepared_len as u64);
        ctx.write(&qin, 0, bytemuck::cast_slice(queries));
        ctx.write(
            &prepared,
            4 * u64::from(plan.params.positions_offset),
            bytemuck::cast_slice(positions),
        );
        ctx.write(
            &prepared,
            4 * (u64::from(plan.params.positions_offset) + positions.len() as u64),
            bytemuck::cast_slice(windows),
        );
        let params = ctx.uniform_init("attention params", bytemuck::bytes_of(&call));
        (qin, prepared, params)
    }

    /// The prepare dispatch's bind group: this cache's tables and, for RoPE-centered keys, its
    /// device table of block angles (the tables stand in for it otherwise: never read).
    fn prepare_group(
        &self,
        params: &wgpu::Buffer,
        launch: (&wgpu::Buffer, u64),
        queries: &wgpu::Buffer,
        prepared: &wgpu::Buffer,
    ) -> wgpu::BindGroup {
        let angles = self
            .center_angles
            .as_ref()
            .map_or(&self.tables, |(_, buffer)| buffer);
        prepare::bind_group(
            &self.ctx,
            params,
            launch,
            queries,
            &self.tables,
            prepared,
            angles,
        )
    }

    fn page_launch(
        &self,
        kernel: Kernel,
        chunk: u32,
        index: usize,
        total: usize,
        blocks: usize,
    ) -> Result<Launch, GpuError> {
        let page = &self.pages[index];
        let grid = self.ctx.grid(total)?;
        Ok(Launch {
            kernel,
            pipeline: self.ctx.pipeline(kernel, chunk)?,
            grid,
            params: LaunchParams {
                grid_x: grid.x,
                grid_y: grid.y,
                total: total as u32,
                first_slot: page.first_slot as u32,
                blocks: blocks as u32,
                init: 0,
                page_tokens: page.tokens as u32,
                k_scales_offset: page.layout.k_scales_offset as u32,
                k_positions_offset: page.layout.k_positions_offset as u32,
                v_scales_offset: page.layout.v_scales_offset as u32,
                _pad: [0; 2],
            },
            page: index,
            window: (0, 0),
        })
    }

    fn row_launch(&self, kernel: Kernel, rows: usize) -> Result<Launch, GpuError> {
        let grid = self.ctx.grid(rows)?;
        Ok(Launch {
            kernel,
            pipeline: self.ctx.pipeline(kernel, 0)?,
            grid,
            params: LaunchParams {
                grid_x: grid.x,
                grid_y: grid.y,
                total: rows as u32,
                ..LaunchParams::default()
            },
            page: 0,
            window: (0, 0),
        })
    }

    /// One uniform buffer with every launch's parameters at the uniform offset alignment.
    fn launch_buffer(&self, launches: &[Launch]) -> (wgpu::Buffer, u64) {
        let align = attend::LAUNCH_BYTES.next_multiple_of(self.ctx.uniform_alignment());
        let mut bytes = vec![0u8; align as usize * launches.len().max(1)];
        for (i, l) in launches.iter().enumerate() {
            let at = i * align as usize;
            bytes[at..at + attend::LAUNCH_BYTES as usize]
                .copy_from_slice(bytemuck::bytes_of(&l.params));
        }
        (self.ctx.uniform_init("launch params", &bytes), align)
    }

    /// One call's worth of queries; with `gather` (heavy hitters), also the softmax weights
    /// each row gave the tokens it reads in a window, `[rows, stride]` from the row's gather
    /// start (`attend.wgsl`), and the stride.
    fn attend_chunk(
        &mut self,
        queries: &[f32],
        positions: &[u32],
        windows: &[u32],
        shape: AttentionShape,
        out: &mut [f32],
        gather: bool,
    ) -> Result<Option<(Vec<f32>, usize)>, GpuError> {
        self.ensure_center_angles()?;
        let mut plan = self.plan(positions.len(), shape);
        if plan.pages == 0 {
            out.fill(0.0);
            return Ok(None);
        }
        let gather_stride = if gather {
            self.gather_stride(positions, windows)
        } else {
            0
        };
        plan.params.gather_stride = gather_stride as u32;
        let ctx = Arc::clone(&self.ctx);
        let (qin, prepared, params) = self.upload_queries(queries, positions, windows, &plan);
        let stride_bytes = 4 * plan.block_stride as u64;
        let partials = self.scratch.get(
            &ctx,
            "attention partials",
            stride_bytes * plan.blocks as u64,
        );
        let state = self
            .scratch
            .get(&ctx, "attention state", 4 * (plan.rows * plan.rec) as u64);
        let dv = self.value.dim;
        let output = self
            .scratch
            .get(&ctx, "attention output", 4 * (plan.rows * dv) as u64);
        let gather_bytes = 4 * (plan.rows * gather_stride) as u64;
        ctx.check_binding("gathered window scores", gather_bytes)?;
        let gathered = self
            .scratch
            .get(&ctx, "gathered window scores", gather_bytes);

        let mut launches = vec![self.row_launch(Kernel::Prepare, plan.rows)?];
        let per_block = self.kv_heads * plan.params.chunks as usize * positions.len();
        let mut first_block = 0;
        for i in 0..plan.pages {
            let blocks = self.pages[i].tokens / self.block_tokens;
            let total = blocks * per_block;
            let mut launch =
                self.page_launch(Kernel::Attend, plan.params.chunk_heads, i, total, blocks)?;
            launch.window = (first_block, blocks);
            launches.push(launch);
            first_block += blocks;
        }
        let window = ((ctx.split_limits().max_binding_bytes / stride_bytes) as usize).max(1);
        let mut start = 0;
        while start < plan.blocks {
            let blocks = window.min(plan.blocks - start);
            let mut launch = self.row_launch(Kernel::Merge, plan.rows)?;
            launch.params.blocks = blocks as u32;
            launch.params.init = u32::from(start == 0);
            launch.window = (start, blocks);
            launches.push(launch);
            start += blocks;
        }
        launches.push(self.row_launch(Kernel::Finish, plan.rows)?);
        let (launch_buffer, align) = self.launch_buffer(&launches);

        ctx.submit("attention", |encoder| {
            let groups: Vec<wgpu::BindGroup> = launches
                .iter()
                .enumerate()
                .map(|(i, l)| {
                    let at = (&launch_buffer, i as u64 * align);
                    let window = (
                        &partials,
                        l.window.0 as u64 * stride_bytes,
                        l.window.1 as u64 * stride_bytes,
                    );
                    match l.kernel {
                        Kernel::Prepare => self.prepare_group(&params, at, &qin, &prepared),
                        Kernel::Attend => {
                            let page = &self.pages[l.page];
                            attend::bind_group(
                                &ctx,
                                &params,
                                at,
                                &prepared,
                                &self.tables,
                                &page.keys,
                                &page.values,
                                window,
                                (&self.fp, self.kept_buffer(), &gathered),
                            )
                        }
                        Kernel::Merge => merge::bind_group(&ctx, &params, at, window, &state),
                        _ => finish::bind_group(
                            &ctx,
                            &params,
                            at,
                            &state,
                            &self.tables,
                            &output,
                            &gathered,
                        ),
                    }
                })
                .collect();
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("attention"),
                timestamp_writes: None,
            });
            for (l, group) in launches.iter().zip(&groups) {
                ctx.dispatch(&mut pass, &l.pipeline, group, l.grid);
            }
            Ok(())
        })?;
        let bytes = ctx.read(&output, 0, 4 * out.len() as u64)?;
        out.copy_from_slice(bytemuck::cast_slice(&bytes));
        if gather_stride == 0 {
            return Ok(None);
        }
        let weights = bytemuck::pod_collect_to_vec(&ctx.read(&gathered, 0, gather_bytes)?);
        Ok(Some((weights, gather_stride)))
    }

    /// Raw scores `scale·⟨q, k̃⟩` of every written slot: `[query_len, q_heads, slots]` with
    /// `−∞` where the mask hides the slot (map tokens to slots with
    /// [`slot_of`](Self::slot_of)). For tests and inspection; attention never stores them.
    pub fn scores(
        &mut self,
        queries: &[f32],
        query_positions: &[u32],
        shape: AttentionShape,
    ) -> Result<Vec<f32>, GpuError> {
        let n = query_positions.len();
        let width = shape.q_heads * self.head_dim;
        self.check_attention(queries, query_positions, shape, n * width)?;
        self.ensure_center_angles()?;
        let plan = self.plan(n, shape);
        let stride = plan.params.score_stride as usize;
        let len = plan.rows * stride;
        if len == 0 || plan.pages == 0 {
            return Ok(vec![f32::NEG_INFINITY; len]);
        }
        let ctx = Arc::clone(&self.ctx);
        ctx.check_binding("scores", 4 * len as u64)?;
        let windows = self.windows.stored_starts(self.len).repeat(n);
        let (qin, prepared, params) =
            self.upload_queries(queries, query_positions, &windows, &plan);
        let output = self.scratch.get(&ctx, "scores", 4 * len as u64);
        let mut launches = vec![self.row_launch(Kernel::Prepare, plan.rows)?];
        for i in 0..plan.pages {
            let tiles = self.pages[i]
                .tokens
                .div_ceil(crate::kernels::WORKGROUP_SIZE as usize);
            let total = tiles * plan.rows;
            launches.push(self.page_launch(Kernel::Scores, 1, i, total, tiles)?);
        }
        let (launch_buffer, align) = self.launch_buffer(&launches);
        ctx.submit("scores", |encoder| {
            let groups: Vec<wgpu::BindGroup> = launches
                .iter()
                .enumerate()
                .map(|(i, l)| {
                    let at = (&launch_buffer, i as u64 * align);
                    match l.kernel {
                        Kernel::Prepare => self.prepare_group(&params, at, &qin, &prepared),
                        _ => scores::bind_group(
                            &ctx,
                            &params,
                            at,
                            &prepared,
                            &self.tables,
                            &self.pages[l.page].keys,
                            &output,
                            (&self.fp, self.kept_buffer()),
                        ),
                    }
                })
                .collect();
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("scores"),
                timestamp_writes: None,
            });
            for (l, group) in launches.iter().zip(&groups) {
                ctx.dispatch(&mut pass, &l.pipeline, group, l.grid);
            }
            Ok(())
        })?;
        let bytes = ctx.read(&output, 0, 4 * len as u64)?;
        Ok(bytemuck::pod_collect_to_vec(&bytes))
    }
}
