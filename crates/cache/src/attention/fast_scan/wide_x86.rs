//! x86 forms of the bit-plane pass ([`wide`](super::wide)): the same integers as its loops.
//!
//! A coordinate's 32 codes are put back together in one 256-bit register, four coordinates
//! at a time (`group`): each plane lane's 16 bytes are loaded into both 128-bit halves
//! and turned into one nibble per token (the upper half shifted by 4: tokens 16–31), and a
//! byte shuffle per coordinate maps the nibble to the coordinate's bits of the code. Keys
//! then look two coordinates' codes up at once in their two 64-byte tables (one `vpermi2b`
//! for the entries' low bytes, one for their high bytes), or one coordinate's in its 128 or
//! 256 entries; values look the codes up in the centroid
//! bytes and pair them with the weight bytes (`vpmaddubsw`).

use std::arch::x86_64::*;

use super::BLOCK;
use super::table::{ScoreTable, WidePart};
use super::values_int::ValueTables;
use crate::attention::simd::Isa;
use crate::record_order::LANE_BYTES;

/// Whether the AVX-512 form runs: [`Isa::Avx512`] (F, BW, VL and VBMI) asked for and present.
pub(super) fn vbmi(isa: Isa) -> bool {
    isa == Isa::Avx512 && isa.is_available()
}

/// The nibbles of lane `lane` of a block, one byte per token (tokens 0–15 from the low
/// nibbles, 16–31 from the high ones); zeros for a lane past the block (the padding lanes of
/// a part's last group of four coordinates may lie past a record's last part).
///
/// # Safety
/// AVX2 must be available.
#[inline]
#[target_feature(enable = "avx2")]
fn nibbles(block: &[u8], lane: usize) -> __m256i {
    let at = lane * LANE_BYTES;
    let Some(bytes) = block.get(at..at + LANE_BYTES) else {
        return _mm256_setzero_si256();
    };
    // SAFETY: `bytes` holds 16 bytes.
    let v = unsafe { _mm_loadu_si128(bytes.as_ptr().cast()) };
    // The upper half shifted by 4 more: the high nibbles. Bits of the next byte that the
    // 32-bit shift brings down land at bit 4 or above, which the mask drops.
    let both = _mm256_srlv_epi32(
        _mm256_broadcastsi128_si256(v),
        _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4),
    );
    _mm256_and_si256(both, _mm256_set1_epi8(0x0F))
}

/// The plane widths of a `bits`-bit code, low bits first, 0 past the last plane (what
/// [`planes_from`](crate::record_order::planes_from) gives, as a constant for the kernels).
const fn widths(bits: u8) -> [u8; 3] {
    match bits {
        3 => [2, 1, 0],
        5 => [4, 1, 0],
        6 => [4, 2, 0],
        7 => [4, 2, 1],
        8 => [4, 4, 0],
        _ => [0; 3],
    }
}

/// The 32 codes of coordinates `4k .. 4k + 4` of `part`, a part of `B`-bit codes (those past
/// the part's are not defined): per plane, the lanes of the group's coordinates (`width` of
/// them, `m = 4 / width` codes per nibble) are read once, and a byte shuffle per coordinate
/// maps a nibble to that coordinate's sub-code in its place in the code
/// ([`WidePart::luts`]); an or puts the planes together. `B` a constant, so the loops unroll
/// and the codes stay in registers.
///
/// # Safety
/// AVX2 must be available (it is inlined into the AVX2 and AVX-512 kernels).
#[inline(always)]
unsafe fn group<const B: u8>(part: &WidePart, block: &[u8], k: usize) -> [__m256i; 4] {
    debug_assert_eq!(part.bits, B);
    let widths = const { widths(B) };
    // SAFETY: AVX2 is available (the caller's contract); every `lut` holds 16 bytes.
    unsafe {
        let mut codes = [_mm256_setzero_si256(); 4];
        for (p, &width) in widths.iter().enumerate() {
            if width == 0 {
                break;
            }
            let (w, m) = (usize::from(width), usize::from(4 / width));
            let first = part.spans[p].first_lane;
            for l in 0..w {
                let n = nibbles(block, first + k * w + l);
                for i in 0..m {
                    let lut = _mm256_broadcastsi128_si256(_mm_loadu_si128(
                        part.luts[p][i].as_ptr().cast(),
                    ));
                    codes[l * m + i] =
                        _mm256_or_si256(codes[l * m + i], _mm256_shuffle_epi8(lut, n));
                }
            }
        }
        codes
    }
}

