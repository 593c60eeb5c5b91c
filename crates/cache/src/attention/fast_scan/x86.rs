//! `vpshufb` kernels: one byte shuffle scores 32 tokens (AVX2: two coordinates per register;
//! AVX-512: four), summed in 16-bit lanes and widened to 32 bits every [`FLUSH`] steps.
//! The kernels score several heads per pass (AVX-512 up to four, AVX2 two, as many as keep
//! their accumulators in registers), so a block's codes are loaded and split into nibbles once
//! for all of them.

use std::arch::x86_64::*;

use super::BLOCK;
use super::attend::FloatTables;
use super::layout::LANE_BYTES;
use super::values_int::ValueTables;

/// Steps a 16-bit lane may add before it is widened: 256 · 255 < 65 536.
const FLUSH: usize = 256;

/// Adds eight 32-bit lanes to `out[base .. base + 8]`.
///
/// # Safety
/// AVX2 must be available.
#[target_feature(enable = "avx2")]
unsafe fn add_to(v: __m256i, out: &mut [u32; BLOCK], base: usize) {
    let slot = &mut out[base..base + 8];
    // SAFETY: `slot` holds 8 u32 = 32 bytes, the width of the unaligned load and store.
    unsafe {
        let old = _mm256_loadu_si256(slot.as_ptr().cast());
        _mm256_storeu_si256(slot.as_mut_ptr().cast(), _mm256_add_epi32(old, v));
    }
}

/// The AVX2 form of `scalar::sums` for `H` heads (1 or 2) at once: `out[h]` gets what
/// `scalar::sums(entries[h], codes, ..)` gives, the same integers. A block's codes are loaded
/// and split into nibbles once for all heads.
///
/// Each shuffle gives 32 bytes — one coordinate's entries for 16 tokens in each 128-bit lane —
/// which are summed as sixteen 16-bit words without unpacking them (the accumulation of
/// Faiss's fast scan): `even += word` adds both of a word's bytes (wrapping), `odd += word >> 8`
/// its high byte, the odd token's. After at most [`FLUSH`] steps the even token's sum is
/// `even − (odd << 8)` modulo 2^16, exact because it is below 256 · 255 < 2^16.
///
/// # Safety
/// AVX2 must be available; every `entries[h]` must have the length of `codes`, a multiple
/// of 64.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn sums_heads_avx2<const H: usize>(
    entries: [&[u8]; H],
    codes: &[u8],
    out: &mut [[u32; BLOCK]; H],
) {
    const { assert!(H == 1 || H == 2) };
    assert!(codes.len().is_multiple_of(64) && entries.iter().all(|e| e.len() == codes.len()));
    for o in out.iter_mut() {
        o.fill(0);
    }
    let nibble = _mm256_set1_epi8(0x0F);
    let zero = _mm256_setzero_si256();
    let steps = codes.len() / (2 * LANE_BYTES);
    let mut step = 0;
    while step < steps {
        let end = steps.min(step + FLUSH);
        // Per head: [words of the low nibbles' tokens, their odd bytes, the same for the high].
        let mut acc = [[zero; 4]; H];
        for s in step..end {
            // SAFETY: `s < steps`, so bytes 32·s .. 32·s + 32 lie in `codes`.
            let c = unsafe { _mm256_loadu_si256(codes.as_ptr().add(32 * s).cast()) };
            let lo_idx = _mm256_and_si256(c, nibble);
            let hi_idx = _mm256_and_si256(_mm256_srli_epi16::<4>(c), nibble);
            // One block per head with a constant index, so the accumulators stay in registers.
            macro_rules! head {
                ($h:literal) => {
                    if H > $h {
                        // SAFETY: every `entries[h]` has the length of `codes` (asserted above).
                        let lut =
                            unsafe { _mm256_loadu_si256(entries[$h].as_ptr().add(32 * s).cast()) };
                        let lo = _mm256_shuffle_epi8(lut, lo_idx);
                        let hi = _mm256_shuffle_epi8(lut, hi_idx);
                        let a = &mut acc[$h];
                        a[0] = _mm256_add_epi16(a[0], lo);
                        a[1] = _mm256_add_epi16(a[1], _mm256_srli_epi16::<8>(lo));
                        a[2] = _mm256_add_epi16(a[2], hi);
                        a[3] = _mm256_add_epi16(a[3], _mm256_srli_epi16::<8>(hi));
                    }
                };
            }
            head!(0);
            head!(1);
        }
        for h in 0..H {
            for (half, pair) in acc[h].chunks_exact(2).enumerate() {
                let odd = pair[1];
                let even = _mm256_sub_epi16(pair[0], _mm256_slli_epi16::<8>(odd));
                // Tokens 0–7 and 8–15 of this nibble half, per 128-bit lane (one coordinate
                // parity each): widen both lanes and add them.
                for (k, words) in [
                    _mm256_unpacklo_epi16(even, odd),
                    _mm256_unpackhi_epi16(even, odd),
                ]
                .into_iter()
                .enumerate()
                {
                    let both = _mm256_add_epi32(
                        _mm256_cvtepu16_epi32(_mm256_castsi256_si128(words)),
                        _mm256_cvtepu16_epi32(_mm256_extracti128_si256::<1>(words)),
                    );
                    // SAFETY: AVX2 is enabled in this function.
                    unsafe { add_to(both, &mut out[h], 16 * half + 8 * k) };
                }
            }
        }
        step = end;
    }
}

