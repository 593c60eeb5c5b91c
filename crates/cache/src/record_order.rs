//! How a [`TokenStore`](crate::token_store::TokenStore) lays its records out in memory.
//!
//! [`RecordOrder::Rows`] keeps each record's words together (token-major), what every codec
//! writes and reads. [`RecordOrder::FastScan`] keeps records **32 tokens at a time,
//! nibble-major**: the layout of the fast-scan kernel
//! ([`attention::fast_scan`](crate::attention::fast_scan)), in which one byte shuffle looks up
//! a nibble's table entries for 32 tokens at once. A record of `w` words is `8w` nibbles
//! (nibble `k` of a record is bits `4(k mod 8) ..` of its word `k / 8`), which hold one 4-bit,
//! two 2-bit or four 1-bit codes each in the order [`packing`](crate::codec::packing) writes
//! them. A block of 32 records is `8w · 16` bytes: for each nibble lane `k`, 16 bytes, byte `i`
//! holding token `i`'s nibble in its low half and token `i + 16`'s in its high half. The same
//! bytes as the records, permuted, so a fast-scan store costs what a row store does; the
//! scales (norms) stay token-major beside the codes.
//!
//! **Bit planes.** A code of 3 or 5 to 8 bits straddles nibbles in the packed words, so a
//! record holding such codes is first permuted bit by bit ([`BitPlanes`]): each run of them
//! is stored as planes of 4, 2 and 1 of its bits ([`plane_spans`]: 3 = 2 + 1, 5 = 4 + 1,
//! 6 = 4 + 2, 7 = 4 + 2 + 1, 8 = 4 + 4), each plane whole in nibbles as 4-, 2- and 1-bit codes
//! are, within the run's own words. The kernels put a code back together from its planes (a
//! shift, a mask and an or per plane) and look it up whole.

use serde::{Deserialize, Serialize};

/// Tokens per block of the fast-scan order (and of the kernel's standalone layout,
/// [`fast_scan::BLOCK`](crate::attention::fast_scan::BLOCK), which is this constant).
pub const FAST_SCAN_BLOCK: usize = 32;

/// Bytes of one nibble lane of a block: 32 nibbles.
pub(crate) const LANE_BYTES: usize = FAST_SCAN_BLOCK / 2;

/// The memory order of a store's records.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RecordOrder {
    /// Token-major: each record's words contiguous.
    #[default]
    Rows,
    /// Records in blocks of 32 tokens, nibble-major (the module docs).
    FastScan,
}

/// Bytes of a fast-scan block of records of `record_words` words (what 32 records take in
/// rows).
pub fn block_bytes(record_words: usize) -> usize {
    record_words * 8 * LANE_BYTES
}

/// Writes `record` (words of packed codes, read as nibbles) into slot `slot` (< 32) of `block`
/// ([`block_bytes`] long): for nibble `k` of the record, byte `16k + slot mod 16`, the low
/// half for slots below 16. The other slots' nibbles are kept.
///
/// ```
/// use tq_cache::record_order::{block_bytes, gather, scatter};
/// let mut block = vec![0u8; block_bytes(1)];
/// scatter(&[0x8765_4321], 17, &mut block);
/// // Nibble 0 (1) of slot 17: lane 0, byte 1, high half; nibble 7 (8): lane 7.
/// assert_eq!((block[1], block[7 * 16 + 1]), (0x10, 0x80));
/// let mut back = [0u32];
/// gather(&block, 17, &mut back);
/// assert_eq!(back, [0x8765_4321]);
/// ```
pub fn scatter(record: &[u32], slot: usize, block: &mut [u8]) {
    let (byte, shift) = (slot % LANE_BYTES, 4 * (slot / LANE_BYTES));
    let keep = !(0x0Fu8 << shift);
    for (w, &word) in record.iter().enumerate() {
        for k in 0..8 {
            let code = ((word >> (4 * k)) & 0x0F) as u8;
            let b = &mut block[(8 * w + k) * LANE_BYTES + byte];
            *b = (*b & keep) | (code << shift);
        }
    }
}

/// Reads slot `slot` (< 32) of `block` back into `record`: the inverse of [`scatter`].
pub fn gather(block: &[u8], slot: usize, record: &mut [u32]) {
    let (byte, shift) = (slot % LANE_BYTES, 4 * (slot / LANE_BYTES));
    for (w, word) in record.iter_mut().enumerate() {
        *word = (0..8).fold(0u32, |acc, k| {
            let code = (block[(8 * w + k) * LANE_BYTES + byte] >> shift) & 0x0F;
            acc | u32::from(code) << (4 * k)
        });
    }
}

