//! AVX2 (+ FMA, F16C) kernels: a weight row against Q8 activation rows, with integer products.
//!
//! Per block of 32: the weight bytes become 32 bytes in register order = value order (Q8_0 as
//! stored; Q4_0/Q4_1 nibbles: the low nibbles are values 0..16, the high ones 16..32; Q4_0
//! minus 8; Q5_0 nibbles with `0xF0` OR-ed in wherever the fifth bit is clear, which is
//! `q − 16` as a signed byte — llama.cpp's `bytes_from_bits_32` + `andnot`), multiplied by the activation bytes with `vpmaddubsw` (unsigned × signed pairs to
//! i16; for signed weights the sign is moved onto the activation first, `|w|·sign(w)·x`) and
//! `vpmaddwd` by ones (i16 pairs to i32), leaving in lane `l` the sum of products `4l..4l+4`.
//! No step saturates: a pair is at most `2·128·127 = 32512 < 2¹⁵` because activations lie in
//! −127..=127, so the lane sums are exact — the scalar [`Lanes`](super::scalar::Lanes).
//!
//! In [`Q8Order::LlamaCppAvx2`](super::Q8Order::LlamaCppAvx2) the lanes are converted to f32
//! (exact) and accumulated as llama.cpp's AVX2 kernels do and as the scalar
//! [`combine`](super::scalar::combine) specifies:
//! `acc = fma(broadcast(d_w·d_x), lanes, acc)` per block, the Q4_1 minimum term
//! `summs = fma(m_w, s_x, summs)` in block order, then `hsum(acc) (+ summs)`. Same operations,
//! same order: the result is bit-identical to the scalar kernel.
//!
//! Each accumulator is a chain of dependent FMAs (4-cycle latency per block), so the entry
//! points keep several chains in flight: [`dot_rows`] runs `R` weight rows against one
//! activation (matrix–vector products), [`dot_tile`] runs one weight row against up to
//! [`TILE`] activations with the row unpacked once (products of several activation rows).
//! Per (row, activation) pair, every entry point performs the same operations in the same
//! order. Block scales come eight at a time into one vector (eight plain loads, one
//! conversion), so no per-block scalar f16 conversion (and no false register dependency) sits
//! in the loop; in the block-lanes order a whole group of eight blocks is one call
//! ([`group_term`]) that keeps its integer sums in a few registers.
//!
//! Register-only helpers are safe `#[target_feature]` functions (callable only from code with
//! the same features); the entry points are `unsafe` because they need AVX2/FMA/F16C, and the
//! dispatcher calls them only after runtime detection. Memory is read through raw pointers only
//! inside bounds clamped at the top of each entry point.

use core::arch::x86_64::*;

use super::super::activation::{Q8_BLOCK, Q8Row, SCALE_LANES};
use super::panel::UnpackedRow;
use super::tile_buf::SEG_BLOCKS;
use super::{TILE, TileBuf};

/// Q8_0 weights.
pub(crate) const Q8_0: u8 = 0;
/// Q4_0 weights.
pub(crate) const Q4_0: u8 = 1;
/// Q4_1 weights.
pub(crate) const Q4_1: u8 = 2;
/// Q5_0 weights.
pub(crate) const Q5_0: u8 = 3;

/// Bytes per block of format `K`.
pub(super) const fn block_bytes(k: u8) -> usize {
    match k {
        Q8_0 => 34,
        Q4_0 => 18,
        Q5_0 => 22,
        _ => 20,
    }
}

/// How far ahead of its read position in each weight row a matrix–vector kernel prefetches.
/// A decode step streams every weight once (96 MB for SmolLM2, more than any cache level
/// keeps between steps), and the rows are short (360 bytes for a 576-column Q4_1 row), so the
/// hardware prefetcher, which follows one stream within a 4 KiB page, keeps restarting; a
/// software prefetch this far ahead (well beyond one row group, within L1/L2 reach) took the
/// products over the whole model from 26 to 15 ms on one thread here (docs/results.md). 4 to
/// 16 KiB measured alike.
pub(super) const PREFETCH_AHEAD: usize = 8192;

