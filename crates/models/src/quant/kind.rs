//! The weight formats and their block geometry.

use std::fmt;

use super::error::QuantError;

/// A ggml weight format, with the block layout ggml defines (`ggml-common.h`).
///
/// | format | values per block | bytes per block | layout (little-endian) |
/// |---|---|---|---|
/// | `F32` | 1 | 4 | the value |
/// | `F16` | 1 | 2 | IEEE half |
/// | `Q4_0` | 32 | 18 | f16 `d`, 16 bytes of nibbles; value `(q − 8)·d` |
/// | `Q4_1` | 32 | 20 | f16 `d`, f16 `m`, 16 bytes of nibbles; value `q·d + m` |
/// | `Q5_0` | 32 | 22 | f16 `d`, u32 `qh` of fifth bits, 16 bytes of nibbles; value `(q − 16)·d` |
/// | `Q8_0` | 32 | 34 | f16 `d`, 32 × i8 `q`; value `q·d` |
/// | `Q4_K` | 256 | 144 | f16 `d`, f16 `dmin`, 12 bytes of 6-bit scales/mins, 128 bytes of nibbles |
/// | `Q6_K` | 256 | 210 | 128 bytes low nibbles, 64 bytes high 2-bit pairs, 16 × i8 scales, f16 `d` |
///
/// In the 32-value nibble formats byte `j` holds element `j` in its low nibble and element
/// `j + 16` in its high nibble; in Q5_0 bit `j` of `qh` is the fifth (top) bit of element `j`,
/// so `q = nibble | (bit << 4)` is in 0..32. The K formats are described in
/// [`dequantize_row`](super::dequantize_row).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QuantKind {
    /// 32-bit float.
    F32,
    /// 16-bit IEEE float.
    F16,
    /// 4-bit symmetric, 32 per block.
    Q4_0,
    /// 4-bit with a per-block minimum, 32 per block.
    Q4_1,
    /// 5-bit symmetric, 32 per block.
    Q5_0,
    /// 8-bit symmetric, 32 per block.
    Q8_0,
    /// 4-bit K-quant: super-blocks of 256 in 8 sub-blocks with 6-bit scales and mins.
    Q4K,
    /// 6-bit K-quant: super-blocks of 256 in 16 sub-blocks with 8-bit scales.
    Q6K,
}

impl QuantKind {
    /// Every format, in ggml type-id order.
    pub const ALL: [QuantKind; 8] = [
        QuantKind::F32,
        QuantKind::F16,
        QuantKind::Q4_0,
        QuantKind::Q4_1,
        QuantKind::Q5_0,
        QuantKind::Q8_0,
        QuantKind::Q4K,
        QuantKind::Q6K,
    ];

    /// Values per block.
    pub const fn block_size(self) -> usize {
        match self {
            QuantKind::F32 | QuantKind::F16 => 1,
            QuantKind::Q4_0 | QuantKind::Q4_1 | QuantKind::Q5_0 | QuantKind::Q8_0 => 32,
            QuantKind::Q4K | QuantKind::Q6K => 256,
        }
    }

    /// Bytes per block.
    pub const fn block_bytes(self) -> usize {
        match self {
            QuantKind::F32 => 4,
            QuantKind::F16 => 2,
            QuantKind::Q4_0 => 18,
            QuantKind::Q4_1 => 20,
            QuantKind::Q5_0 => 22,
            QuantKind::Q8_0 => 34,
            QuantKind::Q4K => 144,
            QuantKind::Q6K => 210,
        }
    }

    /// The `ggml_type` id GGUF stores for this format.
    pub const fn ggml_type(self) -> u32 {
        match self {
            QuantKind::F32 => 0,
            QuantKind::F16 => 1,
            QuantKind::Q4_0 => 2,
            QuantKind::Q4_1 => 3,
            QuantKind::Q5_0 => 6,
            QuantKind::Q8_0 => 8,
            QuantKind::Q4K => 12,
            QuantKind::Q6K => 14,
        }
    }

    /// The format of a `ggml_type` id, if this module implements it.
    pub fn from_ggml_type(id: u32) -> Result<QuantKind, QuantError> {
        QuantKind::ALL
            .into_iter()
            .find(|k| k.ggml_type() == id)
            .ok_or(QuantError::UnsupportedGgmlType { id })
    }

    /// ggml's name (`F32`, `Q4_1`, `Q6_K`, …).
    pub const fn name(self) -> &'static str {
        match self {
            QuantKind::F32 => "F32",
            QuantKind::F16 => "F16",
            QuantKind::Q4_0 => "Q4_0",
            QuantKind::Q4_1 => "Q4_1",
            QuantKind::Q5_0 => "Q5_0",
            QuantKind::Q8_0 => "Q8_0",
            QuantKind::Q4K => "Q4_K",
            QuantKind::Q6K => "Q6_K",
        }
    }

    /// Whether [`QuantMatrix::matvec`](super::QuantMatrix::matvec) quantizes the activation to
    /// Q8 blocks and takes integer dot products (Q4_0, Q4_1, Q5_0, Q8_0), as opposed to
    /// multiplying dequantized weights by the f32 activation (the others).
    pub const fn has_q8_dot(self) -> bool {
        matches!(
            self,
            QuantKind::Q4_0 | QuantKind::Q4_1 | QuantKind::Q5_0 | QuantKind::Q8_0
        )
    }

    /// Bytes of a row of `cols` values: an error if `cols` is not a whole number of blocks
    /// (or the size overflows).
    pub fn row_bytes(self, cols: usize) -> Result<usize, QuantError> {
        let block = self.block_size();
        if !cols.is_multiple_of(block) {
            return Err(QuantError::NotBlockMultiple {
                kind: self,
                cols,
                block,
            });
        }
        (cols / block)
            .checked_mul(self.block_bytes())
            .ok_or(QuantError::SizeOverflow {
                kind: self,
                rows: 1,
                cols,
            })
    }
}

impl fmt::Display for QuantKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
