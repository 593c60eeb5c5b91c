//! Dispatch side of `encode.wgsl`: TurboQuant (or f16 / f32) encode of new vectors.
//!
//! CPU reference: `tq_cache::TokenCodec::encode_into` (the tests compare records bit for bit).

use bytemuck::{Pod, Zeroable};

use super::{Access, Binding, Kernel, StreamDesc, b};
use crate::context::GpuContext;

pub(crate) const SOURCE: &str = include_str!("encode.wgsl");

/// Bindings of `encode.wgsl`; shapes: input `[vectors, dim]` f32, records
/// `[vectors, record_words]` u32, scales `[vectors, scales]` u32 (binary16 in the low half).
pub(crate) const BINDINGS: [Binding; 5] = [
    b(0, "params", Access::Uniform),
    b(1, "input", Access::Read),
    b(2, "tables", Access::Read),
    b(3, "records", Access::ReadWrite),
    b(4, "scales", Access::ReadWrite),
];

/// `EncodeParams` of `encode.wgsl`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub(crate) struct EncodeParams {
    pub desc: StreamDesc,
    pub vectors: u32,
    pub kv_heads: u32,
    pub grid_x: u32,
    pub grid_y: u32,
}

/// The bind group of one encode dispatch.
pub(crate) fn bind_group(
    ctx: &GpuContext,
    params: &wgpu::Buffer,
    input: &wgpu::Buffer,
    tables: &wgpu::Buffer,
    records: &wgpu::Buffer,
    scales: &wgpu::Buffer,
) -> wgpu::BindGroup {
    ctx.bind(
        Kernel::Encode,
        &[
            (0, params, 0, None),
            (1, input, 0, None),
            (2, tables, 0, None),
            (3, records, 0, None),
            (4, scales, 0, None),
        ],
    )
}
