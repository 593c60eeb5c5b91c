//! [`FastScanBlocks`]: the codes of 32 tokens stored coordinate-major, norms beside them.

use super::{BLOCK, FastScanError};

/// Bytes of one nibble lane of one block: 32 nibbles (the cache's fast-scan order's).
pub(super) use crate::record_order::LANE_BYTES;

/// Codes of `bits` bits held by one nibble: four 1-bit or two 2-bit codes (`4 / b`, the
/// nibbles of their packed words), else one (a 3-bit code leaves a bit of its nibble unused).
pub(crate) const fn codes_per_lane(bits: u8) -> usize {
    match bits {
        1 => 4,
        2 => 2,
        _ => 1,
    }
}

/// Nibble lanes of a block of `dim` codes of `bits` bits: `⌈dim / codes_per_lane⌉` padded
/// with zero nibbles to a multiple of 4, so the vector kernels take whole registers.
pub(crate) const fn lanes_for(dim: usize, bits: u8) -> usize {
    dim.div_ceil(codes_per_lane(bits)).next_multiple_of(4)
}

/// Per position `i` of a nibble lane (`m` codes per nibble), the 16 entries
/// `codebook[(n >> b·i) mod 2^b]` that nibble `n` decodes to — with one code per nibble the
/// codebook itself, padded with defaults — and `m`: what the value sums look a lane up with.
pub(super) fn lane_tables<T: Copy + Default>(codebook: &[T], bits: u8) -> ([[T; 16]; 4], usize) {
    let per = codes_per_lane(bits);
    let mut tables = [[T::default(); 16]; 4];
    if per == 1 {
        tables[0][..codebook.len()].copy_from_slice(codebook);
    } else {
        let mask = (1usize << bits) - 1;
        for (i, table) in tables.iter_mut().enumerate().take(per) {
            for (n, t) in table.iter_mut().enumerate() {
                *t = codebook[(n >> (usize::from(bits) * i)) & mask];
            }
        }
    }
    (tables, per)
}

/// Compressed vectors (keys or values) in the fast-scan layout.
///
/// Block `k` holds tokens `32k .. 32k + 32` in **nibble lanes**: lane `l` holds, for each
/// token, the codes of coordinates `l·m .. l·m + m` packed into a nibble (`m` =
/// 4 / b codes for b = 1, 2, one code for b = 3, 4; code `l·m + i` in bits `b·i ..`, the order
/// [`packing`](crate::codec::packing) writes words in). A lane is 16 bytes, byte `i` holding
/// token `i`'s nibble in its low half and token `i + 16`'s in its high half; the lanes are
/// padded with zero nibbles to a multiple of 4. Then the block's 32 norms (zero past the last
/// token). So b = 2 costs half the bytes of b = 4, and the kernels look up `m` codes with
/// one byte shuffle.
#[derive(Clone, Debug, PartialEq)]
pub struct FastScanBlocks {
    dim: usize,
    lanes: usize,
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
            lanes: lanes_for(dim, bits),
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
                .resize(self.codes.len() + self.lanes * LANE_BYTES, 0);
            self.norms.resize(self.norms.len() + BLOCK, 0.0);
        }
        let base = (self.len / BLOCK) * self.lanes * LANE_BYTES;
        let (byte, shift) = (slot % LANE_BYTES, 4 * (slot / LANE_BYTES));
        let per = codes_per_lane(self.bits);
        for (j, &code) in codes.iter().enumerate() {
            let nibble = code << (usize::from(self.bits) * (j % per));
            self.codes[base + (j / per) * LANE_BYTES + byte] |= nibble << shift;
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
        let base = (token / BLOCK) * self.lanes * LANE_BYTES;
        let per = codes_per_lane(self.bits);
        let byte = self.codes[base + (j / per) * LANE_BYTES + slot % LANE_BYTES];
        let nibble = (byte >> (4 * (slot / LANE_BYTES))) & 0x0F;
        Some((nibble >> (usize::from(self.bits) * (j % per))) & ((1 << self.bits) - 1))
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

    /// Bytes stored per token: the codes (a nibble per lane) and an f32 norm.
    ///
    /// ```
    /// use tq_cache::attention::fast_scan::FastScanBlocks;
    /// assert_eq!(FastScanBlocks::new(64, 4).unwrap().bytes_per_token(), 32 + 4);
    /// assert_eq!(FastScanBlocks::new(64, 2).unwrap().bytes_per_token(), 16 + 4);
    /// assert_eq!(FastScanBlocks::new(64, 3).unwrap().bytes_per_token(), 32 + 4);
    /// ```
    pub fn bytes_per_token(&self) -> usize {
        self.lanes / 2 + 4
    }

    /// The norms of every token, in order.
    pub(super) fn norms(&self) -> &[f32] {
        &self.norms[..self.len]
    }

    /// Nibble lanes per block ([`lanes_for`]).
    pub(super) fn lanes(&self) -> usize {
        self.lanes
    }

    /// The code bytes of block `block` (`lanes · 16`).
    pub(super) fn block_codes(&self, block: usize) -> &[u8] {
        let stride = self.lanes * LANE_BYTES;
        &self.codes[block * stride..(block + 1) * stride]
    }

    /// The 32 norms of block `block`.
    pub(super) fn block_norms(&self, block: usize) -> &[f32] {
        &self.norms[block * BLOCK..(block + 1) * BLOCK]
    }
}