/// 64 bytes of `entries` from `at` (a wide table is padded to at least 64 bytes).
///
/// # Safety
/// AVX-512 F must be available; `at + 64 ≤ entries.len()` (asserted).
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn table64(entries: &[u8], at: usize) -> __m512i {
    assert!(at + 64 <= entries.len());
    // SAFETY: bytes `at .. at + 64` lie in `entries` (asserted just above).
    unsafe { _mm512_loadu_si512(entries.as_ptr().add(at).cast()) }
}

/// Adds bytes `0..32` and `32..64` of `r` (two coordinates of the same 32 tokens, or one with
/// an upper half of zeros) to the 16-bit sums of the tokens.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn add_bytes(acc: __m512i, r: __m512i) -> __m512i {
    let lo = _mm512_cvtepu8_epi16(_mm512_castsi512_si256(r));
    let hi = _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64::<1>(r));
    _mm512_add_epi16(acc, _mm512_add_epi16(lo, hi))
}

/// Most heads one pass scores (the tiles of `sums_tile`).
const HEADS: usize = 4;

/// Most wide coordinates summed in 16 bits before they are added to the 32-bit sums
/// (255 each: 257 of them fit, 256 keep pairs whole).
const FLUSH: usize = 256;

/// [`add_sums_scalar`](super::wide::add_sums_scalar) with byte permutes: the same integers.
///
/// # Safety
/// AVX-512 F, BW, VL and VBMI (with AVX2) must be available; every table must have the
/// wide parts of `tables[0]` (one record layout).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2")]
pub(super) unsafe fn add_sums_vbmi(tables: &[ScoreTable], block: &[u8], out: &mut [[u32; BLOCK]]) {
    let parts = tables[0].wide();
    let heads = tables.len().min(out.len());
    assert!(heads <= HEADS && tables.iter().all(|t| t.wide().len() == parts.len()));
    // Per head, the 16-bit sums of the entries' low bytes and of their high bytes.
    let mut acc = [[_mm512_setzero_si512(); 2]; HEADS];
    let mut summed = 0;
    for (p, part) in parts.iter().enumerate() {
        let (acc, out) = (&mut acc[..heads], &mut out[..heads]);
        let tables = &tables[..heads];
        // SAFETY: the features are enabled here; the part's width is its `B`.
        unsafe {
            match part.bits {
                3 => part_sums::<3>(part, p, tables, block, acc, &mut summed, out),
                5 => part_sums::<5>(part, p, tables, block, acc, &mut summed, out),
                6 => part_sums::<6>(part, p, tables, block, acc, &mut summed, out),
                7 => part_sums::<7>(part, p, tables, block, acc, &mut summed, out),
                _ => part_sums::<8>(part, p, tables, block, acc, &mut summed, out),
            }
        }
    }
    flush(&mut acc[..heads], &mut out[..heads]);
}

