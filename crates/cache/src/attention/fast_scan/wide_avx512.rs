//! AVX-512 forms of the bit-plane pass ([`wide`](super::wide)): the same integers as its
//! loops and as the AVX2 forms ([`wide_x86`](super::wide_x86)), with fewer instructions.
//!
//! Two coordinates' 32 codes share one 512-bit register, put back together from their
//! planes by one broadcast, one 32-bit rotate and one ternary logic op per plane
//! ([`pair_group`]; AVX2 takes a shift and a mask per lane and a byte shuffle and an or per
//! coordinate), and AVX-512 VBMI's byte permutes look all 64 codes up at once in tables of up
//! to 64 entries (`vpermb`; 128 with `vpermi2b`, 256 with two and a blend) — where AVX2 takes
//! one `vpshufb` and a blend per 16 entries, per byte of the entry and per 32 codes.
//!
//! - **Keys**: the 16-bit centroids' low and high bytes are looked up for a pair of
//!   coordinates `(a, b)`, and one `vpermi2b` per 16 tokens interleaves them into the words
//!   `(E_a, E_b)` per token that `vpmaddwd` multiplies with a head's `(Q_a, Q_b)`: 16 tokens'
//!   products of a pair per instruction (AVX2: 8).
//! - **Values**: sixteen coordinates' centroid bytes are transposed into groups of four
//!   tokens ([`transpose`], shared by the heads), so that one `vpdpbusd` per group (with
//!   AVX-512 VNNI; `vpmaddubsw`, `vpmaddwd` and an add without) adds a head's four weighted
//!   tokens to all sixteen coordinates' sums: no reduction across lanes (AVX-512 has no
//!   horizontal add).
//!
//! Integer sums of the same products in another order: exact, so the same integers, and the
//! same float steps after them (tested against the loops on every instruction set, and the
//! forms without VNNI on CPUs that have it). Tried and not kept: VNNI's `vpdpwssd` for the
//! keys' products (no gain measured: its latency chains the pairs of a head).

use std::arch::x86_64::*;

use super::BLOCK;
use super::table::{ScoreTable, WidePart};
use super::values_avx512::add_head_sums;
use super::values_int::ValueTables;
use super::wide_x86::{
    Gathered, HEADS, PAIRS, group_checked_past, groups_within, tile_heads, widths,
};
use crate::record_order::LANE_BYTES;

/// `B`-bit byte lookups: `table[code]` for each of 64 codes, the table given as up to four
/// 64-byte registers (`2^B` entries; a code's bits above `B` are not read).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
fn lookup<const B: u8>(table: &[__m512i; 4], codes: __m512i) -> __m512i {
    match B {
        0..=6 => _mm512_permutexvar_epi8(codes, table[0]),
        7 => _mm512_permutex2var_epi8(table[0], codes, table[1]),
        _ => {
            let low = _mm512_permutex2var_epi8(table[0], codes, table[1]);
            let high = _mm512_permutex2var_epi8(table[2], codes, table[3]);
            _mm512_mask_blend_epi8(_mm512_movepi8_mask(codes), low, high)
        }
    }
}

/// A table of `len` bytes (`T` a byte type) from `bytes[at..]` as [`lookup`] takes it: the
/// first `min(len, 256)` bytes, 64 per register, zeros past `len` (a masked load reads
/// nothing beyond it).
///
/// # Safety
/// AVX-512 F and BW must be available; `at + len ≤ bytes.len()` (asserted).
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn load_table<T: Copy>(bytes: &[T], at: usize, len: usize) -> [__m512i; 4] {
    const { assert!(size_of::<T>() == 1) };
    assert!(at + len <= bytes.len());
    let mut table = [_mm512_setzero_si512(); 4];
    for (k, t) in table.iter_mut().enumerate() {
        let from = 64 * k;
        if from >= len {
            break;
        }
        let n = (len - from).min(64);
        let mask = if n == 64 { u64::MAX } else { (1u64 << n) - 1 };
        // SAFETY: AVX-512 BW is enabled here; `T` is one byte and the mask reads bytes
        // `at + from .. at + from + n`, within `bytes` (asserted above).
        *t = unsafe { _mm512_maskz_loadu_epi8(mask, bytes.as_ptr().add(at + from).cast()) };
    }
    table
}

