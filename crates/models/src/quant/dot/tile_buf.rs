//! The unpacking space of the tile kernels.

/// Activation rows a tile kernel takes at once.
pub(crate) const TILE: usize = 8;

/// Weight blocks a tile kernel unpacks at once (a multiple of 8: segments are whole groups).
pub(crate) const SEG_BLOCKS: usize = 128;

/// 32 bytes aligned to 32 (one unpacked block).
#[derive(Clone, Copy)]
#[repr(C, align(32))]
pub(crate) struct Block32(pub(crate) [u8; 32]);

/// Unpacking space of a tile kernel: [`SEG_BLOCKS`] blocks as unsigned multiplicands, signed
/// weights, f32 scales and minima, and the scale products of each activation of a tile
/// (13 KiB, on the stack of each parallel task). Only the x86 tile kernels read it; elsewhere
/// it is never built.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) struct TileBuf {
    pub(crate) mag: [Block32; SEG_BLOCKS],
    pub(crate) sign: [Block32; SEG_BLOCKS],
    pub(crate) d: [f32; SEG_BLOCKS],
    pub(crate) m: [f32; SEG_BLOCKS],
    /// `d_w·d_x` per activation of the tile and block of the segment.
    pub(crate) dd: [[f32; SEG_BLOCKS]; TILE],
}

impl TileBuf {
    /// Zeroed space.
    pub(crate) fn new() -> Self {
        Self {
            mag: [Block32([0; 32]); SEG_BLOCKS],
            sign: [Block32([0; 32]); SEG_BLOCKS],
            d: [0.0; SEG_BLOCKS],
            m: [0.0; SEG_BLOCKS],
            dd: [[0.0; SEG_BLOCKS]; TILE],
        }
    }
}