/// One run of `b`-bit codes in a record, packed as [`packing`](crate::codec::packing) packs
/// them: code `j` in bits `j·b ..` of the run's words (a TQ_mse record, or one equal-bit group
/// of a basis record).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CodeRun {
    /// Bits per code, 1 to 8.
    pub bits: u8,
    /// Codes in the run.
    pub dim: usize,
    /// The run's first word in the record.
    pub first_word: usize,
    /// Words of the run (at least `⌈dim·b / 32⌉`).
    pub words: usize,
}

/// One bit plane of a run in the fast-scan order: bits `shift .. shift + width` of each code,
/// `4 / width` codes per nibble (code `j` of the plane in bits `width·(j mod m)` of its
/// nibble `first_lane + j / m`), in lanes `first_lane .. first_lane + lanes` of a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlaneSpan {
    /// Bits of the code the plane holds: 4, 2 or 1.
    pub width: u8,
    /// The lowest of them.
    pub shift: u8,
    /// The plane's first nibble lane.
    pub first_lane: usize,
    /// Its lanes: `⌈dim / m⌉`.
    pub lanes: usize,
}

/// The planes of one run ([`plane_spans`]), widest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlaneSpans {
    spans: [PlaneSpan; 3],
    len: usize,
}

impl std::ops::Deref for PlaneSpans {
    type Target = [PlaneSpan];

    fn deref(&self) -> &[PlaneSpan] {
        &self.spans[..self.len]
    }
}

/// The planes of a run: one for 1, 2 and 4 bits (the packed words' own nibbles), else the
/// binary digits of `b` in 4, 2 and 1 (3 = 2 + 1, 5 = 4 + 1, 6 = 4 + 2, 7 = 4 + 2 + 1,
/// 8 = 4 + 4), the low bits in the first plane; each plane's lanes follow the previous
/// one's from the run's first lane. `None` for a width outside 1 to 8 or planes that do not
/// fit the run's words (a dimension whose planes round up past them).
///
/// ```
/// use tq_cache::record_order::{CodeRun, plane_spans};
/// let run = CodeRun { bits: 6, dim: 16, first_word: 1, words: 3 };
/// let planes = plane_spans(&run).unwrap();
/// // 16 four-bit nibbles (lanes 8..24), then 16 two-bit codes two per nibble (24..32).
/// assert_eq!(planes.iter().map(|p| (p.width, p.shift, p.first_lane, p.lanes)).collect::<Vec<_>>(),
///            vec![(4, 0, 8, 16), (2, 4, 24, 8)]);
/// ```
pub fn plane_spans(run: &CodeRun) -> Option<PlaneSpans> {
    let spans = planes_from(run.bits, run.dim, 8 * run.first_word)?;
    let end = spans.last().map_or(0, |p| p.first_lane + p.lanes);
    (end <= 8 * (run.first_word + run.words)).then_some(spans)
}

/// The planes of `dim` codes of `bits` bits from nibble lane `first_lane` on (the kernels'
/// view of a part whose words were checked by [`plane_spans`] when its store was built).
pub(crate) fn planes_from(bits: u8, dim: usize, first_lane: usize) -> Option<PlaneSpans> {
    let widths: &[u8] = match bits {
        1 => &[1],
        2 => &[2],
        3 => &[2, 1],
        4 => &[4],
        5 => &[4, 1],
        6 => &[4, 2],
        7 => &[4, 2, 1],
        8 => &[4, 4],
        _ => return None,
    };
    let empty = PlaneSpan {
        width: 0,
        shift: 0,
        first_lane: 0,
        lanes: 0,
    };
    let mut out = PlaneSpans {
        spans: [empty; 3],
        len: widths.len(),
    };
    let (mut lane, mut shift) = (first_lane, 0);
    for (span, &width) in out.spans.iter_mut().zip(widths) {
        let lanes = dim.div_ceil(usize::from(4 / width));
        *span = PlaneSpan {
            width,
            shift,
            first_lane: lane,
            lanes,
        };
        lane += lanes;
        shift += width;
    }
    Some(out)
}

/// A bit permutation of records for the fast-scan order: runs of codes whose width is not 1, 2
/// or 4 are stored as their bit planes ([`plane_spans`]), so each plane's codes sit whole in
/// nibbles as 1-, 2- and 4-bit codes do; every other bit of the record keeps its place. The
/// same bits, moved: a record written and read back through it is unchanged, its runs'
/// padding bits (past their codes, zero as [`packing`](crate::codec::packing) writes them)
/// read back as zero.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BitPlanes {
    /// `source[k]`: the record bit stored at bit `k` of the permuted record (bit `k mod 4` of
    /// nibble `k / 4`), [`NO_BIT`] for a padding bit (zero).
    source: Vec<u16>,
}