/// The AVX-512 BW form of `scalar::sums` for `H` heads (1 to 4) at once: `out[h]` gets what
/// `scalar::sums(entries[h], codes, ..)` gives, the same integers. The shuffles' bytes are
/// summed as 16-bit words without unpacking them, as [`sums_heads_avx2`] sums them.
///
/// # Safety
/// AVX-512 F and BW and AVX2 must be available; every `entries[h]` must have the length of
/// `codes`, a multiple of 64.
#[target_feature(enable = "avx512f,avx512bw,avx2")]
pub(super) unsafe fn sums_heads_avx512<const H: usize>(
    entries: [&[u8]; H],
    codes: &[u8],
    out: &mut [[u32; BLOCK]; H],
) {
    assert!(codes.len().is_multiple_of(64) && entries.iter().all(|e| e.len() == codes.len()));
    for o in out.iter_mut() {
        o.fill(0);
    }
    let nibble = _mm512_set1_epi8(0x0F);
    let zero = _mm512_setzero_si512();
    let steps = codes.len() / (4 * LANE_BYTES);
    let mut step = 0;
    while step < steps {
        let end = steps.min(step + FLUSH);
        let mut acc = [[zero; 4]; H];
        for s in step..end {
            // SAFETY: `s < steps`, so bytes 64·s .. 64·s + 64 lie in `codes`.
            let c = unsafe { _mm512_loadu_si512(codes.as_ptr().add(64 * s).cast()) };
            let lo_idx = _mm512_and_si512(c, nibble);
            let hi_idx = _mm512_and_si512(_mm512_srli_epi16(c, 4), nibble);
            // One block per head with a constant index, so the accumulators stay in registers
            // (a loop over `h` was compiled with them on the stack).
            macro_rules! head {
                ($h:literal) => {
                    if H > $h {
                        // SAFETY: every `entries[h]` has the length of `codes` (asserted above).
                        let lut =
                            unsafe { _mm512_loadu_si512(entries[$h].as_ptr().add(64 * s).cast()) };
                        let lo = _mm512_shuffle_epi8(lut, lo_idx);
                        let hi = _mm512_shuffle_epi8(lut, hi_idx);
                        let a = &mut acc[$h];
                        a[0] = _mm512_add_epi16(a[0], lo);
                        a[1] = _mm512_add_epi16(a[1], _mm512_srli_epi16::<8>(lo));
                        a[2] = _mm512_add_epi16(a[2], hi);
                        a[3] = _mm512_add_epi16(a[3], _mm512_srli_epi16::<8>(hi));
                    }
                };
            }
            head!(0);
            head!(1);
            head!(2);
            head!(3);
        }
        // Per nibble half, the even tokens' sums `even − (odd << 8)` (as in the AVX2 form),
        // interleaved with the odd ones': tokens 0–7 and 8–15 of the half. The four 128-bit
        // lanes hold the sums of coordinates ≡ 0, 1, 2, 3 (mod 4): widen the two 256-bit
        // halves, add them, then add their halves.
        for h in 0..H {
            let [even_lo, odd_lo, even_hi, odd_hi] = acc[h];
            let words = |even: __m512i, odd: __m512i| {
                let even = _mm512_sub_epi16(even, _mm512_slli_epi16::<8>(odd));
                [
                    _mm512_unpacklo_epi16(even, odd),
                    _mm512_unpackhi_epi16(even, odd),
                ]
            };
            let [a0, a1] = words(even_lo, odd_lo);
            let [a2, a3] = words(even_hi, odd_hi);
            for (k, a) in [a0, a1, a2, a3].iter().enumerate() {
                let wide = _mm512_add_epi32(
                    _mm512_cvtepu16_epi32(_mm512_castsi512_si256(*a)),
                    _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(*a, 1)),
                );
                let eight = _mm256_add_epi32(
                    _mm512_castsi512_si256(wide),
                    _mm512_extracti64x4_epi64(wide, 1),
                );
                // SAFETY: AVX2 is enabled in this function.
                unsafe { add_to(eight, &mut out[h], 8 * k) };
            }
        }
        step = end;
    }
}