/// Prefetches the `len` bytes that lie [`PREFETCH_AHEAD`] bytes past `p`, a cache line at a
/// time. A prefetch is a hint that never faults, so the addresses may lie past the weights.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn prefetch_ahead(p: *const u8, len: usize) {
    let mut offset = 0;
    while offset < len {
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH_AHEAD + offset).cast());
        offset += 64;
    }
}

/// Sums the eight lanes: `((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))`, as `hsum8` (and as
/// llama.cpp's `hsum_float_8`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let t = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)))
}

/// Sixteen bytes of nibbles to 32 bytes: the low nibbles (values 0..16), then the high ones.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn nibbles(raw: __m128i) -> __m256i {
    let both = _mm256_set_m128i(_mm_srli_epi16::<4>(raw), raw);
    _mm256_and_si256(both, _mm256_set1_epi8(0xF))
}

/// Spreads the 32 bits of `bits` to 32 bytes: byte `j` is `0xFF` if bit `j` is set, else 0
/// (llama.cpp's `bytes_from_bits_32`). Each byte is first broadcast from the source byte
/// `j / 8`, then OR-ed with every bit except bit `j % 8`: all ones exactly when that bit is set.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn bytes_from_bits(bits: u32) -> __m256i {
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(bits as i32),
        _mm256_set_epi64x(
            0x0303_0303_0303_0303,
            0x0202_0202_0202_0202,
            0x0101_0101_0101_0101,
            0,
        ),
    );
    let others = _mm256_or_si256(spread, _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe));
    _mm256_cmpeq_epi8(others, _mm256_set1_epi64x(-1))
}

/// The f16 at `w` as f32.
///
/// # Safety
/// F16C; two readable bytes at `w`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn f16_at(w: *const u8) -> f32 {
    // SAFETY: two readable bytes (caller).
    let bits = unsafe { u16::from_le_bytes([*w, *w.add(1)]) };
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

/// A block's 32 weights as `(unsigned multiplicand, sign source)`: `(|q|, q)` for the signed
/// formats (Q8_0, Q4_0, Q5_0), `(q, unused)` for Q4_1.
///
/// # Safety
/// AVX2; `w` points to a whole block of format `K`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn weights<const K: u8>(w: *const u8) -> (__m256i, __m256i) {
    if K == Q4_1 {
        // SAFETY: a Q4_1 block is 20 bytes; its nibbles are bytes 4..20.
        let raw = unsafe { _mm_loadu_si128(w.add(4).cast()) };
        (nibbles(raw), _mm256_setzero_si256())
    } else {
        let q = if K == Q8_0 {
            // SAFETY: a Q8_0 block is 34 bytes; its values are bytes 2..34.
            unsafe { _mm256_loadu_si256(w.add(2).cast()) }
        } else if K == Q5_0 {
            // SAFETY: a Q5_0 block is 22 bytes: the fifth bits are bytes 2..6, the nibbles
            // bytes 6..22.
            let (qh, raw) = unsafe {
                (
                    u32::from_le_bytes([*w.add(2), *w.add(3), *w.add(4), *w.add(5)]),
                    _mm_loadu_si128(w.add(6).cast()),
                )
            };
            // 0xF0 where the fifth bit is clear: nibble | 0xF0 = nibble − 16 as a signed byte,
            // nibble alone = (16 + nibble) − 16 where it is set.
            let high = _mm256_andnot_si256(bytes_from_bits(qh), _mm256_set1_epi8(0xF0u8 as i8));
            _mm256_or_si256(nibbles(raw), high)
        } else {
            // SAFETY: a Q4_0 block is 18 bytes; its nibbles are bytes 2..18.
            let raw = unsafe { _mm_loadu_si128(w.add(2).cast()) };
            _mm256_sub_epi8(nibbles(raw), _mm256_set1_epi8(8))
        };
        (_mm256_sign_epi8(q, q), q)
    }
}

/// The eight exact lane sums of a block's products, as f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn lane_sums<const K: u8>(mag: __m256i, sign: __m256i, qy: __m256i) -> __m256 {
    _mm256_cvtepi32_ps(lane_ints::<K>(mag, sign, qy))
}

