//! AVX-512 forms of the bit-plane pass ([`wide`](super::wide)): the same integers as its
//! loops and as the AVX2 forms ([`wide_x86`](super::wide_x86)), with fewer instructions.
//!
//! The codes are put back together from their planes as the AVX2 forms do ([`group`]: 32
//! tokens of a coordinate per 256-bit register); two coordinates then share one 512-bit
//! register, and AVX-512 VBMI's byte permutes look all 64 codes up at once in tables of up to
//! 64 entries (`vpermb`; 128 with `vpermi2b`, 256 with two and a blend) — where AVX2 takes
//! one `vpshufb` and a blend per 16 entries, per byte of the entry and per 32 codes.
//!
//! - **Keys**: the 16-bit centroids' low and high bytes are looked up for a pair of
//!   coordinates `(a, b)`, and one `vpermi2b` per 16 tokens interleaves them into the words
//!   `(E_a, E_b)` per token that `vpmaddwd` multiplies with a head's `(Q_a, Q_b)`: 16 tokens'
//!   products of a pair per instruction (AVX2: 8).
//! - **Values**: the centroid bytes of coordinates `i` and `i + 4` are looked up together, and
//!   each head's weight bytes multiply them with `vpmaddubsw` and `vpmaddwd` (16 partial sums
//!   per register, half as many instructions as AVX2), reduced to one sum per coordinate by
//!   unpacks and adds (AVX-512 has no horizontal add).
//!
//! Integer sums of the same products in another order: exact, so the same integers, and the
//! same float steps after them (tested against the loops on every instruction set).

use std::arch::x86_64::*;

use super::BLOCK;
use super::table::{ScoreTable, WidePart};
use super::values_int::ValueTables;
use super::wide_x86::{HEADS, PAIRS, group_checked_past, groups_within};

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

/// The gathered pairs (as in the AVX2 form: `pairs[i]` is pair `first + i` of every head's
/// `wide_query`, written before they are read).
struct Gathered {
    pairs: [std::mem::MaybeUninit<Pair>; PAIRS],
    first: usize,
    len: usize,
}

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
    let first = &tables[0];
    let parts = first.wide();
    let heads = tables.len().min(out.len());
    assert!(heads <= HEADS);
    let queries = first.wide_query().len();
    assert!(
        tables[..heads]
            .iter()
            .all(|t| t.wide().len() == parts.len() && t.wide_query().len() == queries)
    );
    let mut acc = [[_mm512_setzero_si512(); 2]; HEADS];
    let mut gathered = Gathered {
        pairs: [const { std::mem::MaybeUninit::uninit() }; PAIRS],
        first: 0,
        len: 0,
    };
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
    gathered: &mut Gathered,
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
        // SAFETY: AVX2 is enabled here; `within` is `groups_within(part, block)`.
        let codes = unsafe { group_checked_past::<B>(part, block, k, within) };
        // Both pairs of every group, so that the pairs stay consecutive: the coordinates past
        // the part's meet padding slots, whose `Q` is zero.
        for i in [0, 2] {
            let codes = pair_codes(codes[i], codes[i + 1]);
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
fn multiply(gathered: &mut Gathered, tables: &[ScoreTable], acc: &mut [[__m512i; 2]]) {
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

/// Coordinates summed per pass of [`accumulate_block_avx512`], as in the AVX2 form.
const PASS: usize = 8;

/// [`accumulate_block`](super::wide::accumulate_block) on AVX-512: eight coordinates at a
/// time, their codes put back together and looked up in the centroid bytes two coordinates
/// per register (`i` and `i + 4`, shared by the heads), then per head paired with the weight
/// bytes (`vpmaddubsw`, `vpmaddwd`) and reduced to one exact 32-bit sum per coordinate; the
/// same integers and float steps, so the same bits.
///
/// # Safety
/// AVX-512 F, BW, VL and VBMI and AVX2 must be available; `lanes` must hold
/// `weights.len() · rows` values with `part.dim ≤ rows` (asserted).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2")]
pub(super) unsafe fn accumulate_block_avx512(
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
    // SAFETY: the features are enabled here; the part's width is its `B`.
    unsafe {
        match part.bits {
            3 => block_avx512::<3>(args),
            5 => block_avx512::<5>(args),
            6 => block_avx512::<6>(args),
            7 => block_avx512::<7>(args),
            _ => block_avx512::<8>(args),
        }
    }
}

/// The arguments of [`accumulate_block_avx512`].
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
/// As [`accumulate_block_avx512`], whose assertions it relies on.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2")]
unsafe fn block_avx512<const B: u8>(
    (part, block, rows, tables, weights, scales, lanes): BlockArgs<'_>,
) {
    let ones = _mm512_set1_epi16(1);
    // SAFETY: AVX-512 F and BW are enabled here; the table holds 256 bytes.
    let table = unsafe { load_table(&tables.bytes, 0, 1 << B) };
    let within = groups_within(part, block);
    let mut centroids = [_mm512_setzero_si512(); PASS / 2];
    for pass in 0..part.dim.div_ceil(PASS) {
        let valid = (part.dim - pass * PASS).min(PASS);
        // Coordinates `8·pass + i` and `8·pass + 4 + i` share register `i`; the second group
        // only where the pass reaches it (its codes are not read otherwise).
        // SAFETY: AVX2 is enabled here; `within` is `groups_within(part, block)`.
        let (first, second) = unsafe {
            let first = group_checked_past::<B>(part, block, 2 * pass, within);
            let second = if valid > 4 {
                group_checked_past::<B>(part, block, 2 * pass + 1, within)
            } else {
                [_mm256_setzero_si256(); 4]
            };
            (first, second)
        };
        for (i, c) in centroids.iter_mut().enumerate() {
            *c = lookup::<B>(&table, pair_codes(first[i], second[i]));
        }
        for (h, (u, &scale)) in weights.iter().zip(scales).enumerate() {
            // SAFETY: `u` holds 32 bytes.
            let u = _mm512_broadcast_i64x4(unsafe { _mm256_loadu_si256(u.as_ptr().cast()) });
            // Weight bytes ≤ 127 and centroid bytes in [−127, 127]: a pair's sum stays within
            // 2·127·127, so nothing saturates. Register `i`: eight partial sums of
            // coordinate `i` in its low half, of `4 + i` in its high half.
            let p: [__m512i; PASS / 2] = std::array::from_fn(|i| {
                _mm512_madd_epi16(_mm512_maddubs_epi16(u, centroids[i]), ones)
            });
            // Per 128-bit lane, the four registers' sums side by side: lanes 0 and 1 hold
            // halves of coordinates 0–3, lanes 2 and 3 of 4–7.
            let s01 = _mm512_add_epi32(
                _mm512_unpacklo_epi32(p[0], p[1]),
                _mm512_unpackhi_epi32(p[0], p[1]),
            );
            let s23 = _mm512_add_epi32(
                _mm512_unpacklo_epi32(p[2], p[3]),
                _mm512_unpackhi_epi32(p[2], p[3]),
            );
            let s = _mm512_add_epi32(
                _mm512_unpacklo_epi64(s01, s23),
                _mm512_unpackhi_epi64(s01, s23),
            );
            let sums = _mm512_castsi512_si256(_mm512_add_epi32(
                _mm512_shuffle_i32x4::<0b10_00_10_00>(s, s),
                _mm512_shuffle_i32x4::<0b11_01_11_01>(s, s),
            ));
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
