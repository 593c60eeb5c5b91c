//! Dispatch side of `merge.wgsl` (attention pass 2a): folds a window of block partials into
//! each row's running max, sum and accumulators.
//!
//! CPU reference: the block combination of `tq_cache::attention::fused_attention`; covered by
//! the attention tests, and by the split tests (many windows versus one).

use super::{Access, Binding, Kernel, b};
use crate::context::GpuContext;

pub(crate) const SOURCE: &str = include_str!("merge.wgsl");

/// Bindings 2.. of `merge.wgsl`: partials window `[blocks, block_stride]`, state `[rows, rec]`.
pub(crate) const BINDINGS: [Binding; 2] = [
    b(2, "partials", Access::Read),
    b(3, "state", Access::ReadWrite),
];

/// The bind group of one merge dispatch.
pub(crate) fn bind_group(
    ctx: &GpuContext,
    params: &wgpu::Buffer,
    launch: (&wgpu::Buffer, u64),
    partials: (&wgpu::Buffer, u64, u64),
    state: &wgpu::Buffer,
) -> wgpu::BindGroup {
    ctx.bind(
        Kernel::Merge,
        &[
            (0, params, 0, None),
            (1, launch.0, launch.1, Some(super::attend::LAUNCH_BYTES)),
            (2, partials.0, partials.1, Some(partials.2)),
            (3, state, 0, None),
        ],
    )
}