/// The eight exact lane sums of a block's products, as integers.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn lane_ints<const K: u8>(mag: __m256i, sign: __m256i, qy: __m256i) -> __m256i {
    let products = if K == Q4_1 {
        _mm256_maddubs_epi16(mag, qy)
    } else {
        _mm256_maddubs_epi16(mag, _mm256_sign_epi8(qy, sign))
    };
    _mm256_madd_epi16(products, _mm256_set1_epi16(1))
}

/// `[Σ v[0], Σ v[1], …, Σ v[7]]`: the lane totals of eight vectors, in one vector (integer
/// sums, exact in any order).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn totals8(v: &[__m256i; 8]) -> __m256i {
    let h01 = _mm256_hadd_epi32(v[0], v[1]);
    let h23 = _mm256_hadd_epi32(v[2], v[3]);
    let h45 = _mm256_hadd_epi32(v[4], v[5]);
    let h67 = _mm256_hadd_epi32(v[6], v[7]);
    // Per 128-bit half: [Σ₄ v0, Σ₄ v1, Σ₄ v2, Σ₄ v3] of that half's lanes.
    let h0123 = _mm256_hadd_epi32(h01, h23);
    let h4567 = _mm256_hadd_epi32(h45, h67);
    _mm256_add_epi32(
        _mm256_permute2x128_si256::<0x20>(h0123, h4567),
        _mm256_permute2x128_si256::<0x31>(h0123, h4567),
    )
}

/// The f16 scales (bytes 0..2) and, for Q4_1, minima (bytes 2..4) of blocks `g .. g + count`
/// (`count ≤ 8`) of a row, as f32 lanes `k ↔ block g + k` (zero for `k ≥ count`).
///
/// Eight plain loads of each block's first four bytes (inside the block for every format),
/// put together in one vector, so no per-block scalar conversion sits in the loop. (A
/// `vpgatherdd` did the same; on Zen 3 the decode products over SmolLM2 ran 1.1× faster
/// without it, docs/results.md.) With a constant `count` the lane tests fold away.
///
/// # Safety
/// AVX2/F16C; blocks `g .. g + count` of the row at `w0` (stride `block_bytes(K)`) are readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scales<const K: u8>(w0: *const u8, g: usize, count: usize) -> (__m256, __m256) {
    let bb = block_bytes(K);
    let word = |k: usize| {
        if k < count {
            // SAFETY: bytes 0..4 of block g + k < g + count are readable (caller).
            unsafe { (w0.add((g + k) * bb) as *const i32).read_unaligned() }
        } else {
            0
        }
    };
    let words = _mm256_setr_epi32(
        word(0),
        word(1),
        word(2),
        word(3),
        word(4),
        word(5),
        word(6),
        word(7),
    );
    // Per 128-bit half: [d0..d3, m0..m3]; then [d0..d7 | m0..m7].
    let low = _mm256_and_si256(words, _mm256_set1_epi32(0xFFFF));
    let high = _mm256_srli_epi32::<16>(words);
    let packed = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packus_epi32(low, high));
    (
        _mm256_cvtph_ps(_mm256_castsi256_si128(packed)),
        _mm256_cvtph_ps(_mm256_extracti128_si256::<1>(packed)),
    )
}

/// `Σ_j w_j·x̂_j` of a weight row of format `K` and a quantized activation row.
///
/// # Safety
/// The CPU supports AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot<const K: u8>(row: &[u8], act: &Q8Row<'_>) -> f32 {
    // SAFETY: same contract.
    unsafe { dot_rows::<K, 1>(&[row], act)[0] }
}

