//! x86 forms of the bit-plane pass ([`wide`](super::wide)): the same integers as its loops.
//!
//! A coordinate's 32 codes are put back together in one 256-bit register, four coordinates
//! at a time (`group`): each plane lane's 16 bytes are loaded into both 128-bit halves
//! and turned into one nibble per token (the upper half shifted by 4: tokens 16–31), and a
//! byte shuffle per coordinate maps the nibble to the coordinate's bits of the code. Keys
//! then look the codes up in the part's 16-bit centroids once for every query head (byte
//! shuffles on the low and high bytes, blended past 4 bits) and multiply-add pairs of
//! coordinates with each head's integer queries (`vpmaddwd`); values look the codes up in
//! the centroid bytes and pair them with the weight bytes (`vpmaddubsw`). AVX-512 CPUs with
//! VBMI take the forms of [`wide_avx512`](super::wide_avx512), which reuse [`group`].

use std::arch::x86_64::*;

use super::BLOCK;
use super::table::{ScoreTable, WidePart};
use super::values_int::ValueTables;
use crate::record_order::LANE_BYTES;

/// The nibbles of lane `lane` of a block, one byte per token (tokens 0–15 from the low
/// nibbles, 16–31 from the high ones); zeros for a lane past the block (the padding lanes of
/// a part's last group of four coordinates may lie past a record's last part).
///
/// # Safety
/// AVX2 must be available; with `WITHIN` the lane must lie in the block
/// ([`groups_within`]: the check is then made once per part, not per lane).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn nibbles<const WITHIN: bool>(block: &[u8], lane: usize) -> __m256i {
    let at = lane * LANE_BYTES;
    let bytes = if WITHIN {
        debug_assert!(at + LANE_BYTES <= block.len());
        // SAFETY: the lane lies in the block (the caller's contract).
        unsafe { block.get_unchecked(at..at + LANE_BYTES) }
    } else {
        match block.get(at..at + LANE_BYTES) {
            Some(bytes) => bytes,
            None => return _mm256_setzero_si256(),
        }
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

/// How many of `part`'s groups of four coordinates, from the first, read only lanes inside
/// `block`: those [`group`] may read without a check per lane (all of them, unless the
/// padding of the last group reaches past a record's last part).
pub(super) fn groups_within(part: &WidePart, block: &[u8]) -> usize {
    let lanes = block.len() / LANE_BYTES;
    part.spans
        .iter()
        .map(|span| lanes.saturating_sub(span.first_lane) / usize::from(span.width))
        .fold(part.dim.div_ceil(4), usize::min)
}

/// The plane widths of a `bits`-bit code, low bits first, 0 past the last plane (what
/// [`planes_from`](crate::record_order::planes_from) gives, as a constant for the kernels).
pub(super) const fn widths(bits: u8) -> [u8; 3] {
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
/// AVX2 must be available (it is inlined into the AVX2 kernels); with `WITHIN`, `k` must be
/// below [`groups_within`].
#[inline(always)]
unsafe fn group<const B: u8, const WITHIN: bool>(
    part: &WidePart,
    block: &[u8],
    k: usize,
) -> [__m256i; 4] {
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
                let n = nibbles::<WITHIN>(block, first + k * w + l);
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

/// [`group`] `k`, read unchecked below `within` (what [`groups_within`] gives for this part
/// and block) and lane by lane from there.
///
/// # Safety
/// AVX2 must be available; `within` must not exceed [`groups_within`]`(part, block)`.
#[inline(always)]
pub(super) unsafe fn group_checked_past<const B: u8>(
    part: &WidePart,
    block: &[u8],
    k: usize,
    within: usize,
) -> [__m256i; 4] {
    // SAFETY: AVX2 is available (the caller's contract); `k < within` for the unchecked form.
    unsafe {
        if k < within {
            group::<B, true>(part, block, k)
        } else {
            group::<B, false>(part, block, k)
        }
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
    let within = groups_within(part, block);
    for pass in 0..part.dim.div_ceil(PASS) {
        let valid = (part.dim - pass * PASS).min(PASS);
        for (half, c) in centroids.chunks_exact_mut(4).enumerate() {
            if 4 * half < valid {
                // SAFETY: AVX2 is enabled here; `within` is `groups_within(part, block)`.
                let codes =
                    unsafe { group_checked_past::<B>(part, block, 2 * pass + half, within) };
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
            let at = h * rows + pass * PASS;
            if valid == PASS {
                // `lane + scale·sum`, each lane rounded as the loop below rounds it.
                let lanes = &mut lanes[at..at + PASS];
                let add = _mm256_mul_ps(_mm256_set1_ps(scale), _mm256_cvtepi32_ps(sums));
                // SAFETY: `lanes` holds 8 f32.
                unsafe {
                    let sum = _mm256_add_ps(_mm256_loadu_ps(lanes.as_ptr()), add);
                    _mm256_storeu_ps(lanes.as_mut_ptr(), sum);
                }
            } else {
                let mut out = [0i32; PASS];
                // SAFETY: `out` holds 8 i32.
                unsafe { _mm256_storeu_si256(out.as_mut_ptr().cast(), sums) };
                for (lane, &sum) in lanes[at..at + valid].iter_mut().zip(&out) {
                    *lane += scale * sum as f32;
                }
            }
        }
    }
}

/// The 16-bit centroids `E[code]` of 32 codes of `B` bits as words, tokens 0–7 and 16–23
/// in the first register, 8–15 and 24–31 in the second: `E`'s low and high bytes (two tables
/// of `len` bytes from `at` in `centroids`) looked up by one `vpshufb` each per 16 entries on
/// the codes' low nibbles, blended on their high nibbles (one comparison for both), then
/// interleaved.
///
/// # Safety
/// AVX2 must be available (it is inlined into the AVX2 kernel); `len ≥ 2^B` and
/// `at + 2·len ≤ centroids.len()` (asserted).
#[inline(always)]
unsafe fn centroid_words<const B: u8>(
    centroids: &[u8],
    at: usize,
    len: usize,
    codes: __m256i,
) -> [__m256i; 2] {
    let tables = 1usize << B.saturating_sub(4);
    assert!(16 * tables <= len && at + 2 * len <= centroids.len());
    // SAFETY: AVX2 is available (the caller's contract); bytes `at .. at + 16·tables` and
    // `at + len ..` as many lie in `centroids` (asserted just above).
    unsafe {
        let table = |from: usize| {
            _mm256_broadcastsi128_si256(_mm_loadu_si128(centroids.as_ptr().add(from).cast()))
        };
        let nibble = _mm256_set1_epi8(0x0F);
        let low = _mm256_and_si256(codes, nibble);
        let high = _mm256_and_si256(_mm256_srli_epi16::<4>(codes), nibble);
        let mut lo = _mm256_shuffle_epi8(table(at), low);
        let mut hi = _mm256_shuffle_epi8(table(at + len), low);
        for k in 1..tables {
            let hit = _mm256_cmpeq_epi8(high, _mm256_set1_epi8(k as i8));
            let (l, h) = (table(at + 16 * k), table(at + len + 16 * k));
            lo = _mm256_blendv_epi8(lo, _mm256_shuffle_epi8(l, low), hit);
            hi = _mm256_blendv_epi8(hi, _mm256_shuffle_epi8(h, low), hit);
        }
        [_mm256_unpacklo_epi8(lo, hi), _mm256_unpackhi_epi8(lo, hi)]
    }
}

/// Most heads one pass scores (the tiles of `sums_tile`).
pub(super) const HEADS: usize = 4;

/// Coordinate pairs whose centroids [`add_sums_avx2`] gathers before each head multiplies
/// them (4 KiB of registers' worth, in L1).
pub(super) const PAIRS: usize = 32;

/// A pair of coordinates' centroids for the 32 tokens, as `vpmaddwd` takes them: per token
/// `(E_a, E_b)` as two words, tokens 0–3 and 16–19 in the first register, then 4–7 and
/// 20–23, 8–11 and 24–27, 12–15 and 28–31.
type Pair = [__m256i; 4];

/// The centroids gathered for the heads to multiply (`P` one pair's registers, AVX2's or
/// AVX-512's): `pairs[i]` the pair whose integer queries are pair `first + i` of every head's
/// `wide_query` (the parts' coordinates one after another, each part's padded to a multiple of
/// 4, so a block's pairs are consecutive), for `i < len` (written before they are read:
/// zeroing 4 KiB per block would cost as much as the lookups).
pub(super) struct Gathered<P> {
    pub(super) pairs: [std::mem::MaybeUninit<P>; PAIRS],
    pub(super) first: usize,
    pub(super) len: usize,
}

impl<P> Gathered<P> {
    /// None gathered yet, from pair 0.
    pub(super) fn new() -> Self {
        Self {
            pairs: [const { std::mem::MaybeUninit::uninit() }; PAIRS],
            first: 0,
            len: 0,
        }
    }
}

/// The heads one pass of the key products scores (`out`'s and `tables`' shorter, at most
/// [`HEADS`]), checked to share `tables[0]`'s wide parts and queries (one record layout).
pub(super) fn tile_heads(tables: &[ScoreTable], out: &[[u32; BLOCK]]) -> usize {
    let first = &tables[0];
    let heads = tables.len().min(out.len());
    assert!(heads <= HEADS);
    let (parts, queries) = (first.wide().len(), first.wide_query().len());
    assert!(
        tables[..heads]
            .iter()
            .all(|t| t.wide().len() == parts && t.wide_query().len() == queries)
    );
    heads
}

/// [`add_sums_scalar`](super::wide::add_sums_scalar) on AVX2: per pair of coordinates, the
/// 32 tokens' centroids `E` looked up once for every head (from the planes, four
/// coordinates at a time) and interleaved; per head, `Q_a E_a + Q_b E_b` for 8 tokens per
/// `vpmaddwd` (exact: `|Q| ≤ 32767`, `|E| ≤ 2048`), added to 32-bit sums with wrap-around
/// as the loop adds them; the same integers.
///
/// # Safety
/// AVX2 must be available; every table must have the wide parts of `tables[0]` (one record
/// layout).
#[target_feature(enable = "avx2")]
pub(super) unsafe fn add_sums_avx2(tables: &[ScoreTable], block: &[u8], out: &mut [[u32; BLOCK]]) {
    let heads = tile_heads(tables, out);
    let first = &tables[0];
    let parts = first.wide();
    let mut acc = [[_mm256_setzero_si256(); 4]; HEADS];
    let mut gathered = Gathered::<Pair>::new();
    let (tables, acc) = (&tables[..heads], &mut acc[..heads]);
    for part in parts {
        let args = (part, first.wide_centroids(), block);
        // SAFETY: AVX2 is enabled here; the part's width is its `B`.
        unsafe {
            match part.bits {
                3 => gather_part::<3>(args, &mut gathered, tables, acc),
                5 => gather_part::<5>(args, &mut gathered, tables, acc),
                6 => gather_part::<6>(args, &mut gathered, tables, acc),
                7 => gather_part::<7>(args, &mut gathered, tables, acc),
                _ => gather_part::<8>(args, &mut gathered, tables, acc),
            }
        }
    }
    multiply(&mut gathered, tables, acc);
    for (sums, acc) in out.iter_mut().zip(acc.iter()) {
        // Tokens 0–7, 8–15, 16–23, 24–31 from the halves of the four registers.
        let words = [
            _mm256_permute2x128_si256::<0x20>(acc[0], acc[1]),
            _mm256_permute2x128_si256::<0x20>(acc[2], acc[3]),
            _mm256_permute2x128_si256::<0x31>(acc[0], acc[1]),
            _mm256_permute2x128_si256::<0x31>(acc[2], acc[3]),
        ];
        for (at, add) in sums.chunks_exact_mut(8).zip(words) {
            // SAFETY: `at` holds 8 u32 (32 bytes).
            unsafe {
                let old = _mm256_loadu_si256(at.as_ptr().cast());
                _mm256_storeu_si256(at.as_mut_ptr().cast(), _mm256_add_epi32(old, add));
            }
        }
    }
}

/// [`add_sums_avx2`] for one part of `B`-bit codes: its pairs of coordinates gathered,
/// multiplied whenever [`PAIRS`] of them are.
///
/// # Safety
/// AVX2 must be available; the part's centroids must lie in `centroids` (asserted in
/// [`centroid_words`]).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn gather_part<const B: u8>(
    (part, centroids, block): (&WidePart, &[u8], &[u8]),
    gathered: &mut Gathered<Pair>,
    tables: &[ScoreTable],
    acc: &mut [[__m256i; 4]],
) {
    let (at, len) = (part.centroids_at, part.centroid_len());
    debug_assert_eq!(part.query_at, 2 * (gathered.first + gathered.len));
    let within = groups_within(part, block);
    for k in 0..part.dim.div_ceil(4) {
        // SAFETY: AVX2 is enabled here (and for the calls below); `within` is
        // `groups_within(part, block)`; the lengths are asserted in `centroid_words`.
        let codes = unsafe { group_checked_past::<B>(part, block, k, within) };
        // Both pairs of every group, so that the pairs stay consecutive: the coordinates past
        // the part's (defined codes of another part or of zero lanes) meet padding slots,
        // whose `Q` is zero.
        for i in [0, 2] {
            let (a, b) = unsafe {
                (
                    centroid_words::<B>(centroids, at, len, codes[i]),
                    centroid_words::<B>(centroids, at, len, codes[i + 1]),
                )
            };
            if gathered.len == PAIRS {
                multiply(gathered, tables, acc);
            }
            let n = gathered.len;
            gathered.pairs[n].write([
                _mm256_unpacklo_epi16(a[0], b[0]),
                _mm256_unpackhi_epi16(a[0], b[0]),
                _mm256_unpacklo_epi16(a[1], b[1]),
                _mm256_unpackhi_epi16(a[1], b[1]),
            ]);
            gathered.len += 1;
        }
    }
}

/// Each head's `Q_a E_a + Q_b E_b` over the gathered pairs, added to its sums `acc`; empties
/// `gathered`.
///
/// # Safety
/// AVX2 must be available.
#[inline]
#[target_feature(enable = "avx2")]
fn multiply(gathered: &mut Gathered<Pair>, tables: &[ScoreTable], acc: &mut [[__m256i; 4]]) {
    let (first, n) = (gathered.first, gathered.len);
    for (table, acc) in tables.iter().zip(acc.iter_mut()) {
        let queries = &table.wide_query()[2 * first..2 * (first + n)];
        let mut sums = *acc;
        for (pair, q) in gathered.pairs[..n].iter().zip(queries.chunks_exact(2)) {
            // SAFETY: `gather_part` wrote pairs `0..len` before counting them.
            let pair = unsafe { pair.assume_init_ref() };
            let q = _mm256_set1_epi32(i32::from(q[0] as u16) | i32::from(q[1]) << 16);
            for (s, &e) in sums.iter_mut().zip(pair) {
                *s = _mm256_add_epi32(*s, _mm256_madd_epi16(e, q));
            }
        }
        *acc = sums;
    }
    gathered.first += n;
    gathered.len = 0;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The groups read unchecked stop before the first whose lanes reach past the block: a
    /// 6-bit part of 5 coordinates (a 4-bit plane of 5 lanes, then a 2-bit plane of 3) reads
    /// lanes 2 and 3 of its 2-bit plane for its second group.
    #[test]
    fn groups_within_stop_at_the_first_lane_past_the_block() {
        let part = WidePart::new(6, 5, 2).unwrap();
        let end = 2 + 5 + 3;
        assert_eq!(groups_within(&part, &vec![0u8; end * LANE_BYTES]), 1);
        assert_eq!(groups_within(&part, &vec![0u8; (end + 1) * LANE_BYTES]), 2);
        assert_eq!(groups_within(&part, &vec![0u8; 60 * LANE_BYTES]), 2);
        assert_eq!(groups_within(&part, &[]), 0);
    }
}
