//! Dispatch side of `finish.wgsl` (attention pass 2b): one inverse rotation per output row,
//! on the GPU with the dense Π_Vᵀ (and S_Vᵀ for TQ_prod values) — a d×d product per row, which
//! is negligible next to pass 1 and keeps the output on the device for a GPU model.
//!
//! CPU reference: the output mapping of `tq_cache::attention::fused_attention`; covered by the
//! attention tests.

use super::{Access, Binding, Kernel, b};
use crate::context::GpuContext;

pub(crate) const SOURCE: &str = include_str!("finish.wgsl");

/// Bindings 2.. of `finish.wgsl`: state `[rows, rec]`, value tables, out `[rows, value dim]`,
/// the gathered window scores `[rows, gather_stride]` (normalized in place).
pub(crate) const BINDINGS: [Binding; 4] = [
    b(2, "state", Access::Read),
    b(3, "tables", Access::Read),
    b(4, "out", Access::ReadWrite),
    b(5, "gather", Access::ReadWrite),
];

/// The bind group of the finish dispatch.
pub(crate) fn bind_group(
    ctx: &GpuContext,
    params: &wgpu::Buffer,
    launch: (&wgpu::Buffer, u64),
    state: &wgpu::Buffer,
    tables: &wgpu::Buffer,
    out: &wgpu::Buffer,
    gather: &wgpu::Buffer,
) -> wgpu::BindGroup {
    ctx.bind(
        Kernel::Finish,
        &[
            (0, params, 0, None),
            (1, launch.0, launch.1, Some(super::attend::LAUNCH_BYTES)),
            (2, state, 0, None),
            (3, tables, 0, None),
            (4, out, 0, None),
            (5, gather, 0, None),
        ],
    )
}
