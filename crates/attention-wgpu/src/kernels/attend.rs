//! Dispatch side of `attend.wgsl` (attention pass 1) and the parameter blocks every attention
//! kernel shares (`attn_params.wgsl`).
//!
//! CPU reference: `tq_cache::attention::reference_attention` (exact, decoded, f64 sums); the
//! tests compare the outputs of pass 1 + merge + finish with it.

use bytemuck::{Pod, Zeroable};

use super::{Access, Binding, Kernel, StreamDesc, b};
use crate::context::GpuContext;

pub(crate) const SOURCE: &str = include_str!("attend.wgsl");

/// Bindings 2.. of `attend.wgsl`: `score.wgsl`'s prepared / tables / key page, then the value
/// page and the partials window `[blocks, block_stride]`, `score.wgsl`'s full-precision
/// copies (7) and heavy hitters' kept copies (8), and the gathered window scores (9).
pub(crate) const BINDINGS: [Binding; 8] = [
    b(2, "prepared", Access::Read),
    b(3, "tables", Access::Read),
    b(4, "kpage", Access::Read),
    b(5, "vpage", Access::Read),
    b(6, "partials", Access::ReadWrite),
    b(7, "fp", Access::Read),
    b(8, "kept", Access::Read),
    b(9, "gather", Access::ReadWrite),
];

/// `AttnParams` of `attn_params.wgsl` (336 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub(crate) struct AttnParams {
    pub key: StreamDesc,
    pub value: StreamDesc,
    pub queries: u32,
    pub q_heads: u32,
    pub kv_heads: u32,
    pub group: u32,
    pub chunk_heads: u32,
    pub chunks: u32,
    pub qstride: u32,
    pub positions_offset: u32,
    pub scale: f32,
    pub len: u32,
    pub first_stored: u32,
    pub ring_slots: u32,
    pub window: u32,
    pub block_tokens: u32,
    pub rec: u32,
    pub block_stride: u32,
    pub rows: u32,
    pub score_stride: u32,
    pub sink_end: u32,
    pub fp_slots: u32,
    pub fp_query: u32,
    pub fp_values: u32,
    pub fp_coords: u32,
    pub fp_ring: u32,
    pub ring_words: u32,
    pub q8_query: u32,
    pub q8_coords: u32,
    pub q8_rotation: u32,
    pub center_bias: u32,
    pub center_first_block: u32,
    pub center_blocks: u32,
    pub rope_halves: u32,
    pub kept_capacity: u32,
    pub gather_stride: u32,
    pub _pad_a: u32,
    pub _pad_b: u32,
}

/// `DispatchParams` of `attn_params.wgsl`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub(crate) struct LaunchParams {
    pub grid_x: u32,
    pub grid_y: u32,
    pub total: u32,
    pub first_slot: u32,
    pub blocks: u32,
    pub init: u32,
    pub page_tokens: u32,
    pub k_scales_offset: u32,
    pub k_positions_offset: u32,
    pub v_scales_offset: u32,
    pub _pad: [u32; 2],
}

/// Bytes of one `DispatchParams` binding.
pub(crate) const LAUNCH_BYTES: u64 = size_of::<LaunchParams>() as u64;

/// The bind group of one pass-1 dispatch (one page, its partials window).
#[allow(clippy::too_many_arguments)]
pub(crate) fn bind_group(
    ctx: &GpuContext,
    params: &wgpu::Buffer,
    launch: (&wgpu::Buffer, u64),
    prepared: &wgpu::Buffer,
    tables: &wgpu::Buffer,
    kpage: &wgpu::Buffer,
    vpage: &wgpu::Buffer,
    partials: (&wgpu::Buffer, u64, u64),
    (fp, kept, gather): (&wgpu::Buffer, &wgpu::Buffer, &wgpu::Buffer),
) -> wgpu::BindGroup {
    ctx.bind(
        Kernel::Attend,
        &[
            (0, params, 0, None),
            (1, launch.0, launch.1, Some(LAUNCH_BYTES)),
            (2, prepared, 0, None),
            (3, tables, 0, None),
            (4, kpage, 0, None),
            (5, vpage, 0, None),
            (6, partials.0, partials.1, Some(partials.2)),
            (7, fp, 0, None),
            (8, kept, 0, None),
            (9, gather, 0, None),
        ],
    )
}