/// The AVX-512 form of the scalar value accumulation in `attend`: for each coordinate `j < d`
/// and head `h`, lane `i` of `lanes[(h·d + j)·16 ..]` gets `+ w(first + i)·c[code]` then
/// `+ w(first + 16 + i)·c[code]` — a multiplication then an addition, as the scalar loop does,
/// so the same bits.
///
/// Coordinate `j` reads nibble lane `j / m` through table `j mod m` of `centroids`.
///
/// # Safety
/// AVX-512 F and BW must be available; `codes` must hold at least the `⌈d / m⌉` lanes of
/// 16 bytes, `weights` `heads · padded` values with `first + 32 ≤ padded`, and `lanes`
/// `heads · d · 16` values.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx2")]
pub(super) unsafe fn accumulate_block_avx512(
    codes: &[u8],
    d: usize,
    centroids: &FloatTables,
    weights: &[f32],
    padded: usize,
    first: usize,
    heads: usize,
    lanes: &mut [f32],
) {
    let per = centroids.per;
    assert!(codes.len() >= d.div_ceil(per) * LANE_BYTES && first + BLOCK <= padded);
    assert!(weights.len() >= heads * padded && lanes.len() >= heads * d * 16);
    let nibble = _mm_set1_epi8(0x0F);
    for j in 0..d {
        // SAFETY: each table holds 16 f32 = 64 bytes; `j / m < ⌈d / m⌉`, so bytes
        // 16·(j / m) .. + 16 lie in `codes` (asserted above).
        let (table, c) = unsafe {
            (
                _mm512_loadu_ps(centroids.tables[j % per].as_ptr()),
                _mm_loadu_si128(codes.as_ptr().add((j / per) * LANE_BYTES).cast()),
            )
        };
        let lo = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_and_si128(c, nibble)), table);
        let hi = _mm512_permutexvar_ps(
            _mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(c, 4), nibble)),
            table,
        );
        for h in 0..heads {
            let w = h * padded + first;
            let at = (h * d + j) * 16;
            // SAFETY: `w + 32 ≤ heads · padded` and `at + 16 ≤ heads · d · 16` (asserted).
            unsafe {
                let w_lo = _mm512_loadu_ps(weights.as_ptr().add(w));
                let w_hi = _mm512_loadu_ps(weights.as_ptr().add(w + 16));
                let acc = _mm512_loadu_ps(lanes.as_ptr().add(at));
                let acc = _mm512_add_ps(acc, _mm512_mul_ps(w_lo, lo));
                let acc = _mm512_add_ps(acc, _mm512_mul_ps(w_hi, hi));
                _mm512_storeu_ps(lanes.as_mut_ptr().add(at), acc);
            }
        }
    }
}