/// [`dot`] of `R` weight rows with the same activation row at once: the rows' accumulators
/// are independent FMA chains, so their latencies overlap (one row alone waits on its chain).
/// Row `r` of the result has the bits `dot::<K>(rows[r], act)` returns.
///
/// # Safety
/// The CPU supports AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_rows<const K: u8, const R: usize>(
    rows: &[&[u8]; R],
    act: &Q8Row<'_>,
) -> [f32; R] {
    let bb = block_bytes(K);
    // Clamp to what every buffer holds, so no read below can leave them.
    let mut nb = act
        .blocks()
        .min(act.qs.len() / Q8_BLOCK)
        .min(act.d.len() / SCALE_LANES * SCALE_LANES)
        .min(act.s.len());
    for row in rows {
        nb = nb.min(row.len() / bb);
    }
    let w0: [*const u8; R] = core::array::from_fn(|r| rows[r].as_ptr());
    let y0 = act.qs.as_ptr();
    let mut acc = [_mm256_setzero_ps(); R];
    let mut summs = [0.0f32; R];
    let mut dd = [[0.0f32; 8]; R];
    let mut mw = [[0.0f32; 8]; R];
    let mut g = 0;
    while g < nb {
        let count = (nb - g).min(8);
        // SAFETY: g + 8 ≤ d.len() because g < nb ≤ d.len() rounded down to a multiple of 8 and
        // g is a multiple of 8.
        let dx = unsafe { _mm256_loadu_ps(act.d.as_ptr().add(g)) };
        for r in 0..R {
            prefetch_ahead(w0[r].wrapping_add(g * bb), 8 * bb);
            // SAFETY: blocks g .. g + count are below nb, within row r; `dd[r]`/`mw[r]` hold 8
            // floats.
            unsafe {
                let (dw, m) = scales::<K>(w0[r], g, count);
                _mm256_storeu_ps(dd[r].as_mut_ptr(), _mm256_mul_ps(dw, dx));
                _mm256_storeu_ps(mw[r].as_mut_ptr(), m);
            }
        }
        for k in 0..count {
            let b = g + k;
            // SAFETY: b < nb: the activation bytes and sum of block b are in bounds.
            let (qy, sx) = unsafe {
                (
                    _mm256_loadu_si256(y0.add(b * Q8_BLOCK).cast()),
                    *act.s.as_ptr().add(b),
                )
            };
            for r in 0..R {
                // SAFETY: b < nb: block b of row r is in bounds.
                let (mag, sign) = unsafe { weights::<K>(w0[r].add(b * bb)) };
                acc[r] = _mm256_fmadd_ps(
                    _mm256_set1_ps(dd[r][k]),
                    lane_sums::<K>(mag, sign, qy),
                    acc[r],
                );
                if K == Q4_1 {
                    summs[r] = mw[r][k].mul_add(sx, summs[r]);
                }
            }
        }
        g += 8;
    }
    core::array::from_fn(|r| {
        if K == Q4_1 {
            hsum(acc[r]) + summs[r]
        } else {
            hsum(acc[r])
        }
    })
}

