//! The WGSL kernels, each a `.wgsl` file beside the `.rs` file that declares its bindings and
//! parameters (the dimforge/wgml pattern).
//!
//! A kernel's module is its `.wgsl` file with shared fragments prepended: `common.wgsl` (stream
//! descriptor, exact f16 conversions, code extraction) for all; `attn_params.wgsl` (the call
//! and dispatch parameters) for the attention kernels; `score.wgsl` (key scoring and position
//! masks) for the two kernels that score keys. [`Kernel::source`] assembles it; the tests
//! validate every assembled module with naga and translate it to MSL and SPIR-V.
//!
//! | kernel | one workgroup per | reads | writes |
//! |---|---|---|---|
//! | `encode` | new vector (token, KV head) | f32 vectors, tables | records, scales |
//! | `scatter` | new vector | records, scales, positions | one page |
//! | `prepare` | query row (token, query head) | queries, tables | prepared queries |
//! | `attend` | (block, KV head, head chunk, query) | prepared, tables, key page, value page, copies, kept copies | block partials, window scores (heavy hitters) |
//! | `merge` | query row | a window of partials | running state |
//! | `finish` | query row | state, tables | outputs, window weights (heavy hitters) |
//! | `scores` | (query row, 64-slot tile) | prepared, tables, key page, copies, kept copies | scores |

pub(crate) mod attend;
pub(crate) mod encode;
pub(crate) mod finish;
pub(crate) mod merge;
pub(crate) mod prepare;
pub(crate) mod scatter;
pub(crate) mod scores;

use bytemuck::{Pod, Zeroable};

const COMMON: &str = include_str!("common.wgsl");
const ATTN_PARAMS: &str = include_str!("attn_params.wgsl");
const SCORE: &str = include_str!("score.wgsl");

/// Threads per workgroup of every kernel (`WG` in `common.wgsl`).
pub const WORKGROUP_SIZE: u32 = 64;
/// Largest head dimension the kernels accept (`MAX_DIM` in `common.wgsl`).
pub const MAX_DIM: usize = 512;
/// Centroids the kernels hold in workgroup memory (`MAX_LEVELS` in `common.wgsl`); the
/// codebooks of several code groups together may hold more, read from the tables past it.
pub const MAX_LEVELS: usize = 256;
/// Largest token block of attention pass 1 (`MAX_BLOCK` in `attn_params.wgsl`).
pub const MAX_BLOCK_TOKENS: usize = 256;
/// Largest number of query heads one pass-1 workgroup scores (`MAX_GROUP`).
pub const MAX_GROUP: usize = 8;

/// How a kernel accesses one binding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// A uniform buffer.
    Uniform,
    /// A read-only storage buffer.
    Read,
    /// A read-write storage buffer.
    ReadWrite,
}

/// One binding of group 0, as the kernel's `.wgsl` declares it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Binding {
    /// `@binding(index)`.
    pub index: u32,
    /// The WGSL variable name.
    pub name: &'static str,
    /// Uniform, read-only storage or read-write storage.
    pub access: Access,
}

const fn b(index: u32, name: &'static str, access: Access) -> Binding {
    Binding {
        index,
        name,
        access,
    }
}

/// Bindings 0 and 1 of every attention kernel (`attn_params.wgsl`).
const ATTN_HEAD: [Binding; 2] = [
    b(0, "params", Access::Uniform),
    b(1, "launch", Access::Uniform),
];

/// Every kernel of the crate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// TurboQuant (or f16/f32) encode of new vectors into records.
    Encode,
    /// Appends records into a page.
    Scatter,
    /// Rotates (and projects) queries once per call.
    Prepare,
    /// Attention pass 1: per-block softmax partials.
    Attend,
    /// Attention pass 2a: merges block partials in order.
    Merge,
    /// Attention pass 2b: normalizes and rotates each output back.
    Finish,
    /// Raw scores of every slot (tests, inspection).
    Scores,
}

impl Kernel {
    /// All kernels.
    pub const ALL: [Kernel; 7] = [
        Kernel::Encode,
        Kernel::Scatter,
        Kernel::Prepare,
        Kernel::Attend,
        Kernel::Merge,
        Kernel::Finish,
        Kernel::Scores,
    ];