/// Two coordinates' 32 codes (one byte per token) in one register: `a` in the low half.
#[inline]
#[target_feature(enable = "avx512f")]
fn pair_codes(a: __m256i, b: __m256i) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(a), b)
}

/// The rotations of [`pair_group`] for `B`-bit codes: per plane `p` (width `w`, `m = 4 / w`
/// codes per nibble, its bits at `off` in the code) and pair `x / 2` of a group (coordinates
/// `x`, `x + 1`), per 32-bit element: the element's 128-bit lane `L` holds coordinate
/// `x + L / 2`'s lane bytes, tokens `0..16` (`L` even: low nibbles) or `16..32` (odd: high
/// nibbles), whose sub-code sits at bit `s = 4·(L mod 2) + w·(coordinate mod m)` of each
/// byte; rotating right by `s − off` (mod 32) puts it at `off` (`s + w ≤ 8`, so no bit of
/// another byte lands in the field).
const fn rotations(bits: u8) -> [[[u32; 16]; 2]; 3] {
    let widths = widths(bits);
    let mut out = [[[0u32; 16]; 2]; 3];
    let (mut p, mut off) = (0, 0u32);
    while p < 3 && widths[p] != 0 {
        let w = widths[p] as u32;
        let m = 4 / w;
        let mut pair = 0;
        while pair < 2 {
            let mut e = 0;
            while e < 16 {
                let lane = (e / 4) as u32;
                let coordinate = 2 * pair as u32 + lane / 2;
                let s = 4 * (lane % 2) + w * (coordinate % m);
                out[p][pair][e] = (s + 32 - off) % 32;
                e += 1;
            }
            pair += 1;
        }
        off += w;
        p += 1;
    }
    out
}

/// [`rotations`] for every width the kernels take (index `B`; 0 for the others).
static ROTATIONS: [[[[u32; 16]; 2]; 3]; 9] = [
    [[[0; 16]; 2]; 3],
    [[[0; 16]; 2]; 3],
    [[[0; 16]; 2]; 3],
    rotations(3),
    [[[0; 16]; 2]; 3],
    rotations(5),
    rotations(6),
    rotations(7),
    rotations(8),
];

/// Each byte's bits `off .. off + w` of plane `p`'s field, for [`pair_group`].
const fn field_masks(bits: u8) -> [u8; 3] {
    let widths = widths(bits);
    let mut out = [0u8; 3];
    let (mut p, mut off) = (0, 0u8);
    while p < 3 && widths[p] != 0 {
        out[p] = ((1u8 << widths[p]) - 1) << off;
        off += widths[p];
        p += 1;
    }
    out
}