/// [`dot_rows`] in the block-lanes order ([`combine_block_lanes`](super::scalar::combine_block_lanes)):
/// per group of eight blocks, the blocks' exact integer sums are gathered into one vector
/// (lane `k` ↔ block `g + k`), turned into the eight terms with one multiply (Q4_1: and one
/// FMA), and added to the row's accumulator, whose lane `k` is then the running sum of blocks
/// `≡ k mod 8`. Row `r` of the result has the scalar kernel's bits.
///
/// # Safety
/// The CPU supports AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_rows_block_lanes<const K: u8, const R: usize>(
    rows: &[&[u8]; R],
    act: &Q8Row<'_>,
) -> [f32; R] {
    let bb = block_bytes(K);
    // Clamp to what every buffer holds, so no read below can leave them.
    let mut nb = act
        .blocks()
        .min(act.qs.len() / Q8_BLOCK)
        .min(act.d.len() / SCALE_LANES * SCALE_LANES)
        .min(act.s.len() / SCALE_LANES * SCALE_LANES);
    for row in rows {
        nb = nb.min(row.len() / bb);
    }
    let w0: [*const u8; R] = core::array::from_fn(|r| rows[r].as_ptr());
    let y0 = act.qs.as_ptr();
    let mut acc = [_mm256_setzero_ps(); R];
    let mut g = 0;
    while g < nb {
        let count = (nb - g).min(8);
        // SAFETY: g + 8 ≤ d.len() and ≤ s.len(): g < nb, both lengths were rounded down to a
        // multiple of 8 in nb's clamp and g is a multiple of 8.
        let (dx, sx) = unsafe {
            (
                _mm256_loadu_ps(act.d.as_ptr().add(g)),
                _mm256_loadu_ps(act.s.as_ptr().add(g)),
            )
        };
        if count == 8 {
            for (r, acc) in acc.iter_mut().enumerate() {
                prefetch_ahead(w0[r].wrapping_add(g * bb), 8 * bb);
                // SAFETY: blocks g .. g + 8 are below nb, within row r and the activation.
                let t = unsafe { group_term::<K>(w0[r].add(g * bb), y0.add(g * Q8_BLOCK), dx, sx) };
                *acc = _mm256_add_ps(*acc, t);
            }
            g += 8;
            continue;
        }
        let mut qy = [_mm256_setzero_si256(); 8];
        for (k, qy) in qy.iter_mut().enumerate().take(count) {
            // SAFETY: g + k < nb: block g + k of the activation is in bounds.
            *qy = unsafe { _mm256_loadu_si256(y0.add((g + k) * Q8_BLOCK).cast()) };
        }
        for r in 0..R {
            prefetch_ahead(w0[r].wrapping_add(g * bb), 8 * bb);
            // SAFETY: blocks g .. g + count are below nb, within row r.
            let (dw, m) = unsafe { scales::<K>(w0[r], g, count) };
            let mut ints = [_mm256_setzero_si256(); 8];
            for k in 0..count {
                // SAFETY: as above.
                let (mag, sign) = unsafe { weights::<K>(w0[r].add((g + k) * bb)) };
                ints[k] = lane_ints::<K>(mag, sign, qy[k]);
            }
            // Lanes k ≥ count: isum 0, dw 0 and the activation's scale and sum padding 0
            // (`Q8Activation` fills it with zeros), so their term is ±0, which leaves a
            // running sum unchanged.
            let isum = _mm256_cvtepi32_ps(totals8(&ints));
            let dd = _mm256_mul_ps(dw, dx);
            let t = if K == Q4_1 {
                _mm256_fmadd_ps(dd, isum, _mm256_mul_ps(m, sx))
            } else {
                _mm256_mul_ps(dd, isum)
            };
            acc[r] = _mm256_add_ps(acc[r], t);
        }
        g += 8;
    }
    core::array::from_fn(|r| hsum(acc[r]))
}

/// The eight block-lanes terms of one whole group of eight blocks (lane `k` ↔ block `k`):
/// `d_w·d_x·isum` (Q4_1: `fma(d_w·d_x, isum, m_w·s_x)`), the operations of the general loop
/// in [`dot_rows_block_lanes`] on the same exact integer sums, so the same bits. The blocks'
/// integer sums are reduced pairwise as they are made (the tree of `totals8`) and each block
/// reads its activation from memory, so a group needs a few registers, not sixteen: the
/// general loop kept eight activation vectors and eight sums live and spilled them.
///
/// # Safety
/// AVX2/FMA/F16C; `w` points to eight whole blocks of format `K` and `y` to eight Q8 blocks
/// of the activation.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn group_term<const K: u8>(w: *const u8, y: *const i8, dx: __m256, sx: __m256) -> __m256 {
    let bb = block_bytes(K);
    // SAFETY: k < 8: block k of the weights and of the activation are readable (caller).
    let block = |k: usize| unsafe {
        let (mag, sign) = weights::<K>(w.add(k * bb));
        lane_ints::<K>(mag, sign, _mm256_loadu_si256(y.add(k * Q8_BLOCK).cast()))
    };
    let h01 = _mm256_hadd_epi32(block(0), block(1));
    let h23 = _mm256_hadd_epi32(block(2), block(3));
    let h0123 = _mm256_hadd_epi32(h01, h23);
    let h45 = _mm256_hadd_epi32(block(4), block(5));
    let h67 = _mm256_hadd_epi32(block(6), block(7));
    let h4567 = _mm256_hadd_epi32(h45, h67);
    let totals = _mm256_add_epi32(
        _mm256_permute2x128_si256::<0x20>(h0123, h4567),
        _mm256_permute2x128_si256::<0x31>(h0123, h4567),
    );
    // SAFETY: the eight blocks' headers are readable (caller).
    let (dw, m) = unsafe { scales::<K>(w, 0, 8) };
    let isum = _mm256_cvtepi32_ps(totals);
    let dd = _mm256_mul_ps(dw, dx);
    if K == Q4_1 {
        _mm256_fmadd_ps(dd, isum, _mm256_mul_ps(m, sx))
    } else {
        _mm256_mul_ps(dd, isum)
    }
}