    /// The file stem of the kernel's `.wgsl`.
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Encode => "encode",
            Kernel::Scatter => "scatter",
            Kernel::Prepare => "prepare",
            Kernel::Attend => "attend",
            Kernel::Merge => "merge",
            Kernel::Finish => "finish",
            Kernel::Scores => "scores",
        }
    }

    /// The assembled WGSL module (shared fragments, then the kernel's file).
    pub fn source(self) -> String {
        let parts: &[&str] = match self {
            Kernel::Encode => &[COMMON, encode::SOURCE],
            Kernel::Scatter => &[COMMON, scatter::SOURCE],
            Kernel::Prepare => &[COMMON, ATTN_PARAMS, prepare::SOURCE],
            Kernel::Attend => &[COMMON, ATTN_PARAMS, SCORE, attend::SOURCE],
            Kernel::Merge => &[COMMON, ATTN_PARAMS, merge::SOURCE],
            Kernel::Finish => &[COMMON, ATTN_PARAMS, finish::SOURCE],
            Kernel::Scores => &[COMMON, ATTN_PARAMS, SCORE, scores::SOURCE],
        };
        parts.join("\n")
    }

    /// Whether the module declares the pipeline constant `CHUNK` (query heads per workgroup).
    pub fn has_chunk_constant(self) -> bool {
        matches!(self, Kernel::Attend | Kernel::Scores)
    }

    /// The `CHUNK` a kernel is first compiled with (0 for kernels without the constant).
    pub fn default_chunk(self) -> u32 {
        match self {
            Kernel::Attend => MAX_GROUP as u32,
            Kernel::Scores => 1,
            _ => 0,
        }
    }

    /// The bindings of group 0 the module declares, in binding order.
    pub fn bindings(self) -> Vec<Binding> {
        let own: &[Binding] = match self {
            Kernel::Encode => &encode::BINDINGS,
            Kernel::Scatter => &scatter::BINDINGS,
            Kernel::Prepare => &prepare::BINDINGS,
            Kernel::Attend => &attend::BINDINGS,
            Kernel::Merge => &merge::BINDINGS,
            Kernel::Finish => &finish::BINDINGS,
            Kernel::Scores => &scores::BINDINGS,
        };
        let shared: &[Binding] = match self {
            Kernel::Encode | Kernel::Scatter => &[],
            _ => &ATTN_HEAD,
        };
        shared.iter().chain(own).copied().collect()
    }
}

/// The stream descriptor of `common.wgsl` (`StreamDesc`), 96 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub(crate) struct StreamDesc {
    pub kind: u32,
    pub dim: u32,
    pub bits: u32,
    pub record_words: u32,
    pub code_words: u32,
    pub scales: u32,
    pub levels: u32,
    pub pi_mode: u32,
    pub s_mode: u32,
    pub norm_correction: u32,
    pub pi_offset: u32,
    pub s_offset: u32,
    pub fwht_pi_offset: u32,
    pub fwht_s_offset: u32,
    pub centroid_offset: u32,
    pub threshold_offset: u32,
    pub gain_offset: u32,
    pub correction_offset: u32,
    pub groups: u32,
    pub group_offset: u32,
    pub centered: u32,
    pub mean_offset: u32,
    pub order: u32,
    pub planes_offset: u32,
}

/// `StreamDesc.centered` of a `center = "rope"` key stream (1: a mean-centered value stream).
pub(crate) const CENTER_ROPE: u32 = 2;

/// `StreamDesc.order` values: records in rows; in the fast-scan order of `tq_cache`
/// (`record_order`), as their own nibbles or through bit planes (a permutation table per KV
/// head at `planes_offset`).
pub(crate) const ORDER_ROWS: u32 = 0;
pub(crate) const ORDER_FAST_SCAN: u32 = 1;
pub(crate) const ORDER_PLANES: u32 = 2;

/// `StreamDesc.kind` values.
pub(crate) const KIND_F32: u32 = 0;
pub(crate) const KIND_F16: u32 = 1;
pub(crate) const KIND_MSE: u32 = 2;
pub(crate) const KIND_PROD: u32 = 3;

/// `StreamDesc.pi_mode` / `s_mode` values.
pub(crate) const MODE_DENSE: u32 = 0;
pub(crate) const MODE_FWHT: u32 = 1;
pub(crate) const MODE_DENSE_LANES: u32 = 2;

/// A dispatch grid: `total` workgroups folded into x (then y, then z) under the per-dimension
/// limit; kernels unfold it with `flat_workgroup` and skip ids `≥ total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Grid {
    pub x: u32,
    pub y: u32,
    pub z: u32,
}

impl Grid {
    /// The smallest grid of at least `total` workgroups with no dimension above `max`, or
    /// `None` when even `max³` workgroups are too few.
    pub(crate) fn new(total: u32, max: u32) -> Option<Grid> {
        let max = max.max(1);
        if total <= max {
            return Some(Grid {
                x: total.max(1),
                y: 1,
                z: 1,
            });
        }
        let rows = total.div_ceil(max);
        if rows <= max {
            return Some(Grid {
                x: max,
                y: rows,
                z: 1,
            });
        }
        let z = rows.div_ceil(max);
        (z <= max).then_some(Grid { x: max, y: max, z })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every flat id below `total` is covered exactly once, whatever the limit.
    #[test]
    fn grids_cover_every_workgroup_once() {
        for max in [1u32, 2, 3, 7, 64, 65535] {
            for total in [1u32, 2, 5, 49, 50, 64, 65, 343, 1000] {
                let Some(g) = Grid::new(total, max) else {
                    assert!(u64::from(total) > u64::from(max).pow(3));
                    continue;
                };
                assert!(g.x <= max && g.y <= max && g.z <= max);
                let capacity = u64::from(g.x) * u64::from(g.y) * u64::from(g.z);
                assert!(capacity >= u64::from(total), "max {max} total {total}");
                // flat = x + gx·(y + gy·z) enumerates 0..capacity bijectively.
                let mut seen = vec![false; capacity as usize];
                for z in 0..g.z {
                    for y in 0..g.y {
                        for x in 0..g.x {
                            let flat = x + g.x * (y + g.y * z);
                            assert!(!seen[flat as usize]);
                            seen[flat as usize] = true;
                        }
                    }
                }
            }
        }
    }
}