/// The 64 codes of two pairs of coordinates of group `k` of `part` (`B`-bit codes), as
/// [`pair_codes`] of [`group`](super::wide_x86)'s registers gives them — coordinates
/// `4k, 4k + 1` in the first register, `4k + 2, 4k + 3` in the second — put together with
/// AVX-512: per plane and pair, the pair's one or two lanes broadcast into the register's
/// halves, one rotate per 32 bits ([`rotations`]) and one ternary logic op (`codes |
/// (rotated & field)`), where AVX2 takes a shift and a mask per lane and a byte shuffle and an
/// or per coordinate. `k` below [`groups_within`], so every lane lies in the block.
///
/// # Safety
/// AVX-512 F and BW must be available (it is inlined into the kernels that enable them);
/// `k < groups_within(part, block)`.
#[inline(always)]
unsafe fn pair_group<const B: u8>(part: &WidePart, block: &[u8], k: usize) -> [__m512i; 2] {
    debug_assert_eq!(part.bits, B);
    let widths = const { widths(B) };
    let masks = const { field_masks(B) };
    let rotations = &ROTATIONS[usize::from(B)];
    // SAFETY: AVX-512 F and BW are available (the caller's contract); every lane read lies
    // in the block (`k < groups_within`: the lanes of group `k` of every plane do); each
    // rotation holds 64 bytes.
    unsafe {
        let lane = |at: usize| {
            debug_assert!((at + 1) * LANE_BYTES <= block.len());
            _mm_loadu_si128(block.as_ptr().add(at * LANE_BYTES).cast())
        };
        let mut codes = [_mm512_setzero_si512(); 2];
        for (p, &width) in widths.iter().enumerate() {
            if width == 0 {
                break;
            }
            debug_assert_eq!(
                part.spans[p].shift,
                widths[..p].iter().sum::<u8>(),
                "planes low bits first"
            );
            let (w, m) = (usize::from(width), usize::from(4 / width));
            let first = part.spans[p].first_lane + k * w;
            let field = _mm512_set1_epi8(masks[p] as i8);
            for (pair, c) in codes.iter_mut().enumerate() {
                let x = 2 * pair;
                let (lx, ly) = (x / m, (x + 1) / m);
                let both = if lx == ly {
                    _mm512_broadcast_i32x4(lane(first + lx))
                } else {
                    _mm512_mask_broadcast_i32x4(
                        _mm512_broadcast_i32x4(lane(first + lx)),
                        0xFF00,
                        lane(first + ly),
                    )
                };
                let r = _mm512_loadu_si512(rotations[p][pair].as_ptr().cast());
                let rotated = _mm512_rorv_epi32(both, r);
                *c = if p == 0 {
                    _mm512_and_si512(rotated, field)
                } else {
                    // `c | (rotated & field)`.
                    _mm512_ternarylogic_epi32::<0xF8>(*c, rotated, field)
                };
            }
        }
        codes
    }
}

/// [`pair_group`] for `k` below `within` (what [`groups_within`] gives for this part and
/// block), and from there [`group`](super::wide_x86)'s lane-by-lane reads, paired.
///
/// # Safety
/// AVX-512 F and BW and AVX2 must be available; `within ≤ groups_within(part, block)`.
#[inline(always)]
unsafe fn pairs_of_group<const B: u8>(
    part: &WidePart,
    block: &[u8],
    k: usize,
    within: usize,
) -> [__m512i; 2] {
    // SAFETY: the features are available (the caller's contract); `k < within` for the
    // unchecked form.
    unsafe {
        if k < within {
            pair_group::<B>(part, block, k)
        } else {
            let codes = group_checked_past::<B>(part, block, k, within);
            [
                pair_codes(codes[0], codes[1]),
                pair_codes(codes[2], codes[3]),
            ]
        }
    }
}

/// The byte order of a pair's words: for the tokens `16·half .. 16·half + 16`, token `t`'s
/// `(E_a, E_b)` as four bytes `low(a), high(a), low(b), high(b)` — indices into the low
/// bytes' register (`0..64`: `a` at `t`, `b` at `32 + t`) and the high bytes' (`64..128`).
const fn interleave(half: usize) -> [u8; 64] {
    let mut order = [0u8; 64];
    let mut t = 0;
    while t < 16 {
        let token = (16 * half + t) as u8;
        order[4 * t] = token;
        order[4 * t + 1] = 64 + token;
        order[4 * t + 2] = 32 + token;
        order[4 * t + 3] = 96 + token;
        t += 1;
    }
    order
}

/// [`interleave`] of both halves, loaded by [`gather_part`].
static INTERLEAVE: [[u8; 64]; 2] = [interleave(0), interleave(1)];

/// A pair of coordinates' centroids as `vpmaddwd` takes them: per token `(E_a, E_b)` as two
/// words, tokens 0–15 in the first register, 16–31 in the second.
type Pair = [__m512i; 2];