/// [`add_sums_vbmi`] for part `p` (`part`, of `B`-bit codes): its coordinates' entries added
/// to the 16-bit sums `acc` (flushed to `out` before `summed` would pass [`FLUSH`]).
///
/// # Safety
/// As [`add_sums_vbmi`].
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2")]
unsafe fn part_sums<const B: u8>(
    part: &WidePart,
    p: usize,
    tables: &[ScoreTable],
    block: &[u8],
    acc: &mut [[__m512i; 2]],
    summed: &mut usize,
    out: &mut [[u32; BLOCK]],
) {
    for k in 0..part.dim.div_ceil(4) {
        if *summed + 4 > FLUSH {
            flush(acc, out);
            *summed = 0;
        }
        // SAFETY: AVX2 is enabled here.
        let codes = unsafe { group::<B>(part, block, k) };
        let valid = (part.dim - 4 * k).min(4);
        *summed += valid;
        let mut i = 0;
        while i < valid {
            let j = 4 * k + i;
            if B <= 6 && i + 1 < valid {
                // Two coordinates in one look-up: the second one's codes index the second
                // table (bit 6 set).
                let idx = _mm512_inserti64x4::<1>(
                    _mm512_castsi256_si512(codes[i]),
                    _mm256_or_si256(codes[i + 1], _mm256_set1_epi8(64)),
                );
                for (acc, table) in acc.iter_mut().zip(tables) {
                    let (e, own) = (table.wide_entries(), &table.wide()[p]);
                    let (a, b, len) = (own.entries(j), own.entries(j + 1), own.table_len());
                    for (half, acc) in acc.iter_mut().enumerate() {
                        // SAFETY: AVX-512 F is enabled here; lengths asserted in `table64`.
                        let (ta, tb) =
                            unsafe { (table64(e, a + half * len), table64(e, b + half * len)) };
                        *acc = add_bytes(*acc, _mm512_permutex2var_epi8(ta, idx, tb));
                    }
                }
                i += 2;
                continue;
            }
            let idx = _mm512_castsi256_si512(codes[i]);
            // The 32 tokens; the upper half of `idx` is not defined.
            let keep = 0xFFFF_FFFF_u64;
            for (acc, table) in acc.iter_mut().zip(tables) {
                let own = &table.wide()[p];
                let (e, len) = (table.wide_entries(), own.table_len());
                for (half, acc) in acc.iter_mut().enumerate() {
                    let at = own.entries(j) + half * len;
                    // SAFETY: AVX-512 F is enabled here; lengths asserted in `table64` (a
                    // table of `2^b` entries spans `2^b / 64` loads).
                    let r = unsafe {
                        match B {
                            0..=6 => _mm512_permutexvar_epi8(idx, table64(e, at)),
                            7 => _mm512_permutex2var_epi8(table64(e, at), idx, table64(e, at + 64)),
                            _ => {
                                let low = _mm512_permutex2var_epi8(
                                    table64(e, at),
                                    idx,
                                    table64(e, at + 64),
                                );
                                let high = _mm512_permutex2var_epi8(
                                    table64(e, at + 128),
                                    idx,
                                    table64(e, at + 192),
                                );
                                _mm512_mask_blend_epi8(_mm512_movepi8_mask(idx), low, high)
                            }
                        }
                    };
                    *acc = add_bytes(*acc, _mm512_maskz_mov_epi8(keep, r));
                }
            }
            i += 1;
        }
    }
}

/// Adds the 16-bit sums of each head to its 32-bit sums (the low bytes' sum plus 256 times
/// the high bytes') and zeroes them.
///
/// # Safety
/// AVX-512 F and BW must be available.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn flush(acc: &mut [[__m512i; 2]], out: &mut [[u32; BLOCK]]) {
    for (sums, [low, high]) in out.iter_mut().zip(acc) {
        for half in 0..2 {
            let words = |v: __m512i| {
                _mm512_cvtepu16_epi32(if half == 0 {
                    _mm512_castsi512_si256(v)
                } else {
                    _mm512_extracti64x4_epi64::<1>(v)
                })
            };
            let add = _mm512_add_epi32(words(*low), _mm512_slli_epi32::<8>(words(*high)));
            let at = &mut sums[16 * half..16 * half + 16];
            // SAFETY: `at` holds 16 u32 (64 bytes).
            unsafe {
                let old = _mm512_loadu_si512(at.as_ptr().cast());
                _mm512_storeu_si512(at.as_mut_ptr().cast(), _mm512_add_epi32(old, add));
            }
        }
        *low = _mm512_setzero_si512();
        *high = _mm512_setzero_si512();
    }
}