/// `out[a] = dot::<K>(row, &acts[a])` for up to [`TILE`] activation rows at once (products of
/// several activation rows).
///
/// The row is unpacked once per segment of [`SEG_BLOCKS`] blocks into `buf` (the unsigned
/// multiplicands, the signed weights, the scales and minima as f32), then each block is
/// multiplied by every activation of the tile while its unpacked weights are in registers; the
/// tile's accumulators are independent FMA chains, so they overlap. Per activation, the
/// operations and their order are exactly those of [`dot`].
///
/// # Safety
/// The CPU supports AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_tile<const K: u8>(
    row: &[u8],
    acts: &[Q8Row<'_>],
    out: &mut [f32],
    buf: &mut TileBuf,
) {
    let bb = block_bytes(K);
    let tile = acts.len().min(out.len()).min(TILE);
    let acts = &acts[..tile];
    // Clamp to what every buffer holds, so no read below can leave them.
    let mut nb = row.len() / bb;
    for act in acts {
        nb = nb
            .min(act.blocks())
            .min(act.qs.len() / Q8_BLOCK)
            .min(act.d.len() / SCALE_LANES * SCALE_LANES)
            .min(act.s.len());
    }
    let mut acc = [_mm256_setzero_ps(); TILE];
    let mut summs = [0.0f32; TILE];
    let mut s0 = 0;
    while s0 < nb {
        let sn = (nb - s0).min(SEG_BLOCKS);
        unpack::<K>(&row[s0 * bb..(s0 + sn) * bb], buf);
        let mut a0 = 0;
        while a0 < tile {
            let step = match tile - a0 {
                8.. => 8,
                4..=7 => 4,
                2..=3 => 2,
                _ => 1,
            };
            let (a, r) = (a0..a0 + step, &acts[a0..a0 + step]);
            // SAFETY: blocks s0..s0 + sn are below nb (in every activation) and sn ≤ SEG_BLOCKS
            // (in `buf`); the slices hold exactly `step` activations and accumulators.
            unsafe {
                match step {
                    8 => accumulate::<K, 8>(buf, s0, sn, r, &mut acc[a.clone()], &mut summs[a]),
                    4 => accumulate::<K, 4>(buf, s0, sn, r, &mut acc[a.clone()], &mut summs[a]),
                    2 => accumulate::<K, 2>(buf, s0, sn, r, &mut acc[a.clone()], &mut summs[a]),
                    _ => accumulate::<K, 1>(buf, s0, sn, r, &mut acc[a.clone()], &mut summs[a]),
                }
            }
            a0 += step;
        }
        s0 += sn;
    }
    for (a, o) in out[..tile].iter_mut().enumerate() {
        *o = if K == Q4_1 {
            hsum(acc[a]) + summs[a]
        } else {
            hsum(acc[a])
        };
    }
}