/// [`add_sums_scalar`](super::wide::add_sums_scalar) on AVX-512: per pair of coordinates the
/// 64 codes' centroid bytes looked up once for every head (`vpermb`), interleaved into words
/// (`vpermi2b`); per head `Q_a E_a + Q_b E_b` for 16 tokens per `vpmaddwd`, added to 32-bit
/// sums with wrap-around as the loop adds them; the same integers.
///
/// # Safety
/// AVX-512 F, BW, VL and VBMI and AVX2 must be available; every table must have the wide
/// parts of `tables[0]` (one record layout).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2")]
pub(super) unsafe fn add_sums_avx512(
    tables: &[ScoreTable],
    block: &[u8],
    out: &mut [[u32; BLOCK]],
) {
    let heads = tile_heads(tables, out);
    let first = &tables[0];
    let parts = first.wide();
    let mut acc = [[_mm512_setzero_si512(); 2]; HEADS];
    let mut gathered = Gathered::<Pair>::new();
    let (tables, acc) = (&tables[..heads], &mut acc[..heads]);
    for part in parts {
        let args = (part, first.wide_centroids(), block);
        // SAFETY: the features are enabled here; the part's width is its `B`.
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
        for (at, add) in sums.chunks_exact_mut(16).zip(acc) {
            // SAFETY: `at` holds 16 u32 (64 bytes).
            unsafe {
                let old = _mm512_loadu_si512(at.as_ptr().cast());
                _mm512_storeu_si512(at.as_mut_ptr().cast(), _mm512_add_epi32(old, *add));
            }
        }
    }
}

/// [`add_sums_avx512`] for one part of `B`-bit codes: its pairs of coordinates gathered,
/// multiplied whenever [`PAIRS`] of them are.
///
/// # Safety
/// AVX-512 F, BW, VL and VBMI and AVX2 must be available; the part's centroids must lie in
/// `centroids` (asserted in [`load_table`]).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2")]
unsafe fn gather_part<const B: u8>(
    (part, centroids, block): (&WidePart, &[u8], &[u8]),
    gathered: &mut Gathered<Pair>,
    tables: &[ScoreTable],
    acc: &mut [[__m512i; 2]],
) {
    let (at, len) = (part.centroids_at, part.centroid_len());
    debug_assert_eq!(part.query_at, 2 * (gathered.first + gathered.len));
    // SAFETY: AVX-512 F and BW are enabled here; `load_table` asserts the ranges.
    let (low, high) = unsafe {
        (
            load_table(centroids, at, len),
            load_table(centroids, at + len, len),
        )
    };
    // SAFETY: each order holds 64 bytes.
    let order = unsafe {
        [
            _mm512_loadu_si512(INTERLEAVE[0].as_ptr().cast()),
            _mm512_loadu_si512(INTERLEAVE[1].as_ptr().cast()),
        ]
    };
    let within = groups_within(part, block);
    for k in 0..part.dim.div_ceil(4) {
        // SAFETY: AVX-512 F, BW and AVX2 are enabled here; `within` is `groups_within(part, block)`.
        let pairs = unsafe { pairs_of_group::<B>(part, block, k, within) };
        // Both pairs of every group, so that the pairs stay consecutive: the coordinates past
        // the part's meet padding slots, whose `Q` is zero.
        for codes in pairs {
            let (l, h) = (lookup::<B>(&low, codes), lookup::<B>(&high, codes));
            if gathered.len == PAIRS {
                multiply(gathered, tables, acc);
            }
            let n = gathered.len;
            gathered.pairs[n].write([
                _mm512_permutex2var_epi8(l, order[0], h),
                _mm512_permutex2var_epi8(l, order[1], h),
            ]);
            gathered.len += 1;
        }
    }
}

/// Each head's `Q_a E_a + Q_b E_b` over the gathered pairs, added to its sums `acc`; empties
/// `gathered`.
///
/// # Safety
/// AVX-512 F and BW must be available.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn multiply(gathered: &mut Gathered<Pair>, tables: &[ScoreTable], acc: &mut [[__m512i; 2]]) {
    let (first, n) = (gathered.first, gathered.len);
    for (table, acc) in tables.iter().zip(acc.iter_mut()) {
        let queries = &table.wide_query()[2 * first..2 * (first + n)];
        let mut sums = *acc;
        for (pair, q) in gathered.pairs[..n].iter().zip(queries.chunks_exact(2)) {
            // SAFETY: `gather_part` wrote pairs `0..len` before counting them.
            let pair = unsafe { pair.assume_init_ref() };
            let q = _mm512_set1_epi32(i32::from(q[0] as u16) | i32::from(q[1]) << 16);
            for (s, &e) in sums.iter_mut().zip(pair) {
                *s = _mm512_add_epi32(*s, _mm512_madd_epi16(e, q));
            }
        }
        *acc = sums;
    }
    gathered.first += n;
    gathered.len = 0;
}