/// The centroid bytes of 32 codes: `e[code]`, one `vpshufb` per 16 entries of the table
/// (blended on the code's high bits where it has more than 4).
///
/// # Safety
/// AVX2 must be available.
#[inline]
#[target_feature(enable = "avx2")]
fn centroid_bytes(tables: &[__m256i; 16], bits: u8, codes: __m256i) -> __m256i {
    // `vpshufb` reads the low 4 bits (a code is below 2^8, but bit 7 zeroes the result, so
    // the index is masked first).
    let low = _mm256_and_si256(codes, _mm256_set1_epi8(0x0F));
    let mut out = _mm256_shuffle_epi8(tables[0], low);
    if bits > 4 {
        let high = _mm256_and_si256(_mm256_srli_epi16::<4>(codes), _mm256_set1_epi8(0x0F));
        for (k, table) in tables.iter().enumerate().take(1 << (bits - 4)).skip(1) {
            let hit = _mm256_cmpeq_epi8(high, _mm256_set1_epi8(k as i8));
            out = _mm256_blendv_epi8(out, _mm256_shuffle_epi8(*table, low), hit);
        }
    }
    out
}

/// Coordinates summed per pass of [`accumulate_block_avx2`]: one 32-bit sum each in the
/// eight lanes of one register.
const PASS: usize = 8;

/// [`accumulate_block`](super::wide::accumulate_block) on AVX2: eight coordinates at a time,
/// their codes gathered in registers and looked up in the centroid bytes (shared by the
/// heads), then per head paired with the weight bytes (`vpmaddubsw`, `vpmaddwd`) and reduced
/// to one exact 32-bit sum per coordinate (three rounds of horizontal adds); the same
/// integers and float steps, so the same bits.
///
/// # Safety
/// AVX2 must be available; `coords`' lanes must lie in `block`, `lanes` hold
/// `weights.len() · rows` values with `coords.len() ≤ rows`.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn accumulate_block_avx2(
    part: &WidePart,
    block: &[u8],
    rows: usize,
    tables: &ValueTables,
    weights: &[[u8; BLOCK]],
    scales: &[f32],
    lanes: &mut [f32],
) {
    assert!(part.dim <= rows && lanes.len() >= weights.len() * rows);
    assert_eq!(scales.len(), weights.len());
    let args = (part, block, rows, tables, weights, scales, lanes);
    // SAFETY: AVX2 is enabled here; the part's width is its `B`.
    unsafe {
        match part.bits {
            3 => block_avx2::<3>(args),
            5 => block_avx2::<5>(args),
            6 => block_avx2::<6>(args),
            7 => block_avx2::<7>(args),
            _ => block_avx2::<8>(args),
        }
    }
}

/// The arguments of [`accumulate_block_avx2`].
type BlockArgs<'a> = (
    &'a WidePart,
    &'a [u8],
    usize,
    &'a ValueTables,
    &'a [[u8; BLOCK]],
    &'a [f32],
    &'a mut [f32],
);