/// [`BitPlanes::source`] of a padding bit.
const NO_BIT: u16 = u16::MAX;

/// Why a record's runs have no fast-scan order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlaneError {
    /// A run's planes do not fit its words, its width is not 1 to 8, or it leaves the record.
    #[error("a run of {dim} codes of {bits} bits in words {first_word}.. does not take bit planes")]
    RunDoesNotFit {
        /// The run's width.
        bits: u8,
        /// Its codes.
        dim: usize,
        /// Its first word.
        first_word: usize,
    },
    /// A record of more than 2048 words (bit indices are 16-bit).
    #[error("records of {words} words are too long for the fast-scan order")]
    RecordTooLong {
        /// The record's words.
        words: usize,
    },
}

impl BitPlanes {
    /// The permutation of records of `record_words` words holding `runs`: `Ok(None)` where
    /// every run has 1, 2 or 4 bits (the identity: records are read as their own nibbles).
    pub fn new(record_words: usize, runs: &[CodeRun]) -> Result<Option<Self>, PlaneError> {
        let bits = 32 * record_words;
        if bits > usize::from(NO_BIT) {
            return Err(PlaneError::RecordTooLong {
                words: record_words,
            });
        }
        let mut wide = false;
        let mut source: Vec<u16> = (0..bits as u16).collect();
        for run in runs {
            let unfit = PlaneError::RunDoesNotFit {
                bits: run.bits,
                dim: run.dim,
                first_word: run.first_word,
            };
            let spans = plane_spans(run).ok_or(unfit)?;
            if run.first_word + run.words > record_words {
                return Err(unfit);
            }
            if spans.len() == 1 {
                continue;
            }
            wide = true;
            let base = 32 * run.first_word;
            source[base..base + 32 * run.words].fill(NO_BIT);
            let b = usize::from(run.bits);
            for span in spans.iter() {
                let (w, m) = (usize::from(span.width), usize::from(4 / span.width));
                for j in 0..run.dim {
                    let nibble = span.first_lane + j / m;
                    for t in 0..w {
                        let at = 4 * nibble + w * (j % m) + t;
                        source[at] = (base + j * b + usize::from(span.shift) + t) as u16;
                    }
                }
            }
        }
        Ok(wide.then_some(Self { source }))
    }

    /// Words of the records it permutes.
    pub fn record_words(&self) -> usize {
        self.source.len() / 32
    }

    /// The record bit stored at bit `k` of a permuted record (bit `k mod 4` of nibble `k / 4`),
    /// `None` for a padding bit (stored as zero) or `k` past the record.
    ///
    /// ```
    /// use tq_cache::record_order::{BitPlanes, CodeRun};
    /// // 8 codes of 3 bits in one word: the 2-bit plane (bits 0-1 of each code) in nibbles
    /// // 0-3, the 1-bit plane (bit 2) in nibbles 4-5.
    /// let run = CodeRun { bits: 3, dim: 8, first_word: 0, words: 1 };
    /// let planes = BitPlanes::new(1, &[run])?.unwrap();
    /// assert_eq!(planes.source_bit(2), Some(3)); // code 1's bit 0
    /// assert_eq!(planes.source_bit(16), Some(2)); // code 0's bit 2
    /// assert_eq!(planes.source_bit(24), None); // past the planes
    /// # Ok::<(), tq_cache::record_order::PlaneError>(())
    /// ```
    pub fn source_bit(&self, k: usize) -> Option<usize> {
        self.source
            .get(k)
            .filter(|&&s| s != NO_BIT)
            .map(|&s| usize::from(s))
    }

    /// `record` permuted into `out` (both `record_words` long).
    pub fn permute(&self, record: &[u32], out: &mut [u32]) {
        out.fill(0);
        for (k, &src) in self.source.iter().enumerate() {
            if src != NO_BIT {
                let bit = (record[usize::from(src) / 32] >> (src % 32)) & 1;
                out[k / 32] |= bit << (k % 32);
            }
        }
    }