/// The centroids of eight 4-bit codes (the low bytes' values `0..16` widened to 32-bit lanes):
/// two eight-entry permutes, chosen between by bit 3 of the code.
#[inline]
#[target_feature(enable = "avx2")]
fn lookup16(low: __m256, high: __m256, codes: __m128i) -> __m256 {
    let idx = _mm256_cvtepu8_epi32(codes);
    let select = _mm256_castsi256_ps(_mm256_slli_epi32::<28>(idx));
    _mm256_blendv_ps(
        _mm256_permutevar8x32_ps(low, idx),
        _mm256_permutevar8x32_ps(high, idx),
        select,
    )
}

/// The AVX2 form of the scalar value accumulation in `attend` (as
/// [`accumulate_block_avx512`]): lanes `0..8` and `8..16` of each coordinate and head in two
/// registers, `+ w(first + i)·c[code]` then `+ w(first + 16 + i)·c[code]` — a multiplication
/// then an addition, as the scalar loop does, so the same bits.
///
/// # Safety
/// AVX2 must be available; `codes` must hold at least the `⌈d / m⌉` lanes of 16 bytes,
/// `weights` `heads · padded` values with `first + 32 ≤ padded`, and `lanes` `heads · d · 16`
/// values.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn accumulate_block_avx2(
    codes: &[u8],
    d: usize,
    centroids: &FloatTables,
    weights: &[f32],
    padded: usize,
    first: usize,
    heads: usize,
    lanes: &mut [f32],
) {
    let per = centroids.per;
    assert!(codes.len() >= d.div_ceil(per) * LANE_BYTES && first + BLOCK <= padded);
    assert!(weights.len() >= heads * padded && lanes.len() >= heads * d * 16);
    let nibble = _mm_set1_epi8(0x0F);
    for j in 0..d {
        let table = &centroids.tables[j % per];
        // SAFETY: each table holds 16 f32, two loads of 8; `j / m < ⌈d / m⌉`, so bytes
        // 16·(j / m) .. + 16 lie in `codes` (asserted above).
        let (low, high, c) = unsafe {
            (
                _mm256_loadu_ps(table.as_ptr()),
                _mm256_loadu_ps(table.as_ptr().add(8)),
                _mm_loadu_si128(codes.as_ptr().add((j / per) * LANE_BYTES).cast()),
            )
        };
        let lo = _mm_and_si128(c, nibble);
        let hi = _mm_and_si128(_mm_srli_epi16::<4>(c), nibble);
        // Tokens 0–7, 8–15 (low nibbles of bytes 0–7, 8–15), 16–23, 24–31 (high nibbles).
        let t0 = lookup16(low, high, lo);
        let t1 = lookup16(low, high, _mm_srli_si128::<8>(lo));
        let t2 = lookup16(low, high, hi);
        let t3 = lookup16(low, high, _mm_srli_si128::<8>(hi));
        for h in 0..heads {
            let w = h * padded + first;
            let at = (h * d + j) * 16;
            // SAFETY: `w + 32 ≤ heads · padded` and `at + 16 ≤ heads · d · 16` (asserted).
            unsafe {
                let wp = weights.as_ptr().add(w);
                let lp = lanes.as_mut_ptr().add(at);
                let a0 = _mm256_add_ps(_mm256_loadu_ps(lp), _mm256_mul_ps(_mm256_loadu_ps(wp), t0));
                let a1 = _mm256_add_ps(
                    _mm256_loadu_ps(lp.add(8)),
                    _mm256_mul_ps(_mm256_loadu_ps(wp.add(8)), t1),
                );
                let a0 = _mm256_add_ps(a0, _mm256_mul_ps(_mm256_loadu_ps(wp.add(16)), t2));
                let a1 = _mm256_add_ps(a1, _mm256_mul_ps(_mm256_loadu_ps(wp.add(24)), t3));
                _mm256_storeu_ps(lp, a0);
                _mm256_storeu_ps(lp.add(8), a1);
            }
        }
    }
}

