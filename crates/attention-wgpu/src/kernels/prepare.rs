//! Dispatch side of `prepare.wgsl`: each query row rotated (and projected) once per call.
//!
//! CPU reference: the query preparation of `tq_cache::attention::fused_attention`
//! (`Π_K·(scale·q)`, `α·s·S·Π_K·(scale·q)`) and, for RoPE-centered keys, each center block's
//! score correction (`tq_cache::rope_center::score_bias`); the attention tests cover it end to
//! end.

use super::{Access, Binding, Kernel, b};
use crate::context::GpuContext;

pub(crate) const SOURCE: &str = include_str!("prepare.wgsl");

/// Bindings 2.. of `prepare.wgsl` (0 and 1 are `attn_params.wgsl`'s); shapes: queries
/// `[rows, key dim]`, prepared `[rows, qstride]` then the query positions (and the RoPE
/// centers' corrections), angles `[blocks, key dim]` (RoPE-centered keys; any buffer
/// otherwise).
pub(crate) const BINDINGS: [Binding; 4] = [
    b(2, "queries", Access::Read),
    b(3, "tables", Access::Read),
    b(4, "prepared", Access::ReadWrite),
    b(5, "angles", Access::Read),
];

/// The bind group of the prepare dispatch.
pub(crate) fn bind_group(
    ctx: &GpuContext,
    params: &wgpu::Buffer,
    launch: (&wgpu::Buffer, u64),
    queries: &wgpu::Buffer,
    tables: &wgpu::Buffer,
    prepared: &wgpu::Buffer,
    angles: &wgpu::Buffer,
) -> wgpu::BindGroup {
    ctx.bind(
        Kernel::Prepare,
        &[
            (0, params, 0, None),
            (1, launch.0, launch.1, Some(super::attend::LAUNCH_BYTES)),
            (2, queries, 0, None),
            (3, tables, 0, None),
            (4, prepared, 0, None),
            (5, angles, 0, None),
        ],
    )
}