/// Coordinates summed per pass of [`accumulate_block_avx512`]: four groups of four.
const PASS: usize = 16;

/// [`accumulate_block`](super::wide::accumulate_block) on AVX-512: sixteen coordinates at a
/// time, their codes put back together and looked up in the centroid bytes two coordinates
/// per register (`vpermb`), transposed into groups of four tokens (shared by the heads), then
/// per head one `vpdpbusd` per four tokens (`vpmaddubsw`, `vpmaddwd` and an add without
/// VNNI) sums 16 coordinates at once, no reduction across lanes; the same integers and float
/// steps as the loop, so the same bits.
///
/// # Safety
/// AVX-512 F, BW, VL and VBMI and AVX2 must be available, and AVX-512 VNNI with `vnni`;
/// `lanes` must hold `weights.len() · rows` values with `part.dim ≤ rows` (asserted).
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2")]
pub(super) unsafe fn accumulate_block_avx512(
    vnni: bool,
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
    // SAFETY: the features are enabled here, VNNI where asked for (the caller's contract);
    // the part's width is its `B`.
    unsafe {
        match (part.bits, vnni) {
            (3, true) => block_vnni::<3>(args),
            (5, true) => block_vnni::<5>(args),
            (6, true) => block_vnni::<6>(args),
            (7, true) => block_vnni::<7>(args),
            (_, true) => block_vnni::<8>(args),
            (3, false) => block_plain::<3>(args),
            (5, false) => block_plain::<5>(args),
            (6, false) => block_plain::<6>(args),
            (7, false) => block_plain::<7>(args),
            (_, false) => block_plain::<8>(args),
        }
    }
}

/// [`block_body`] compiled with AVX-512 VNNI (so that `vpdpbusd` inlines).
///
/// # Safety
/// As [`accumulate_block_avx512`] with `vnni`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2")]
unsafe fn block_vnni<const B: u8>(args: BlockArgs<'_>) {
    // SAFETY: the features `block_body::<B, true>` needs are enabled here.
    unsafe { block_body::<B, true>(args) }
}

/// [`block_body`] without VNNI.
///
/// # Safety
/// As [`accumulate_block_avx512`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2")]
unsafe fn block_plain<const B: u8>(args: BlockArgs<'_>) {
    // SAFETY: the features `block_body::<B, false>` needs are enabled here.
    unsafe { block_body::<B, false>(args) }
}

/// The arguments of [`accumulate_block_avx512`] after `vnni`.
type BlockArgs<'a> = (
    &'a WidePart,
    &'a [u8],
    usize,
    &'a ValueTables,
    &'a [[u8; BLOCK]],
    &'a [f32],
    &'a mut [f32],
);

/// [`accumulate_block_avx512`] for a part of `B`-bit codes.
///
/// # Safety
/// As [`accumulate_block_avx512`], whose assertions it relies on; it is inlined into
/// [`block_vnni`] and [`block_plain`], which enable the features.
#[inline(always)]
unsafe fn block_body<const B: u8, const VNNI: bool>(
    (part, block, rows, tables, weights, scales, lanes): BlockArgs<'_>,
) {
    // SAFETY: every intrinsic and kernel below needs only the features the callers enable;
    // the table holds 256 bytes; `within` is `groups_within(part, block)`.
    unsafe {
        let table = load_table(&tables.bytes, 0, 1 << B);
        let within = groups_within(part, block);
        let groups = part.dim.div_ceil(4);
        for pass in 0..part.dim.div_ceil(PASS) {
            let valid = (part.dim - pass * PASS).min(PASS);
            let mut centroids = [_mm512_setzero_si512(); 8];
            for q in 0..PASS / 4 {
                let k = 4 * pass + q;
                if k >= groups {
                    // Past the part: its coordinates' sums are not stored.
                    break;
                }
                let [a, b] = pairs_of_group::<B>(part, block, k, within);
                centroids[2 * q] = lookup::<B>(&table, a);
                centroids[2 * q + 1] = lookup::<B>(&table, b);
            }
            add_head_sums::<VNNI>(
                centroids,
                (weights, scales),
                (rows, pass * PASS, valid),
                lanes,
            );
        }
    }
}