/// [`accumulate_block_avx2`] for a part of `B`-bit codes.
///
/// # Safety
/// As [`accumulate_block_avx2`], whose assertions it relies on.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn block_avx2<const B: u8>(
    (part, block, rows, tables, weights, scales, lanes): BlockArgs<'_>,
) {
    let ones = _mm256_set1_epi16(1);
    let bits = B;
    let mut luts = [_mm256_setzero_si256(); 16];
    for (k, lut) in luts
        .iter_mut()
        .enumerate()
        .take(1 << bits.saturating_sub(4))
    {
        // SAFETY: `tables.bytes` holds 256 bytes, so 16 from `16k` (k < 16).
        let t = unsafe { _mm_loadu_si128(tables.bytes.as_ptr().add(16 * k).cast()) };
        *lut = _mm256_broadcastsi128_si256(t);
    }
    let mut centroids = [_mm256_setzero_si256(); PASS];
    for pass in 0..part.dim.div_ceil(PASS) {
        let valid = (part.dim - pass * PASS).min(PASS);
        for (half, c) in centroids.chunks_exact_mut(4).enumerate() {
            if 4 * half < valid {
                // SAFETY: AVX2 is enabled here.
                let codes = unsafe { group::<B>(part, block, 2 * pass + half) };
                for (c, codes) in c.iter_mut().zip(codes) {
                    *c = centroid_bytes(&luts, bits, codes);
                }
            }
        }
        for (h, (u, &scale)) in weights.iter().zip(scales).enumerate() {
            // SAFETY: `u` holds 32 bytes.
            let u = unsafe { _mm256_loadu_si256(u.as_ptr().cast()) };
            // Weight bytes ≤ 127 and centroid bytes in [−127, 127]: a pair's sum stays within
            // 2·127·127, so nothing saturates; eight 32-bit partial sums per coordinate.
            let p: [__m256i; PASS] = std::array::from_fn(|i| {
                _mm256_madd_epi16(_mm256_maddubs_epi16(u, centroids[i]), ones)
            });
            // Horizontal adds: lane `i` of each 128-bit half ends with half of coordinate
            // `i`'s sum (`i < 4` in the low half, `4 + i` in the high half after the swap).
            let a = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
            let b = _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
            let low = _mm256_permute2x128_si256::<0x20>(a, b);
            let high = _mm256_permute2x128_si256::<0x31>(a, b);
            let sums = _mm256_add_epi32(low, high);
            let mut out = [0i32; PASS];
            // SAFETY: `out` holds 8 i32.
            unsafe { _mm256_storeu_si256(out.as_mut_ptr().cast(), sums) };
            let at = h * rows + pass * PASS;
            for (lane, &sum) in lanes[at..at + valid].iter_mut().zip(&out) {
                *lane += scale * sum as f32;
            }
        }
    }
}

/// The bytes `table[code]` of 32 codes of `B` bits, `table` the `2^B` bytes of `entries` from
/// `at`: one `vpshufb` per 16 of them on the codes' low nibbles (`low`), blended on their high
/// nibbles (`high`).
///
/// # Safety
/// AVX2 must be available (it is inlined into the AVX2 kernel); `at + 2^B ≤ entries.len()`
/// (asserted).
#[inline(always)]
unsafe fn lookup_bytes<const B: u8>(
    entries: &[u8],
    at: usize,
    low: __m256i,
    high: __m256i,
) -> __m256i {
    let tables = 1usize << B.saturating_sub(4);
    assert!(at + 16 * tables <= entries.len());
    // SAFETY: AVX2 is available (the caller's contract); bytes `at .. at + 16·tables` lie in
    // `entries` (asserted just above).
    unsafe {
        let table = |k: usize| {
            _mm256_broadcastsi128_si256(_mm_loadu_si128(entries.as_ptr().add(at + 16 * k).cast()))
        };
        let mut out = _mm256_shuffle_epi8(table(0), low);
        for k in 1..tables {
            let hit = _mm256_cmpeq_epi8(high, _mm256_set1_epi8(k as i8));
            out = _mm256_blendv_epi8(out, _mm256_shuffle_epi8(table(k), low), hit);
        }
        out
    }
}

/// [`add_sums_scalar`](super::wide::add_sums_scalar) on AVX2: the codes gathered four
/// coordinates at a time, each head's low and high entry bytes looked up by byte shuffles and
/// summed in 16 bits (flushed to the 32-bit sums every [`FLUSH`] coordinates); the same
/// integers.
///
/// # Safety
/// AVX2 must be available; every table must have the wide parts of `tables[0]` (one record
/// layout).
#[target_feature(enable = "avx2")]
pub(super) unsafe fn add_sums_avx2(tables: &[ScoreTable], block: &[u8], out: &mut [[u32; BLOCK]]) {
    let parts = tables[0].wide();
    let heads = tables.len().min(out.len());
    assert!(heads <= HEADS && tables.iter().all(|t| t.wide().len() == parts.len()));
    // Per head: the 16-bit sums of tokens 0–15 and 16–31, of the low bytes then the high.
    let mut acc = [[_mm256_setzero_si256(); 4]; HEADS];
    let mut summed = 0;
    for (p, part) in parts.iter().enumerate() {
        let (acc, out) = (&mut acc[..heads], &mut out[..heads]);
        let tables = &tables[..heads];
        // SAFETY: AVX2 is enabled here; the part's width is its `B`.
        unsafe {
            match part.bits {
                3 => part_sums_avx2::<3>(part, p, tables, block, acc, &mut summed, out),
                5 => part_sums_avx2::<5>(part, p, tables, block, acc, &mut summed, out),
                6 => part_sums_avx2::<6>(part, p, tables, block, acc, &mut summed, out),
                7 => part_sums_avx2::<7>(part, p, tables, block, acc, &mut summed, out),
                _ => part_sums_avx2::<8>(part, p, tables, block, acc, &mut summed, out),
            }
        }
    }
    flush_avx2(&mut acc[..heads], &mut out[..heads]);
}

