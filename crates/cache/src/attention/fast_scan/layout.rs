//! [`FastScanBlocks`]: the codes of 32 tokens stored coordinate-major, norms beside them.

use super::{BLOCK, FastScanError};

/// Bytes of one coordinate of one block: 32 four-bit codes (the cache's fast-scan order's).
pub(super) use crate::record_order::LANE_BYTES;

/// Compressed vectors (keys or values) in the fast-scan layout.
///
/// Block `k` holds tokens `32k .. 32k + 32`: for each rotated coordinate `j` (the dimension
/// padded with zero codes to a multiple of 4, so the vector kernels take whole registers),
/// 16 bytes where byte `i` holds token `i`'s code in its low nibble and token
/// `i + 16`'s in its high nibble; then the block's 32 norms (zero past the last token).
#[derive(Clone, Debug, PartialEq)]
pub struct FastScanBlocks {
    dim: usize,
    padded_dim: usize,
    bits: u8,
    len: usize,
    codes: Vec<u8>,
    norms: Vec<f32>,
}

impl FastScanBlocks {
    /// Empty keys of dimension `dim` with `bits`-bit codes (1 to 4).
    pub fn new(dim: usize, bits: u8) -> Result<Self, FastScanError> {
        if !(1..=4).contains(&bits) {
            return Err(FastScanError::UnsupportedBits { bits });
        }
        if dim == 0 {
            return Err(FastScanError::ZeroDim);
        }
        Ok(Self {
            dim,
            padded_dim: dim.next_multiple_of(4),
            bits,
            len: 0,
            codes: Vec::new(),
            norms: Vec::new(),
        })
    }

    /// Appends one token: its `dim` codes (each below `2^bits`) and its norm (the codec's
    /// stored scale).
    pub fn push(&mut self, codes: &[u8], norm: f32) -> Result<(), FastScanError> {
        if codes.len() != self.dim {
            return Err(FastScanError::LengthMismatch {
                what: "codes",
                expected: self.dim,
                actual: codes.len(),
            });
        }
        if let Some((coordinate, &code)) = codes
            .iter()
            .enumerate()
            .find(|&(_, &c)| u32::from(c) >> self.bits != 0)
        {
            return Err(FastScanError::CodeOutOfRange {
                code,
                coordinate,
                bits: self.bits,
            });
        }
        if !norm.is_finite() {
            return Err(FastScanError::NotFinite { what: "norm" });
        }
        let slot = self.len % BLOCK;
        if slot == 0 {
            self.codes
                .resize(self.codes.len() + self.padded_dim * LANE_BYTES, 0);
            self.norms.resize(self.norms.len() + BLOCK, 0.0);
        }
        let base = (self.len / BLOCK) * self.padded_dim * LANE_BYTES;
        let (byte, shift) = (slot % LANE_BYTES, 4 * (slot / LANE_BYTES));
        for (j, &code) in codes.iter().enumerate() {
            self.codes[base + j * LANE_BYTES + byte] |= code << shift;
        }
        self.norms[self.len] = norm;
        self.len += 1;
        Ok(())
    }

    /// The code of `token` at coordinate `j` (`None` out of range).
    pub fn code_at(&self, token: usize, j: usize) -> Option<u8> {
        if token >= self.len || j >= self.dim {
            return None;
        }
        let slot = token % BLOCK;
        let base = (token / BLOCK) * self.padded_dim * LANE_BYTES;
        let byte = self.codes[base + j * LANE_BYTES + slot % LANE_BYTES];
        Some((byte >> (4 * (slot / LANE_BYTES))) & 0x0F)
    }

    /// Tokens held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no token is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Blocks of 32 tokens (the last one possibly partial).
    pub fn blocks(&self) -> usize {
        self.len.div_ceil(BLOCK)
    }

    /// The head dimension.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Bits per code.
    pub fn bits(&self) -> u8 {
        self.bits
    }

    /// Bytes stored per token: the codes (a nibble per padded coordinate) and an f32 norm.
    pub fn bytes_per_token(&self) -> usize {
        self.padded_dim / 2 + 4
    }

    /// The norms of every token, in order.
    pub(super) fn norms(&self) -> &[f32] {
        &self.norms[..self.len]
    }

    /// The dimension padded with zero codes to a multiple of 4.
    pub(super) fn padded_dim(&self) -> usize {
        self.padded_dim
    }

    /// The code bytes of block `block` (`padded_dim · 16`).
    pub(super) fn block_codes(&self, block: usize) -> &[u8] {
        let stride = self.padded_dim * LANE_BYTES;
        &self.codes[block * stride..(block + 1) * stride]
    }

    /// The 32 norms of block `block`.
    pub(super) fn block_norms(&self, block: usize) -> &[f32] {
        &self.norms[block * BLOCK..(block + 1) * BLOCK]
    }
}
