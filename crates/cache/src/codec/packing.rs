//! Bit packing of b-bit codes into little-endian `u32` words.
//!
//! Code `j` of a vector occupies bits `[j·b, (j+1)·b)` of the vector's bit stream, and bit `k` of
//! the stream is bit `k % 32` of word `k / 32`. A code may straddle two words (b = 3, 5, 6, 7).
//! This is the layout the GPU kernels read directly, so it is part of the on-disk format too:
//! changing it is a breaking change of the cache file version.

use crate::codec::CodecError;

/// Number of `u32` words that hold `len` codes of `bits` bits each.
///
/// ```
/// use tq_cache::codec::packing::words_for;
/// assert_eq!(words_for(128, 4), 16);
/// assert_eq!(words_for(64, 3), 6);
/// assert_eq!(words_for(5, 3), 1);
/// ```
pub const fn words_for(len: usize, bits: u8) -> usize {
    (len * bits as usize).div_ceil(32)
}

fn check_bits(bits: u8) -> Result<(), CodecError> {
    if (1..=8).contains(&bits) {
        Ok(())
    } else {
        Err(CodecError::UnsupportedBits {
            bits,
            supported: "1..=8",
        })
    }
}

/// Packs `codes` (each `< 2^bits`) into `words`, which must hold exactly `words_for(codes.len(), bits)` words.
///
/// Unused high bits of the last word are zero, so equal codes always give equal words.
///
/// ```
/// use tq_cache::codec::packing::{pack, unpack, words_for};
/// let codes = [1u8, 7, 0, 5, 3];
/// let mut words = vec![0u32; words_for(codes.len(), 3)];
/// pack(&codes, 3, &mut words).unwrap();
/// let mut back = [0u8; 5];
/// unpack(&words, 3, &mut back).unwrap();
/// assert_eq!(back, codes);
/// ```
pub fn pack(codes: &[u8], bits: u8, words: &mut [u32]) -> Result<(), CodecError> {
    check_bits(bits)?;
    let expected = words_for(codes.len(), bits);
    if words.len() != expected {
        return Err(CodecError::LengthMismatch {
            what: "packed words",
            expected,
            actual: words.len(),
        });
    }
    let max = (1u32 << bits) - 1;
    if let Some(&bad) = codes.iter().find(|&&c| u32::from(c) > max) {
        return Err(CodecError::CodeOutOfRange { code: bad, bits });
    }
    pack_unchecked_len(codes, bits, words);
    Ok(())
}

/// Packing without the range and length checks, for the encode hot path where the codes come
/// straight from the quantizer (always `< 2^bits`) and the caller sized `words` itself.
pub(crate) fn pack_unchecked_len(codes: &[u8], bits: u8, words: &mut [u32]) {
    let b = bits as usize;
    if 32 % b == 0 {
        // Codes never straddle a word: fill each word from a fixed-size group of codes.
        let per_word = 32 / b;
        for (word, group) in words.iter_mut().zip(codes.chunks(per_word)) {
            let mut acc = 0u32;
            for (i, &c) in group.iter().enumerate() {
                acc |= u32::from(c) << (i * b);
            }
            *word = acc;
        }
        return;
    }
    // General case through a 64-bit accumulator: flush whole words as they fill.
    let mut acc: u64 = 0;
    let mut filled = 0usize;
    let mut out = 0usize;
    for &c in codes {
        acc |= u64::from(c) << filled;
        filled += b;
        if filled >= 32 {
            words[out] = acc as u32;
            out += 1;
            acc >>= 32;
            filled -= 32;
        }
    }
    if filled > 0 {
        words[out] = acc as u32;
    }
}

/// Unpacks `codes.len()` codes of `bits` bits from `words`.
pub fn unpack(words: &[u32], bits: u8, codes: &mut [u8]) -> Result<(), CodecError> {
    check_bits(bits)?;
    let expected = words_for(codes.len(), bits);
    if words.len() != expected {
        return Err(CodecError::LengthMismatch {
            what: "packed words",
            expected,
            actual: words.len(),
        });
    }
    unpack_unchecked_len(words, bits, codes);
    Ok(())
}

/// Unpacking without the length check, for hot paths whose buffers were sized by the codec.
pub(crate) fn unpack_unchecked_len(words: &[u32], bits: u8, codes: &mut [u8]) {
    let b = bits as usize;
    let mask = (1u64 << b) - 1;
    if 32 % b == 0 {
        let per_word = 32 / b;
        for (group, &word) in codes.chunks_mut(per_word).zip(words) {
            for (i, c) in group.iter_mut().enumerate() {
                *c = ((u64::from(word) >> (i * b)) & mask) as u8;
            }
        }
        return;
    }
    let mut acc: u64 = 0;
    let mut available = 0usize;
    let mut next = 0usize;
    for c in codes.iter_mut() {
        if available < b {
            acc |= u64::from(words[next]) << available;
            next += 1;
            available += 32;
        }
        *c = (acc & mask) as u8;
        acc >>= b;
        available -= b;
    }
}

/// Reads code `index` directly from packed words (random access; the attention kernels use it).
///
/// Returns `None` when `index` lies outside `words`.
pub fn code_at(words: &[u32], bits: u8, index: usize) -> Option<u8> {
    let b = bits as usize;
    if !(1..=8).contains(&b) {
        return None;
    }
    let start = index * b;
    let word = start / 32;
    let shift = start % 32;
    let low = u64::from(*words.get(word)?);
    let high = if shift + b > 32 {
        u64::from(*words.get(word + 1)?)
    } else {
        0
    };
    Some((((low | (high << 32)) >> shift) & ((1u64 << b) - 1)) as u8)
}