/// [`add_sums_avx2`] for part `p` (`part`, of `B`-bit codes).
///
/// # Safety
/// As [`add_sums_avx2`].
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn part_sums_avx2<const B: u8>(
    part: &WidePart,
    p: usize,
    tables: &[ScoreTable],
    block: &[u8],
    acc: &mut [[__m256i; 4]],
    summed: &mut usize,
    out: &mut [[u32; BLOCK]],
) {
    let nibble = _mm256_set1_epi8(0x0F);
    for k in 0..part.dim.div_ceil(4) {
        if *summed + 4 > FLUSH {
            flush_avx2(acc, out);
            *summed = 0;
        }
        // SAFETY: AVX2 is enabled here.
        let codes = unsafe { group::<B>(part, block, k) };
        let valid = (part.dim - 4 * k).min(4);
        *summed += valid;
        for (i, &codes) in codes.iter().enumerate().take(valid) {
            let j = 4 * k + i;
            let low = _mm256_and_si256(codes, nibble);
            let high = _mm256_and_si256(_mm256_srli_epi16::<4>(codes), nibble);
            for (acc, table) in acc.iter_mut().zip(tables) {
                let own = &table.wide()[p];
                let (e, at, len) = (table.wide_entries(), own.entries(j), own.table_len());
                for half in 0..2 {
                    // SAFETY: AVX2 is enabled here; lengths asserted in `lookup_bytes`.
                    let bytes = unsafe { lookup_bytes::<B>(e, at + half * len, low, high) };
                    let tokens = [
                        _mm256_cvtepu8_epi16(_mm256_castsi256_si128(bytes)),
                        _mm256_cvtepu8_epi16(_mm256_extracti128_si256::<1>(bytes)),
                    ];
                    for (a, t) in acc[2 * half..2 * half + 2].iter_mut().zip(tokens) {
                        *a = _mm256_add_epi16(*a, t);
                    }
                }
            }
        }
    }
}

/// [`flush`] for the AVX2 sums: tokens 0–15 and 16–31 of the low bytes' sums, then of the
/// high bytes'.
///
/// # Safety
/// AVX2 must be available.
#[inline]
#[target_feature(enable = "avx2")]
fn flush_avx2(acc: &mut [[__m256i; 4]], out: &mut [[u32; BLOCK]]) {
    for (sums, acc) in out.iter_mut().zip(acc) {
        for half in 0..2 {
            let (low, high) = (acc[half], acc[2 + half]);
            for quarter in 0..2 {
                let words = |v: __m256i| {
                    _mm256_cvtepu16_epi32(if quarter == 0 {
                        _mm256_castsi256_si128(v)
                    } else {
                        _mm256_extracti128_si256::<1>(v)
                    })
                };
                let add = _mm256_add_epi32(words(low), _mm256_slli_epi32::<8>(words(high)));
                let at = &mut sums[16 * half + 8 * quarter..16 * half + 8 * quarter + 8];
                // SAFETY: `at` holds 8 u32 (32 bytes).
                unsafe {
                    let old = _mm256_loadu_si256(at.as_ptr().cast());
                    _mm256_storeu_si256(at.as_mut_ptr().cast(), _mm256_add_epi32(old, add));
                }
            }
        }
        *acc = [_mm256_setzero_si256(); 4];
    }
}