    /// The inverse of [`permute`](Self::permute): `permuted` back into `record`.
    pub fn restore(&self, permuted: &[u32], record: &mut [u32]) {
        record.fill(0);
        for (k, &src) in self.source.iter().enumerate() {
            if src != NO_BIT {
                let bit = (permuted[k / 32] >> (k % 32)) & 1;
                record[usize::from(src) / 32] |= bit << (src % 32);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scatter_then_gather_is_the_identity_and_leaves_other_slots() {
        let w = 3;
        let mut block = vec![0u8; block_bytes(w)];
        let records: Vec<Vec<u32>> = (0..FAST_SCAN_BLOCK as u32)
            .map(|t| {
                (0..w as u32)
                    .map(|i| t.wrapping_mul(0x9E37_79B9) ^ i)
                    .collect()
            })
            .collect();
        for (slot, r) in records.iter().enumerate() {
            scatter(r, slot, &mut block);
        }
        // Overwrite one slot twice: the last write wins, the others are untouched.
        scatter(&[u32::MAX; 3], 7, &mut block);
        scatter(&records[7], 7, &mut block);
        let mut back = vec![0u32; w];
        for (slot, r) in records.iter().enumerate() {
            gather(&block, slot, &mut back);
            assert_eq!(&back, r, "slot {slot}");
        }
        // Coordinate 9 of token 20: word 1, nibble 1; byte 9·16 + 4, high nibble.
        let code = (records[20][1] >> 4) & 0x0F;
        assert_eq!(u32::from(block[9 * 16 + 4] >> 4), code);
    }

    /// Records of runs of every width 1 to 8 (dimensions that round their planes up, and a
    /// word outside any run) come back unchanged through the planes; each wide code's bits
    /// sit in its planes' nibbles where `plane_spans` says; a run whose planes do not fit its
    /// words is refused.
    #[test]
    fn bit_planes_move_each_code_into_its_planes_and_back() {
        use crate::codec::packing::{pack, words_for};
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for bits in 1..=8u8 {
            for dim in [4usize, 12, 16, 28, 64] {
                // A 2-bit run, the run under test, then a word no run holds.
                let lead = CodeRun {
                    bits: 2,
                    dim: 16,
                    first_word: 0,
                    words: 1,
                };
                let words = words_for(dim, bits);
                let run = CodeRun {
                    bits,
                    dim,
                    first_word: 1,
                    words,
                };
                let record_words = 1 + words + 1;
                let Some(spans) = plane_spans(&run) else {
                    assert!(BitPlanes::new(record_words, &[lead, run]).is_err());
                    continue;
                };
                let planes = BitPlanes::new(record_words, &[lead, run]).unwrap();
                assert_eq!(planes.is_some(), !matches!(bits, 1 | 2 | 4), "{bits} bits");
                for _ in 0..20 {
                    let codes: Vec<u8> = (0..dim).map(|_| (next() % (1 << bits)) as u8).collect();
                    let mut record = vec![0u32; record_words];
                    record[0] = next() as u32;
                    pack(&codes, bits, &mut record[1..1 + words]).unwrap();
                    record[record_words - 1] = next() as u32;
                    let Some(planes) = &planes else { continue };
                    let mut permuted = vec![0u32; record_words];
                    planes.permute(&record, &mut permuted);
                    let mut back = vec![0u32; record_words];
                    planes.restore(&permuted, &mut back);
                    assert_eq!(back, record, "{bits} bits, d = {dim}");
                    assert_eq!(
                        (permuted[0], permuted[record_words - 1]),
                        (record[0], record[record_words - 1])
                    );
                    let nibble = |lane: usize| (permuted[lane / 8] >> (4 * (lane % 8))) & 0x0F;
                    for (j, &code) in codes.iter().enumerate() {
                        let rebuilt = spans.iter().fold(0u32, |acc, p| {
                            let m = usize::from(4 / p.width);
                            let sub = (nibble(p.first_lane + j / m)
                                >> (u32::from(p.width) * (j % m) as u32))
                                & ((1 << p.width) - 1);
                            acc | sub << p.shift
                        });
                        assert_eq!(rebuilt, u32::from(code), "{bits} bits, d = {dim}, code {j}");
                    }
                }
            }
        }
        // 9 codes of 7 bits: 63 bits in 2 words (16 nibbles), planes of 9 + 5 + 3 nibbles.
        let tight = CodeRun {
            bits: 7,
            dim: 9,
            first_word: 0,
            words: 2,
        };
        assert!(plane_spans(&tight).is_none());
        assert_eq!(
            BitPlanes::new(2, &[tight]),
            Err(PlaneError::RunDoesNotFit {
                bits: 7,
                dim: 9,
                first_word: 0
            })
        );
        let outside = CodeRun {
            bits: 3,
            dim: 8,
            first_word: 1,
            words: 1,
        };
        assert!(BitPlanes::new(1, &[outside]).is_err());
    }
}