/// The AVX2 form of `values_int::accumulate_block`: the centroid bytes of two coordinates
/// per register, one per 128-bit lane — with one code per nibble two nibble lanes in one
/// 32-byte load, with several the one nibble lane that holds both in both halves, each half
/// looking its coordinate's table up — `vpshufb` for the 32 tokens' centroid bytes,
/// `vpmaddubsw` with the weight bytes and `vpmaddwd` by ones for four partial sums per
/// coordinate, then, eight coordinates at a time, horizontal additions to each coordinate's
/// block sum (the same integers), a permutation back to coordinate order, and the same
/// multiplication by the head's scale and addition.
///
/// # Safety
/// AVX2 must be available; `rows` must be even and `codes` hold its `rows / m` nibble lanes
/// (16 bytes each), `weights` and `scales` one entry per head, and `lanes` `heads · rows`
/// values.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn accumulate_block_int_avx2(
    codes: &[u8],
    rows: usize,
    tables: &ValueTables,
    weights: &[[u8; BLOCK]],
    scales: &[f32],
    lanes: &mut [f32],
) {
    let heads = weights.len();
    assert!(rows.is_multiple_of(2) && codes.len() >= rows.div_ceil(tables.per) * LANE_BYTES);
    assert!(scales.len() == heads && lanes.len() >= heads * rows);
    // SAFETY (all three): AVX2 is available and the slices fit (the caller's contract and
    // the assertions above).
    match tables.per {
        1 => unsafe { block_int_avx2::<1>(codes, rows, tables, weights, scales, lanes) },
        2 => unsafe { block_int_avx2::<2>(codes, rows, tables, weights, scales, lanes) },
        _ => unsafe { block_int_avx2::<4>(codes, rows, tables, weights, scales, lanes) },
    }
}

