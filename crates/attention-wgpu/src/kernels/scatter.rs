//! Dispatch side of `scatter.wgsl`: appends new records (GPU-encoded, or encoded on the CPU and
//! uploaded) into one page.
//!
//! CPU reference: `tq_cache::token_store::TokenStore::push` (the tests read pages back and
//! compare them with the CPU cache's records).

use bytemuck::{Pod, Zeroable};

use super::{Access, Binding, Kernel, b};
use crate::context::GpuContext;

pub(crate) const SOURCE: &str = include_str!("scatter.wgsl");

/// Bindings of `scatter.wgsl`; shapes: records `[vectors, record_words]`, scales
/// `[vectors, scales]` (one binary16 per u32), page (see `crate::cache`), positions `[tokens]`,
/// tables (the layer's f32 tables: a fast-scan stream's bit planes).
pub(crate) const BINDINGS: [Binding; 6] = [
    b(0, "params", Access::Uniform),
    b(1, "records", Access::Read),
    b(2, "scales", Access::Read),
    b(3, "page", Access::ReadWrite),
    b(4, "positions", Access::Read),
    b(5, "tables", Access::Read),
];

/// `ScatterParams` of `scatter.wgsl`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub(crate) struct ScatterParams {
    pub vectors: u32,
    pub kv_heads: u32,
    pub record_words: u32,
    pub scales: u32,
    pub first_slot: u32,
    pub ring_slots: u32,
    pub page_first_slot: u32,
    pub page_tokens: u32,
    pub scales_offset: u32,
    pub write_positions: u32,
    pub positions_offset: u32,
    pub grid_x: u32,
    pub grid_y: u32,
    pub skip_tokens: u32,
    pub order: u32,
    pub planes_offset: u32,
}

/// The bind group of one scatter dispatch (`params` at `params_offset`, 16·4 bytes).
#[allow(clippy::too_many_arguments)]
pub(crate) fn bind_group(
    ctx: &GpuContext,
    params: &wgpu::Buffer,
    params_offset: u64,
    records: &wgpu::Buffer,
    scales: &wgpu::Buffer,
    page: &wgpu::Buffer,
    positions: &wgpu::Buffer,
    tables: &wgpu::Buffer,
) -> wgpu::BindGroup {
    ctx.bind(
        Kernel::Scatter,
        &[
            (
                0,
                params,
                params_offset,
                Some(size_of::<ScatterParams>() as u64),
            ),
            (1, records, 0, None),
            (2, scales, 0, None),
            (3, page, 0, None),
            (4, positions, 0, None),
            (5, tables, 0, None),
        ],
    )
}