/// [`dot_tile`] in the block-lanes order: `out[a]` has the bits of
/// [`dot_rows_block_lanes`] on `acts[a]`. The row is unpacked once per segment as in
/// [`dot_tile`]; then, token by token, each group of eight unpacked blocks gives eight lane
/// vectors, gathered into one vector of the blocks' integer sums and turned into their eight
/// terms as the one-row kernel does. A segment is a whole number of groups, so block `b`'s
/// term lands in lane `b mod 8` of the token's accumulator in every segment.
///
/// # Safety
/// The CPU supports AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_tile_block_lanes<const K: u8>(
    row: &[u8],
    acts: &[Q8Row<'_>],
    out: &mut [f32],
    buf: &mut TileBuf,
) {
    let bb = block_bytes(K);
    let tile = acts.len().min(out.len()).min(TILE);
    let acts = &acts[..tile];
    // Clamp to what every buffer holds, so no read below can leave them.
    let mut nb = row.len() / bb;
    for act in acts {
        nb = nb
            .min(act.blocks())
            .min(act.qs.len() / Q8_BLOCK)
            .min(act.d.len() / SCALE_LANES * SCALE_LANES)
            .min(act.s.len() / SCALE_LANES * SCALE_LANES);
    }
    let mut acc = [_mm256_setzero_ps(); TILE];
    let mut s0 = 0;
    while s0 < nb {
        let sn = (nb - s0).min(SEG_BLOCKS);
        unpack::<K>(&row[s0 * bb..(s0 + sn) * bb], buf);
        // The last group's blocks past the row: scale and minimum 0, so their terms are ±0.
        for k in sn..sn.next_multiple_of(8) {
            (buf.d[k], buf.m[k]) = (0.0, 0.0);
        }
        for (act, acc) in acts.iter().zip(&mut acc) {
            let y = act.qs.as_ptr();
            let mut g = 0;
            while g < sn {
                let count = (sn - g).min(8);
                let mut ints = [_mm256_setzero_si256(); 8];
                for (k, ints) in ints.iter_mut().enumerate().take(count) {
                    let b = s0 + g + k;
                    // SAFETY: b < nb: block b is within the activation; g + k < sn ≤
                    // SEG_BLOCKS, and the buffer's blocks are 32-byte aligned.
                    unsafe {
                        let qy = _mm256_loadu_si256(y.add(b * Q8_BLOCK).cast());
                        let mag = _mm256_load_si256(buf.mag[g + k].0.as_ptr().cast());
                        let sign = _mm256_load_si256(buf.sign[g + k].0.as_ptr().cast());
                        *ints = lane_ints::<K>(mag, sign, qy);
                    }
                }
                // SAFETY: g + 8 ≤ SEG_BLOCKS (g is a multiple of 8 below sn ≤ SEG_BLOCKS, a
                // multiple of 8); s0 + g + 8 ≤ d.len() and ≤ s.len(): s0 + g < nb, both
                // lengths rounded down to multiples of 8 in nb's clamp.
                let (dw, mw, dx, sx) = unsafe {
                    (
                        _mm256_loadu_ps(buf.d.as_ptr().add(g)),
                        _mm256_loadu_ps(buf.m.as_ptr().add(g)),
                        _mm256_loadu_ps(act.d.as_ptr().add(s0 + g)),
                        _mm256_loadu_ps(act.s.as_ptr().add(s0 + g)),
                    )
                };
                let isum = _mm256_cvtepi32_ps(totals8(&ints));
                let dd = _mm256_mul_ps(dw, dx);
                let t = if K == Q4_1 {
                    _mm256_fmadd_ps(dd, isum, _mm256_mul_ps(mw, sx))
                } else {
                    _mm256_mul_ps(dd, isum)
                };
                *acc = _mm256_add_ps(*acc, t);
                g += 8;
            }
        }
        s0 += sn;
    }
    for (o, acc) in out[..tile].iter_mut().zip(&acc) {
        *o = hsum(*acc);
    }
}

