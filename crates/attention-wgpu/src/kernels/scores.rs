//! Dispatch side of `scores.wgsl`: raw scores of every slot, for tests and inspection.
//!
//! CPU reference: `scale·⟨q, decode(k)⟩` with `tq_cache::stream::Stream::decode` (what
//! `reference_attention` scores); the tests compare within 1e-4 relative.

use super::{Access, Binding, Kernel, b};
use crate::context::GpuContext;

pub(crate) const SOURCE: &str = include_str!("scores.wgsl");

/// Bindings 2.. of `scores.wgsl`: `score.wgsl`'s three, then out `[rows, score_stride]`, and
/// `score.wgsl`'s full-precision copies (7) and heavy hitters' kept copies (8).
pub(crate) const BINDINGS: [Binding; 6] = [
    b(2, "prepared", Access::Read),
    b(3, "tables", Access::Read),
    b(4, "kpage", Access::Read),
    b(5, "out", Access::ReadWrite),
    b(7, "fp", Access::Read),
    b(8, "kept", Access::Read),
];

/// The bind group of one scores dispatch (one page).
#[allow(clippy::too_many_arguments)]
pub(crate) fn bind_group(
    ctx: &GpuContext,
    params: &wgpu::Buffer,
    launch: (&wgpu::Buffer, u64),
    prepared: &wgpu::Buffer,
    tables: &wgpu::Buffer,
    kpage: &wgpu::Buffer,
    out: &wgpu::Buffer,
    (fp, kept): (&wgpu::Buffer, &wgpu::Buffer),
) -> wgpu::BindGroup {
    ctx.bind(
        Kernel::Scores,
        &[
            (0, params, 0, None),
            (1, launch.0, launch.1, Some(super::attend::LAUNCH_BYTES)),
            (2, prepared, 0, None),
            (3, tables, 0, None),
            (4, kpage, 0, None),
            (5, out, 0, None),
            (7, fp, 0, None),
            (8, kept, 0, None),
        ],
    )
}