/// [`accumulate_block_int_avx2`] for `PER` codes per nibble (`tables.per`), a constant so
/// that a coordinate's lane and table are a shift and a mask.
///
/// # Safety
/// As [`accumulate_block_int_avx2`], whose assertions it relies on.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn block_int_avx2<const PER: usize>(
    codes: &[u8],
    rows: usize,
    tables: &ValueTables,
    weights: &[[u8; BLOCK]],
    scales: &[f32],
    lanes: &mut [f32],
) {
    let per = PER;
    debug_assert_eq!(per, tables.per);
    // Per pair of coordinates `(j, j + 1)`, the tables of both halves: `[e | e]` with one code
    // per nibble, else `[t_i | t_{i+1}]`, `i = j mod m`.
    let table = |i: usize| {
        // SAFETY: each table holds 16 bytes.
        unsafe { _mm_loadu_si128(tables.tables[i].as_ptr().cast()) }
    };
    let luts = if per == 1 {
        [_mm256_set_m128i(table(0), table(0)); 2]
    } else {
        [
            _mm256_set_m128i(table(1), table(0)),
            _mm256_set_m128i(table(3), table(2)),
        ]
    };
    let nibble = _mm256_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    // The centroid bytes of coordinates `j` (low half) and `j + 1` (high half), tokens 0–15
    // and 16–31.
    let centroids = |j: usize| {
        // SAFETY: `j + 1 < rows`, so with one code per nibble bytes 16·j .. 16·j + 32 lie in
        // `codes`, and with several the 16 bytes of lane `j / m` (asserted above).
        let c = unsafe {
            if per == 1 {
                _mm256_loadu_si256(codes.as_ptr().add(j * LANE_BYTES).cast())
            } else {
                _mm256_broadcastsi128_si256(_mm_loadu_si128(
                    codes.as_ptr().add((j / per) * LANE_BYTES).cast(),
                ))
            }
        };
        let lut = luts[(j % per) / 2];
        (
            _mm256_shuffle_epi8(lut, _mm256_and_si256(c, nibble)),
            _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16::<4>(c), nibble)),
        )
    };
    // Four partial sums of each coordinate of a pair (exact: `32·127·127 < 2^24`).
    let partials = |(low, high): (__m256i, __m256i), u_low: __m256i, u_high: __m256i| {
        _mm256_add_epi32(
            _mm256_madd_epi16(_mm256_maddubs_epi16(u_low, low), ones),
            _mm256_madd_epi16(_mm256_maddubs_epi16(u_high, high), ones),
        )
    };
    // Two rounds of horizontal additions leave `[j, j+2, j+4, j+6 | j+1, j+3, j+5, j+7]`.
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    // Each head's weight bytes (tokens 0–15, then 16–31) in both lanes, and its scale.
    let mut per_head = [(
        _mm256_setzero_si256(),
        _mm256_setzero_si256(),
        _mm256_setzero_ps(),
    ); 4];
    for (chunk, (ws, ss)) in weights.chunks(4).zip(scales.chunks(4)).enumerate() {
        for (k, (u, &scale)) in ws.iter().zip(ss).enumerate() {
            // SAFETY: `u` holds 32 bytes.
            per_head[k] = unsafe {
                (
                    _mm256_broadcastsi128_si256(_mm_loadu_si128(u.as_ptr().cast())),
                    _mm256_broadcastsi128_si256(_mm_loadu_si128(u.as_ptr().add(16).cast())),
                    _mm256_set1_ps(scale),
                )
            };
        }
        let first = 4 * chunk;
        let mut j = 0;
        while j + 8 <= rows {
            let c = [
                centroids(j),
                centroids(j + 2),
                centroids(j + 4),
                centroids(j + 6),
            ];
            for (k, &(u_low, u_high, s)) in per_head.iter().enumerate().take(ws.len()) {
                let p = c.map(|c| partials(c, u_low, u_high));
                let sums = _mm256_permutevar8x32_epi32(
                    _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3])),
                    order,
                );
                // SAFETY: coordinates j .. j + 8 of head `first + k < heads` are 8 floats
                // inside `lanes` (asserted above).
                unsafe {
                    let lp = lanes.as_mut_ptr().add((first + k) * rows + j);
                    let acc = _mm256_add_ps(
                        _mm256_loadu_ps(lp),
                        _mm256_mul_ps(s, _mm256_cvtepi32_ps(sums)),
                    );
                    _mm256_storeu_ps(lp, acc);
                }
            }
            j += 8;
        }
        while j < rows {
            let c = centroids(j);
            for (k, (&(u_low, u_high, _), &scale)) in per_head.iter().zip(ss).enumerate() {
                let p = partials(c, u_low, u_high);
                let p = _mm256_hadd_epi32(p, p);
                let p = _mm256_hadd_epi32(p, p);
                let at = (first + k) * rows + j;
                lanes[at] += scale * _mm256_extract_epi32::<0>(p) as f32;
                lanes[at + 1] += scale * _mm256_extract_epi32::<4>(p) as f32;
            }
            j += 2;
        }
    }
}