/// Adds blocks `s0 .. s0 + sn` (unpacked in `buf`) of `T` activations to their accumulators.
///
/// # Safety
/// AVX2/FMA/F16C; `acts`, `acc` and `summs` hold `T ≤ TILE` entries; `sn ≤ SEG_BLOCKS`, `s0` is a
/// multiple of 8, and blocks `s0 .. s0 + sn` are within every activation's `qs` and `s` and
/// below its `d.len()`, which is a multiple of 8.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn accumulate<const K: u8, const T: usize>(
    buf: &mut TileBuf,
    s0: usize,
    sn: usize,
    acts: &[Q8Row<'_>],
    acc: &mut [__m256],
    summs: &mut [f32],
) {
    let mut a = [_mm256_setzero_ps(); T];
    let mut sm = [0.0f32; T];
    a.copy_from_slice(&acc[..T]);
    sm.copy_from_slice(&summs[..T]);
    let y: [*const i8; T] = core::array::from_fn(|j| acts[j].qs.as_ptr());
    let s: [*const f32; T] = core::array::from_fn(|j| acts[j].s.as_ptr());
    // The scale products d_w·d_x, eight blocks per multiply (the same single rounding as a
    // scalar product).
    for (j, act) in acts.iter().enumerate().take(T) {
        for k in (0..sn).step_by(8) {
            // SAFETY: k + 8 ≤ SEG_BLOCKS (sn ≤ SEG_BLOCKS, both multiples of 8 or k < sn);
            // s0 + k + 8 ≤ d.len(): s0 + k < nb ≤ d.len(), d.len() and s0 + k are multiples of 8.
            unsafe {
                let dd = _mm256_mul_ps(
                    _mm256_loadu_ps(buf.d.as_ptr().add(k)),
                    _mm256_loadu_ps(act.d.as_ptr().add(s0 + k)),
                );
                _mm256_storeu_ps(buf.dd[j].as_mut_ptr().add(k), dd);
            }
        }
    }
    for k in 0..sn {
        let b = s0 + k;
        // SAFETY: k < sn ≤ SEG_BLOCKS; the buffer's blocks are 32-byte aligned.
        let (mag, sign) = unsafe {
            (
                _mm256_load_si256(buf.mag[k].0.as_ptr().cast()),
                _mm256_load_si256(buf.sign[k].0.as_ptr().cast()),
            )
        };
        let mw = buf.m[k];
        for j in 0..T {
            // SAFETY: block b is within activation j (caller).
            let qy = unsafe { _mm256_loadu_si256(y[j].add(b * Q8_BLOCK).cast()) };
            let dd = _mm256_set1_ps(buf.dd[j][k]);
            a[j] = _mm256_fmadd_ps(dd, lane_sums::<K>(mag, sign, qy), a[j]);
            if K == Q4_1 {
                // SAFETY: as above.
                sm[j] = mw.mul_add(unsafe { *s[j].add(b) }, sm[j]);
            }
        }
    }
    acc[..T].copy_from_slice(&a);
    summs[..T].copy_from_slice(&sm);
}

/// Unpacks whole blocks of format `K` (at most [`SEG_BLOCKS`]) into `buf`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn unpack<const K: u8>(blocks: &[u8], buf: &mut TileBuf) {
    let bb = block_bytes(K);
    for (k, w) in blocks.chunks_exact(bb).take(SEG_BLOCKS).enumerate() {
        // SAFETY: `w` is one whole block; each destination is a 32-byte-aligned 32-byte array.
        unsafe {
            let (mag, sign) = weights::<K>(w.as_ptr());
            buf.d[k] = f16_at(w.as_ptr());
            if K == Q4_1 {
                buf.m[k] = f16_at(w.as_ptr().add(2));
            }
            _mm256_store_si256(buf.mag[k].0.as_mut_ptr().cast(), mag);
            _mm256_store_si256(buf.sign[k].0.as_mut_ptr().cast(), sign);
        }
    }
}

/// Unpacks the first `blocks` blocks of `row` (format `K`) for the matrix-product kernels:
/// signed values, `128·Σw`, scale and minimum per block.
///
/// # Safety
/// The CPU supports AVX2, FMA and F16C; `row` holds at least `blocks` blocks of `K`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn unpack_row<const K: u8>(buf: &mut UnpackedRow, row: &[u8], blocks: usize) {
    let bb = block_bytes(K);
    buf.values.resize(blocks * 32, 0);
    buf.correction.resize(blocks, 0);
    buf.d.resize(blocks, 0.0);
    buf.m.resize(blocks, 0.0);
    for b in 0..blocks {
        let w = row[b * bb..(b + 1) * bb].as_ptr();
        // SAFETY: `w` is a whole block of K (caller); `values` holds 32 bytes at 32·b.
        unsafe {
            let (mag, sign) = weights::<K>(w);
            let signed = if K == Q4_1 { mag } else { sign };
            _mm256_storeu_si256(buf.values.as_mut_ptr().add(32 * b).cast(), signed);
            buf.d[b] = f16_at(w);
            if K == Q4_1 {
                buf.m[b] = f16_at(w.add(2));
            }
        }
        let sum: i32 = buf.values[32 * b..32 * (b + 1)]
            .iter()
            .map(|&v| v as i32)
            .sum();
        buf.correction[b] = 128 * sum;
    }
}