/// `values_int::weight_bytes` of the weights `p_t · norm_t` of one whole block (32 tokens,
/// one norm per token): the same products, largest weight, scale, quotients and roundings,
/// eight lanes at a time, then packed to bytes in token order.
///
/// # Safety
/// AVX2 must be available.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn block_weight_bytes_avx2(
    p: &[f32; BLOCK],
    norms: &[f32; BLOCK],
    out: &mut [u8; BLOCK],
) -> f32 {
    use super::values_int::{LEVELS, ROUND};
    // SAFETY: each array holds 32 floats, read 8 at a time.
    let w: [__m256; 4] = std::array::from_fn(|i| unsafe {
        _mm256_mul_ps(
            _mm256_loadu_ps(p.as_ptr().add(8 * i)),
            _mm256_loadu_ps(norms.as_ptr().add(8 * i)),
        )
    });
    // `max` is exact, so any order gives the scalar fold's largest weight (floored at 0).
    let m = _mm256_max_ps(_mm256_max_ps(w[0], w[1]), _mm256_max_ps(w[2], w[3]));
    let m = _mm256_max_ps(m, _mm256_permute2f128_ps::<1>(m, m));
    let m = _mm256_max_ps(m, _mm256_shuffle_ps::<0b01_00_11_10>(m, m));
    let m = _mm256_max_ps(m, _mm256_shuffle_ps::<0b10_11_00_01>(m, m));
    let scale = _mm256_cvtss_f32(m).max(0.0) / LEVELS;
    if scale <= 0.0 || scale.is_nan() {
        out.fill(0);
        return scale;
    }
    let (step, top, round) = (
        _mm256_set1_ps(scale),
        _mm256_set1_ps(LEVELS),
        _mm256_set1_ps(ROUND),
    );
    let q: [__m256i; 4] = std::array::from_fn(|i| {
        let shifted = _mm256_add_ps(_mm256_min_ps(_mm256_div_ps(w[i], step), top), round);
        _mm256_sub_epi32(_mm256_castps_si256(shifted), _mm256_castps_si256(round))
    });
    // Within each 128-bit lane the packs interleave four tokens of each vector; the
    // permutation puts the groups of four back in token order.
    let bytes = _mm256_packus_epi16(
        _mm256_packs_epi32(q[0], q[1]),
        _mm256_packs_epi32(q[2], q[3]),
    );
    let bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    // SAFETY: `out` holds 32 bytes.
    unsafe { _mm256_storeu_si256(out.as_mut_ptr().cast(), bytes) };
    scale
}

/// A whole block's scores `norm_t · table.dequantize(sum_t)` (added to `out` with `add`): the
/// same conversion, multiplication by the step, addition of the offset, multiplication by the
/// norm and addition (no fused multiply-add), eight tokens at a time.
///
/// # Safety
/// AVX2 must be available.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn dequantize_block_avx2(
    table: &super::ScoreTable,
    sums: &[u32; BLOCK],
    norms: &[f32; BLOCK],
    out: &mut [f32; BLOCK],
    add: bool,
) {
    let (step, offset) = (
        _mm256_set1_ps(table.sum_step()),
        _mm256_set1_ps(table.offset()),
    );
    for i in (0..BLOCK).step_by(8) {
        // SAFETY: `i + 8 ≤ 32`, the length of every array; a sum is below 2^31
        // (`ScoreTable::dequantize`), so the signed conversion is the value's.
        unsafe {
            let sum = _mm256_cvtepi32_ps(_mm256_loadu_si256(sums.as_ptr().add(i).cast()));
            let score = _mm256_add_ps(_mm256_mul_ps(step, sum), offset);
            let norm = _mm256_loadu_ps(norms.as_ptr().add(i));
            let mut v = _mm256_mul_ps(norm, score);
            if add {
                v = _mm256_add_ps(_mm256_loadu_ps(out.as_ptr().add(i)), v);
            }
            _mm256_storeu_ps(out.as_mut_ptr().add(i), v);
        }
    }
}
