//! AVX-512 (F, BW, VL, VBMI) run kernels: sixteen coordinates per instruction.
//!
//! Every function here is `unsafe` only because it requires those CPU features (and AVX2, FMA,
//! F16C, which every such CPU has): the dispatcher in `mod.rs` calls them after runtime
//! detection, with lengths already checked. The vector primitives (dot, axpy, exp, ...) and the
//! sign tables are shared with the AVX2 path.
//!
//! Packed codes: sixteen b-bit codes take exactly `2b` bytes, so chunk `j` starts at byte
//! `2b·j`. For b ≤ 4 the chunk is one `u64`, broadcast to the eight qwords; `vpmultishiftqb`
//! then moves code `2k` to the low byte of dword `2k` and code `2k + 1` to the low byte of
//! dword `2k + 1` (bit offsets `2bk` and `2bk + b`), and one `vpermps` looks the low four bits
//! up in a 16-entry table (for b < 4 the table repeats the `2^b` centroids). That is two
//! shuffle µops per sixteen codes, as many as `vcvtph2ps` takes for sixteen f16 values. For
//! b ≥ 5 the 16-byte chunk is first spread with `vpermb` so each qword holds the bytes of its
//! two codes, then `vpmultishiftqb` extracts them and `vpermt2ps` reads the codebook: one
//! for b = 5 (32 entries); for b = 6 and 7 two or four of them, blended on the code's bits 5
//! and 6 (the centroids a gather of sixteen loads would read, in a few cycles: `rec4.25`'s
//! 6-bit key group, `k6v5-global`'s keys); b = 8 gathers. A dimension that is not a multiple
//! of 16 ends with a masked chunk.
//!
//! Scores: each token's dot products leave one 16-lane accumulator per head; sixteen tokens'
//! accumulators are summed together by [`reduce16`] (a 4-level shuffle tree, the same for every
//! token) and added to the scores with one masked read-modify-write per head, instead of a
//! horizontal add and scalar stores per token. Records whose coded parts are the presets'
//! layouts (one or two parts of whole chunks, each one 8-byte load inside the record — the
//! last chunk of 3- and 2-bit codes loads the record's last 8 bytes and shifts; QJL signs, if
//! any, through sign tables) take [`score_flat`], whose chunk loops unroll with the queries held in
//! registers.
//!
//! These intrinsics are stable since Rust 1.89, hence the module-wide `incompatible_msrv`
//! allowance (see the crate's `rust-version`).
#![allow(clippy::incompatible_msrv)]

use core::arch::x86_64::*;

use super::super::primitives::{
    EXP_HIGH, EXP_LN2_HI, EXP_LN2_LO, EXP_LOG2E, EXP_LOW, EXP_POLY, exp_poly,
};
use super::x86::{L1_BYTES, hsum4, read_padded, sign_table_sum};
use super::{CodedRun, KeyQueries, PlainKind, PlainRun, sign_table_len, tiles};

/// Bytes a chunk read takes: 8 for b ≤ 4, 16 above.
const fn read_width(b: u32) -> usize {
    if b <= 4 { 8 } else { 16 }
}

/// Chunks `j < chunks` whose read (`read_width` bytes at `2b·j`) stays inside a `bytes`-byte
/// record; they come first, the rest are read byte by byte.
fn fast_chunks(chunks: usize, b: u32, bytes: usize) -> usize {
    let width = read_width(b);
    if bytes < width {
        0
    } else {
        chunks.min((bytes - width) / (2 * b as usize) + 1)
    }
}

/// Centroid tables and shuffle controls for b-bit codes.
struct Lut {
    lo: __m512,
    hi: __m512,
    /// b = 6, 7: the 64 or 128 centroids, sixteen per register (looked up in pairs by
    /// `vpermt2ps` and blended on the code's high bits; b = 8 gathers).
    wide: [__m512; 8],
    /// `vpmultishiftqb` control: byte 0 of dword `2k` ← code `2k`, of dword `2k+1` ← code `2k+1`.
    control: __m512i,
    /// `vpermb` spread for b ≥ 5: qword `k` ← chunk bytes `⌊2bk/8⌋..`.
    spread: __m512i,
    mask: __m512i,
    centroids: *const f32,
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
unsafe fn lut<const B: u32>(centroids: &[f32]) -> Lut {
    let b = B as usize;
    let levels = 1usize << B;
    let table = |first: usize| {
        let mut t = [0.0f32; 16];
        for (k, v) in t.iter_mut().enumerate() {
            *v = centroids[(first + k) % levels];
        }
        t
    };
    let (lo, hi) = if B == 5 {
        (table(0), table(16))
    } else {
        (table(0), table(0))
    };
    let wide: [[f32; 16]; 8] = std::array::from_fn(|r| {
        if B == 6 || B == 7 {
            table(16 * r)
        } else {
            [0.0; 16]
        }
    });
    let mut control = [0u8; 64];
    let mut spread = [0u8; 64];
    for k in 0..8 {
        let first_bit = 2 * b * k;
        let base = if B <= 4 { 0 } else { first_bit / 8 };
        let offset = first_bit - 8 * base;
        control[8 * k] = offset as u8;
        control[8 * k + 4] = (offset + b) as u8;
        for i in 0..8 {
            spread[8 * k + i] = ((base + i) % 16) as u8;
        }
    }
    // SAFETY: the arrays hold 16 floats and 64 bytes.
    unsafe {
        Lut {
            lo: _mm512_loadu_ps(lo.as_ptr()),
            hi: _mm512_loadu_ps(hi.as_ptr()),
            wide: std::array::from_fn(|r| _mm512_loadu_ps(wide[r].as_ptr())),
            control: _mm512_loadu_si512(control.as_ptr() as *const _),
            spread: _mm512_loadu_si512(spread.as_ptr() as *const _),
            mask: _mm512_set1_epi32((1 << B) - 1),
            centroids: centroids.as_ptr(),
        }
    }
}

/// The centroids of the sixteen codes in `chunk` (b ≤ 4: the `u64` broadcast to every qword;
/// b ≥ 5: the 16 bytes broadcast to every 128-bit lane).
///
/// # Safety
/// AVX-512 features; `lut` was built by [`lut::<B>`] from a live slice of `2^B` centroids.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
unsafe fn lookup<const B: u32>(lut: &Lut, chunk: __m512i) -> __m512 {
    if B <= 4 {
        let idx = _mm512_multishift_epi64_epi8(lut.control, chunk);
        _mm512_permutexvar_ps(idx, lut.lo)
    } else {
        let spread = _mm512_permutexvar_epi8(lut.spread, chunk);
        let idx = _mm512_multishift_epi64_epi8(lut.control, spread);
        if B == 5 {
            _mm512_permutex2var_ps(lut.lo, idx, lut.hi)
        } else if B == 6 || B == 7 {
            // Each `vpermt2ps` looks up 32 centroids by the code's low five bits; bit 5 (and
            // bit 6) of the extracted byte, the code's own high bits, pick among them. The
            // same centroids as a gather, in a few cycles instead of sixteen loads.
            let w = &lut.wide;
            let bit5 = _mm512_test_epi32_mask(idx, _mm512_set1_epi32(1 << 5));
            // The 64 centroids from register `r` on, picked by the code's low six bits.
            let sixty_four = |r: usize| {
                _mm512_mask_blend_ps(
                    bit5,
                    _mm512_permutex2var_ps(w[r], idx, w[r + 1]),
                    _mm512_permutex2var_ps(w[r + 2], idx, w[r + 3]),
                )
            };
            if B == 6 {
                sixty_four(0)
            } else {
                let bit6 = _mm512_test_epi32_mask(idx, _mm512_set1_epi32(1 << 6));
                _mm512_mask_blend_ps(bit6, sixty_four(0), sixty_four(4))
            }
        } else {
            let idx = _mm512_and_si512(idx, lut.mask);
            // SAFETY: every index is masked below 2^B, the length of the centroid slice.
            unsafe { _mm512_i32gather_ps::<4>(idx, lut.centroids) }
        }
    }
}

/// The centroids of chunk `j` (codes `16j..16j+16`), read directly.
///
/// # Safety
/// As [`lookup`]; `record` points to at least `2B·j + read_width(B)` readable bytes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
unsafe fn chunk<const B: u32>(lut: &Lut, record: *const u8, j: usize) -> __m512 {
    // SAFETY: caller contract; unaligned reads are fine.
    unsafe {
        let p = record.add(2 * B as usize * j);
        let bits = if B <= 4 {
            _mm512_set1_epi64((p as *const i64).read_unaligned())
        } else {
            _mm512_broadcast_i32x4(_mm_loadu_si128(p as *const __m128i))
        };
        lookup::<B>(lut, bits)
    }
}

/// The centroids of chunk `j` read byte by byte, zero padded (near the end of a record).
///
/// # Safety
/// As [`lookup`]; `record` points to `bytes` readable bytes and `2B·j ≤ bytes`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
unsafe fn chunk_padded<const B: u32>(
    lut: &Lut,
    record: *const u8,
    bytes: usize,
    j: usize,
) -> __m512 {
    // SAFETY: forwarded caller contract.
    unsafe {
        let offset = 2 * B as usize * j;
        let low = read_padded(record, bytes, offset, 8);
        let bits = if B <= 4 {
            _mm512_set1_epi64(low as i64)
        } else {
            let high = if offset + 8 <= bytes {
                read_padded(record, bytes, offset + 8, 8)
            } else {
                0
            };
            _mm512_broadcast_i32x4(_mm_set_epi64x(high as i64, low as i64))
        };
        lookup::<B>(lut, bits)
    }
}

/// Records ahead of the current one that the kernels prefetch (a few hundred cycles of work).
const PREFETCH_AHEAD: usize = 8;

/// Asks for the cache lines of the record `ahead` records after `record` (`bytes` long, at most
/// two lines are requested). Prefetches are hints: they never fault, so the address may lie
/// past the run (it is computed with wrapping arithmetic and never dereferenced).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
unsafe fn prefetch_record(record: *const u8, stride: usize, bytes: usize) {
    let next = record.wrapping_add(PREFETCH_AHEAD * stride) as *const i8;
    _mm_prefetch::<_MM_HINT_T0>(next);
    if bytes > 64 {
        _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(64));
    }
}

/// Lanes below `count` (≤ 16).
fn lanes(count: usize) -> __mmask16 {
    ((1u32 << count) - 1) as __mmask16
}

/// Sums the two 256-bit halves.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
unsafe fn fold(v: __m512) -> __m256 {
    let high = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
    _mm256_add_ps(_mm512_castps512_ps256(v), high)
}

/// Per head `h < heads`, the accumulator folded to 256 bits, for [`hsum4`].
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
unsafe fn merge(a: &[__m512; 4], heads: usize) -> [__m256; 4] {
    let mut out = [_mm256_setzero_ps(); 4];
    for (h, o) in out.iter_mut().enumerate().take(heads) {
        // SAFETY: same target features as this function.
        *o = unsafe { fold(a[h]) };
    }
    out
}

/// Slot of token `k` (< 16) in a [`TokenBatch`]: the 4×4 transpose that [`reduce16`]'s
/// shuffles undo, so its sums come out in token order.
const fn batch_slot(k: usize) -> usize {
    4 * (k % 4) + k / 4
}

/// Sixteen lanes of each of sixteen vectors summed by one fixed pairwise tree: lane `s` of the
/// result is the sum of `v[batch_slot(s)]`. Every vector goes through the same tree (halves
/// `(0+2)` and `(1+3)` of its 128-bit quarters, then of the remaining four floats), so a
/// token's sum never depends on its neighbours or on its place in the batch. Four levels of
/// two shuffles and an add give all sixteen sums with 45 instructions, where reducing one
/// token at a time takes a fold and a share of three horizontal adds per token.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
fn reduce16(v: &[__m512; 16]) -> __m512 {
    // Level 1: 128-bit quarters (0, 1) + (2, 3) of a pair of vectors, side by side.
    let mut half = [_mm512_setzero_ps(); 8];
    for (k, h) in half.iter_mut().enumerate() {
        let (a, b) = (v[2 * k], v[2 * k + 1]);
        let x = _mm512_shuffle_f32x4::<0b01_00_01_00>(a, b);
        let y = _mm512_shuffle_f32x4::<0b11_10_11_10>(a, b);
        *h = _mm512_add_ps(x, y);
    }
    // Level 2: the two remaining quarters of four vectors: quarter `j` of `quarter[k]` holds the
    // four partial sums of vector `4k + j`.
    let mut quarter = [_mm512_setzero_ps(); 4];
    for (k, q) in quarter.iter_mut().enumerate() {
        let (a, b) = (half[2 * k], half[2 * k + 1]);
        let x = _mm512_shuffle_f32x4::<0b10_00_10_00>(a, b);
        let y = _mm512_shuffle_f32x4::<0b11_01_11_01>(a, b);
        *q = _mm512_add_ps(x, y);
    }
    // Levels 3 and 4, inside each 128-bit quarter: floats (0+2, 1+3), then their sum.
    let pair = |a: __m512, b: __m512| {
        _mm512_add_ps(
            _mm512_shuffle_ps::<0b01_00_01_00>(a, b),
            _mm512_shuffle_ps::<0b11_10_11_10>(a, b),
        )
    };
    let (p0, p1) = (pair(quarter[0], quarter[1]), pair(quarter[2], quarter[3]));
    _mm512_add_ps(
        _mm512_shuffle_ps::<0b10_00_10_00>(p0, p1),
        _mm512_shuffle_ps::<0b11_01_11_01>(p0, p1),
    )
}

/// Up to sixteen consecutive tokens' score accumulators (one 16-lane register per head, and a
/// per-head term added after the reduction) awaiting one batched reduction: the score kernels
/// push a token at a time and flush every sixteen, adding the sums to `out` with one masked
/// read-modify-write per head instead of a horizontal add and a scalar store per token.
struct TokenBatch {
    acc: [[__m512; 16]; 4],
    extra: [[f32; 16]; 4],
    count: usize,
    /// Token index of the batch's first token.
    first: usize,
}

impl TokenBatch {
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
    fn new() -> Self {
        Self {
            acc: [[_mm512_setzero_ps(); 16]; 4],
            extra: [[0.0; 16]; 4],
            count: 0,
            first: 0,
        }
    }

    /// Adds token `first + count`'s accumulators of heads `h < H` and, with `EXTRA`, its
    /// per-head terms (lane `h` of `extra`).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
    fn push<const H: usize, const EXTRA: bool>(&mut self, acc: &[__m512; 4], extra: __m128) {
        let slot = batch_slot(self.count);
        for (row, &a) in self.acc.iter_mut().zip(acc).take(H) {
            row[slot] = a;
        }
        if EXTRA {
            let mut t = [0.0f32; 4];
            // SAFETY: `t` holds four floats.
            unsafe { _mm_storeu_ps(t.as_mut_ptr(), extra) };
            for (row, &e) in self.extra.iter_mut().zip(&t).take(H) {
                row[self.count] = e;
            }
        }
        self.count += 1;
    }

    /// Reduces the waiting tokens and adds score `s` of head `h` to `out[h·stride + first + s]`;
    /// the next batch starts after them.
    ///
    /// # Safety
    /// AVX-512 features; `out[h·stride + first + s]` is writable for `h < H`, `s < count`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
    unsafe fn flush<const H: usize, const EXTRA: bool>(&mut self, out: *mut f32, stride: usize) {
        if self.count == 0 {
            return;
        }
        let mask = lanes(self.count);
        for h in 0..H {
            for k in self.count..16 {
                self.acc[h][batch_slot(k)] = _mm512_setzero_ps();
            }
            let mut sums = reduce16(&self.acc[h]);
            // SAFETY: caller contract; masked lanes are neither read nor written.
            unsafe {
                if EXTRA {
                    sums = _mm512_add_ps(sums, _mm512_loadu_ps(self.extra[h].as_ptr()));
                }
                let o = out.add(h * stride + self.first);
                let old = _mm512_maskz_loadu_ps(mask, o);
                _mm512_mask_storeu_ps(o, mask, _mm512_add_ps(old, sums));
            }
        }
        self.first += self.count;
        self.count = 0;
    }
}

macro_rules! by_heads {
    ($heads:expr, $f:ident::<$($c:tt),*>($($arg:expr),* $(,)?)) => {
        match $heads {
            1 => $f::<$($c,)* 1>($($arg),*),
            2 => $f::<$($c,)* 2>($($arg),*),
            3 => $f::<$($c,)* 3>($($arg),*),
            _ => $f::<$($c,)* 4>($($arg),*),
        }
    };
}

macro_rules! by_bits_heads {
    ($bits:expr, $heads:expr, $f:ident($($arg:expr),* $(,)?)) => {
        match $bits {
            1 => by_heads!($heads, $f::<1>($($arg),*)),
            2 => by_heads!($heads, $f::<2>($($arg),*)),
            3 => by_heads!($heads, $f::<3>($($arg),*)),
            4 => by_heads!($heads, $f::<4>($($arg),*)),
            5 => by_heads!($heads, $f::<5>($($arg),*)),
            6 => by_heads!($heads, $f::<6>($($arg),*)),
            7 => by_heads!($heads, $f::<7>($($arg),*)),
            _ => by_heads!($heads, $f::<8>($($arg),*)),
        }
    };
}

/// One part of a record for [`score_parts`] (codes of b ≤ 4 bits, optionally QJL signs).
struct Segment<'a> {
    /// The 16-entry centroid table (the `2^b` centroids repeated for b < 4).
    table: __m512,
    /// `vpmultishiftqb` control for b-bit codes (see [`lut`]).
    control: __m512i,
    /// `2b`: bytes per 16 codes.
    chunk_bytes: usize,
    /// Byte offset of the codes in a record; readable bytes from there to the record's end.
    code_offset: usize,
    bytes: usize,
    /// Fast chunks (one direct 8-byte read), whole chunks, and coordinates past them.
    fast: usize,
    full: usize,
    tail: usize,
    dim: usize,
    /// The tile's query rows `[H, dim]` and sketch rows `[H, m]`.
    queries: *const f32,
    sketch: *const f32,
    /// Byte offset of the sign words in a record and the sketch dimension (0: no signs).
    sign_offset: usize,
    sketch_dim: usize,
    /// The tile's sign tables (`ceil(m/8)·256·4` floats), empty without.
    tables: &'a [f32],
    /// Norm (and `γ`) of record `i` at `scales[i·scale_stride]`.
    scales: &'a [f32],
    scale_stride: usize,
}

/// The 8 bytes from the start of whole chunk `c` of `chunk_bytes` bytes of codes at `codes`, in
/// the low bytes, read in bounds: chunks `c < fast` read directly; a later one (the last one of
/// 3- and 2-bit codes at d = 64, whose 6 or 4 bytes end the record) reads the record's last 8
/// bytes (`bytes` from `codes`) and shifts its own down. The bytes above the chunk's differ
/// (zeros instead of what follows), and no decode reads them.
///
/// # Safety
/// `codes` points to `bytes ≥ 8` readable bytes, chunk `c` lies inside them, and chunks below
/// `fast` have 8 readable bytes from their start.
#[inline]
unsafe fn chunk_bits(
    codes: *const u8,
    c: usize,
    chunk_bytes: usize,
    fast: usize,
    bytes: usize,
) -> i64 {
    let offset = chunk_bytes * c;
    // SAFETY: caller contract: a fast chunk's 8 bytes lie inside the record; otherwise
    // `bytes − 8 ≥ 0` and the read ends at the record's end, and the whole chunk lies inside
    // (`offset + 2b ≤ bytes`), so the shift `offset + 8 − bytes` is below 8.
    unsafe {
        if c < fast {
            (codes.add(offset) as *const i64).read_unaligned()
        } else {
            let back = offset + 8 - bytes;
            let word = (codes.add(bytes - 8) as *const u64).read_unaligned();
            (word >> (8 * back)) as i64
        }
    }
}

/// The `vpmultishiftqb` control and 16-entry centroid table of b-bit codes (b ≤ 4): code `2k`
/// to the low byte of dword `2k`, code `2k + 1` to that of dword `2k + 1`; the `2^b` centroids
/// repeated.
///
/// # Safety
/// AVX-512 features; `centroids` holds `2^b` values.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
unsafe fn small_code_lut(centroids: &[f32], b: usize) -> (__m512, __m512i) {
    let mut control = [0u8; 64];
    for k in 0..8 {
        control[8 * k] = (2 * b * k) as u8;
        control[8 * k + 4] = (2 * b * k + b) as u8;
    }
    let levels = 1usize << b;
    let table: [f32; 16] = std::array::from_fn(|k| centroids[k % levels]);
    // SAFETY: the arrays hold 16 floats and 64 bytes.
    unsafe {
        (
            _mm512_loadu_ps(table.as_ptr()),
            _mm512_loadu_si512(control.as_ptr() as *const _),
        )
    }
}

/// The centroids (of `table`) of the sixteen codes in `bits`, a chunk's 8 bytes (`control`
/// from [`small_code_lut`]).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
fn decode_small(control: __m512i, bits: i64, table: __m512) -> __m512 {
    let idx = _mm512_multishift_epi64_epi8(control, _mm512_set1_epi64(bits));
    _mm512_permutexvar_ps(idx, table)
}

impl Segment<'_> {
    /// The centroid table scaled by record `i`'s norm.
    ///
    /// # Safety
    /// AVX-512 features; `i` is a record of the run.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
    unsafe fn scaled_table(&self, i: usize) -> __m512 {
        // SAFETY: caller contract; `CodedRun::check` made the scales cover every record.
        let norm = unsafe { *self.scales.get_unchecked(i * self.scale_stride) };
        _mm512_mul_ps(self.table, _mm512_set1_ps(norm))
    }

    /// The centroids (of `table`) of the sixteen codes in `bits`, a chunk's 8 bytes.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
    fn decode(&self, bits: i64, table: __m512) -> __m512 {
        decode_small(self.control, bits, table)
    }

    /// The 8 bytes of whole chunk `c` (`c < full`) of the codes at `codes` ([`chunk_bits`]).
    ///
    /// # Safety
    /// `codes` is this segment's code start in a record, `c < full` and `bytes ≥ 8`.
    #[inline]
    unsafe fn chunk_bits(&self, codes: *const u8, c: usize) -> i64 {
        // SAFETY: forwarded contract.
        unsafe { chunk_bits(codes, c, self.chunk_bytes, self.fast, self.bytes) }
    }

    /// `signed + γ·(sign-table sum)` of record `i` (at `rec`), for a segment with sign tables.
    ///
    /// # Safety
    /// AVX-512 features; `rec` is record `i` of the run and the segment has sign tables.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
    unsafe fn add_sign_term(&self, rec: *const u8, i: usize, signed: __m128) -> __m128 {
        // SAFETY: caller contract; sign reads as in `sign_table_sum`.
        unsafe {
            let gamma = *self.scales.get_unchecked(i * self.scale_stride + 1);
            let bytes = self.sketch_dim.div_ceil(8);
            let sum = sign_table_sum(self.tables, rec.add(self.sign_offset), bytes);
            _mm_fmadd_ps(_mm_set1_ps(gamma), sum, signed)
        }
    }
}

/// Whether [`score_parts`] handles these runs: every part has codes of at most 4 bits.
pub(super) fn parts_supported(runs: &[CodedRun<'_>]) -> bool {
    runs.iter().all(|r| r.bits <= 4)
}

/// Scores the tokens of runs that share their records (the parts of one record layout, e.g.
/// the two tiers of a two-tier record) in one pass: per token, every part's centroid table is
/// scaled by that part's norm, so the codes of every part accumulate into one register per
/// head and one reduction per token gives the score. QJL signs add `γ·` their sign-table sums
/// (four heads per 16-byte load, no reduction), or without tables become `±γ` vectors in the
/// same accumulator.
///
/// # Safety
/// AVX-512 features; every run passed the dispatcher's checks, shares `words` and
/// `record_words` with the first, has codes of at most 4 bits, and `queries[k]` matches
/// `runs[k]`; `out` holds `(heads − 1)·stride + n` floats.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
pub(super) unsafe fn score_parts<'r>(
    runs: &'r [CodedRun<'r>],
    queries: &'r [&'r KeyQueries],
    out: &mut [f32],
    stride: usize,
) {
    let heads = queries[0].heads();
    for (t, (first, size)) in tiles(heads).enumerate() {
        // A record has one or two coded parts: the segments live on the stack (a decode step
        // must not allocate); more parts, which no codec makes today, fall back to a `Vec`.
        let segment = |run: &'r CodedRun<'r>, q: &'r KeyQueries| -> Segment<'r> {
            let (d, m) = (run.dim, run.sketch_dim);
            let b = run.bits as usize;
            let bytes = 4 * (run.record_words - run.code_offset);
            let full = d / 16;
            // SAFETY: a checked run holds `2^b` centroids.
            let (table, control) = unsafe { small_code_lut(run.centroids, b) };
            Segment {
                table,
                control,
                chunk_bytes: 2 * b,
                code_offset: 4 * run.code_offset,
                bytes,
                fast: if bytes < 8 {
                    0
                } else {
                    full.min((bytes - 8) / (2 * b) + 1)
                },
                full,
                tail: d % 16,
                dim: d,
                queries: q.queries[first * d..].as_ptr(),
                sketch: if m > 0 {
                    q.sketch[first * m..].as_ptr()
                } else {
                    q.sketch.as_ptr()
                },
                sign_offset: 4 * run.sign_offset,
                sketch_dim: m,
                tables: if m > 0 && q.has_sign_tables() {
                    let per_tile = sign_table_len(m);
                    &q.tables[t * per_tile..(t + 1) * per_tile]
                } else {
                    &[]
                },
                scales: run.scales,
                scale_stride: run.scale_stride,
            }
        };
        let o = &mut out[first * stride..];
        let (words, record_words) = (runs[0].words, runs[0].record_words);
        // SAFETY: forwarded contract; the segments' query rows hold `size` heads.
        let score = |segments: &[Segment<'_>], o: &mut [f32]| unsafe {
            match size {
                1 => score_parts_tile::<1>(words, record_words, segments, o, stride),
                2 => score_parts_tile::<2>(words, record_words, segments, o, stride),
                3 => score_parts_tile::<3>(words, record_words, segments, o, stride),
                _ => score_parts_tile::<4>(words, record_words, segments, o, stride),
            }
        };
        match (runs, queries) {
            ([r0], [q0]) => score(&[segment(r0, q0)], o),
            ([r0, r1], [q0, q1]) => score(&[segment(r0, q0), segment(r1, q1)], o),
            _ => {
                let segments: Vec<Segment<'_>> = runs
                    .iter()
                    .zip(queries)
                    .map(|(run, q)| segment(run, q))
                    .collect();
                score(&segments, o);
            }
        }
    }
}

/// The accumulators of token `i` of [`score_parts_tile`]: one register per head with the
/// codes of every segment, and the sign-table terms of the four heads.
///
/// # Safety
/// As [`score_parts_tile`], for a token `i` of the run.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
unsafe fn score_token<const H: usize>(
    segments: &[Segment<'_>],
    rec: *const u8,
    i: usize,
) -> ([__m512; 4], __m128) {
    // SAFETY: forwarded contract.
    unsafe {
        let mut acc = [_mm512_setzero_ps(); 4];
        let mut signed = _mm_setzero_ps();
        for seg in segments {
            let (d, m) = (seg.dim, seg.sketch_dim);
            let table = seg.scaled_table(i);
            let codes = rec.add(seg.code_offset);
            for j in 0..seg.fast {
                let bits = (codes.add(seg.chunk_bytes * j) as *const i64).read_unaligned();
                let c = seg.decode(bits, table);
                for (h, a) in acc.iter_mut().enumerate().take(H) {
                    let qv = _mm512_loadu_ps(seg.queries.add(h * d + 16 * j));
                    *a = _mm512_fmadd_ps(qv, c, *a);
                }
            }
            for j in seg.fast..seg.full + usize::from(seg.tail > 0) {
                let x = read_padded(codes, seg.bytes, seg.chunk_bytes * j, 8);
                let c = seg.decode(x as i64, table);
                let mask = if j < seg.full {
                    lanes(16)
                } else {
                    lanes(seg.tail)
                };
                for (h, a) in acc.iter_mut().enumerate().take(H) {
                    let qv = _mm512_maskz_loadu_ps(mask, seg.queries.add(h * d + 16 * j));
                    *a = _mm512_fmadd_ps(qv, c, *a);
                }
            }
            if m > 0 && !seg.tables.is_empty() {
                signed = seg.add_sign_term(rec, i, signed);
            } else if m > 0 {
                let gamma = *seg.scales.get_unchecked(i * seg.scale_stride + 1);
                let plus = _mm512_set1_ps(gamma);
                let minus = _mm512_set1_ps(-gamma);
                let signs = rec.add(seg.sign_offset);
                for g in 0..m.div_ceil(16) {
                    let bits = (signs.add(2 * g) as *const u16).read_unaligned();
                    let z = _mm512_mask_blend_ps(bits, minus, plus);
                    let mask = if 16 * (g + 1) <= m {
                        lanes(16)
                    } else {
                        lanes(m % 16)
                    };
                    for (h, a) in acc.iter_mut().enumerate().take(H) {
                        let wv = _mm512_maskz_loadu_ps(mask, seg.sketch.add(h * m + 16 * g));
                        *a = _mm512_fmadd_ps(wv, z, *a);
                    }
                }
            }
        }
        (acc, signed)
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
unsafe fn score_parts_tile<const H: usize>(
    words: &[u32],
    record_words: usize,
    segments: &[Segment<'_>],
    out: &mut [f32],
    stride: usize,
) {
    let record_bytes = 4 * record_words;
    let n = words.len() / record_words;
    // SAFETY: record `i < n` spans bytes `i·record_bytes..(i+1)·record_bytes` of `words`;
    // every segment's code reads stay inside it (fast chunks read 8 bytes ending at most at the
    // record's end, the others go through `read_padded` below `bytes`), its sign reads take
    // 2-byte groups `< ceil(m/16)` of its sign words; query and sketch loads read 16 floats of
    // rows `h < H` below `dim` (`m`), masked past it; score writes go to `out[h·stride + i]`
    // for `i < n`, inside `out` (dispatcher check: `(heads − 1)·stride + n ≤ out.len()`).
    unsafe {
        let base = words.as_ptr() as *const u8;
        let op = out.as_mut_ptr();
        // Sign terms through tables are a load per byte either way; multiply-add signs stay on
        // the general loop.
        let flat = |s: &Segment<'_>| {
            s.tail == 0 && s.bytes >= 8 && (s.sketch_dim == 0 || !s.tables.is_empty())
        };
        if FLAT_LOOP.enabled() && segments.iter().all(flat) {
            let args = (segments, base, record_bytes, n, op, stride);
            let done = if segments.iter().any(|s| s.sketch_dim > 0) {
                score_flat_layouts::<H, true>(args)
            } else {
                score_flat_layouts::<H, false>(args)
            };
            if done {
                return;
            }
        }
        let signed = segments
            .iter()
            .any(|s| s.sketch_dim > 0 && !s.tables.is_empty());
        if signed {
            score_parts_batched::<H, true>(segments, base, record_bytes, n, op, stride);
        } else {
            score_parts_batched::<H, false>(segments, base, record_bytes, n, op, stride);
        }
    }
}

/// Whether [`score_parts_tile`] may take [`score_flat`] (tests switch it off).
static FLAT_LOOP: super::FlatSwitch = super::FlatSwitch::new();

/// Runs [`score_flat`] if the segments have one of the presets' layouts at d = 64 and 128 (a
/// two-tier record of 25% and 75% of the channels, or one part); `false` if not.
///
/// # Safety
/// As [`score_flat`], but for the chunk counts, which this checks.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
unsafe fn score_flat_layouts<const H: usize, const SIGNED: bool>(args: FlatArgs<'_, '_>) -> bool {
    // SAFETY: forwarded contract; the match checks the chunk counts.
    unsafe {
        match args.0 {
            [a, b] if (a.full, b.full) == (1, 3) => score_flat::<H, 1, 3, SIGNED>(args),
            [a, b] if (a.full, b.full) == (2, 6) => score_flat::<H, 2, 6, SIGNED>(args),
            [a] if a.full == 4 => score_flat::<H, 4, 0, SIGNED>(args),
            [a] if a.full == 8 => score_flat::<H, 8, 0, SIGNED>(args),
            _ => return false,
        }
    }
    true
}

/// The arguments of [`score_flat`]: segments, records (base, bytes each, count), scores
/// (base, row stride).
type FlatArgs<'s, 'a> = (&'s [Segment<'a>], *const u8, usize, usize, *mut f32, usize);

/// [`score_parts_batched`] for records of one or two segments of `C0` and `C1` whole chunks
/// (`C1` = 0: one segment), all read directly, signs (`SIGNED`) only through sign tables: the
/// chunk loops unroll, the queries stay in registers and no segment field is reloaded per
/// token. The same multiply-adds in the same order as the general loop, so the same bits.
///
/// # Safety
/// As [`score_parts_tile`]; every segment has `full` chunks (`C0`, `C1`), no tail, at least 8
/// bytes from its codes to the record's end, and signs only with sign tables.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
unsafe fn score_flat<const H: usize, const C0: usize, const C1: usize, const SIGNED: bool>(
    (segments, base, record_bytes, n, out, stride): FlatArgs<'_, '_>,
) {
    let s0 = &segments[0];
    let s1 = &segments[segments.len() - 1];
    // SAFETY: caller contract: chunk `c` of segment `s` reads 8 bytes inside the record
    // (`Segment::chunk_bits`, whose contract `c < full`, `bytes ≥ 8` holds); query rows `h < H` hold `16·C` floats; sign
    // reads and table loads as in `score_token`.
    unsafe {
        let rows = |s: &Segment<'_>, c: usize| -> [__m512; 4] {
            std::array::from_fn(|h| {
                if h < H {
                    _mm512_loadu_ps(s.queries.add(h * s.dim + 16 * c))
                } else {
                    _mm512_setzero_ps()
                }
            })
        };
        let q0: [[__m512; 4]; C0] = std::array::from_fn(|c| rows(s0, c));
        let q1: [[__m512; 4]; C1] = std::array::from_fn(|c| rows(s1, c));
        // Segment `s`'s codes of record `i` against its query rows `q`, into `acc`.
        let add_codes =
            |acc: &mut [__m512; 4], s: &Segment<'_>, q: &[[__m512; 4]], rec: *const u8, i| {
                let table = s.scaled_table(i);
                let codes = rec.add(s.code_offset);
                for (c, q) in q.iter().enumerate() {
                    let v = s.decode(s.chunk_bits(codes, c), table);
                    for h in 0..H {
                        acc[h] = _mm512_fmadd_ps(q[h], v, acc[h]);
                    }
                }
            };
        let mut batch = TokenBatch::new();
        for first in (0..n).step_by(16) {
            for i in first..n.min(first + 16) {
                let rec = base.add(i * record_bytes);
                prefetch_record(rec, record_bytes, record_bytes);
                let mut acc = [_mm512_setzero_ps(); 4];
                add_codes(&mut acc, s0, &q0, rec, i);
                if C1 > 0 {
                    add_codes(&mut acc, s1, &q1, rec, i);
                }
                let mut signed = _mm_setzero_ps();
                if SIGNED {
                    for s in segments.iter().filter(|s| s.sketch_dim > 0) {
                        signed = s.add_sign_term(rec, i, signed);
                    }
                }
                batch.push::<H, SIGNED>(&acc, signed);
            }
            batch.flush::<H, SIGNED>(out, stride);
        }
    }
}

/// The token loop of [`score_parts_tile`]; `SIGNED`: some segment adds sign-table terms.
///
/// # Safety
/// As [`score_parts_tile`]: `base` holds `n` records of `record_bytes`, `out` the scores.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
unsafe fn score_parts_batched<const H: usize, const SIGNED: bool>(
    segments: &[Segment<'_>],
    base: *const u8,
    record_bytes: usize,
    n: usize,
    out: *mut f32,
    stride: usize,
) {
    // SAFETY: forwarded contract.
    unsafe {
        let mut batch = TokenBatch::new();
        // One call site each for the token and the flush, so both inline into the loop.
        for first in (0..n).step_by(16) {
            for i in first..n.min(first + 16) {
                let rec = base.add(i * record_bytes);
                prefetch_record(rec, record_bytes, record_bytes);
                let (acc, signed) = score_token::<H>(segments, rec, i);
                batch.push::<H, SIGNED>(&acc, signed);
            }
            batch.flush::<H, SIGNED>(out, stride);
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
pub(super) unsafe fn score_coded(
    run: &CodedRun<'_>,
    queries: &KeyQueries,
    out: &mut [f32],
    stride: usize,
) {
    if run.bits <= 4 {
        // SAFETY: forwarded contract; one part shares its own records.
        unsafe { score_parts(std::slice::from_ref(run), &[queries], out, stride) };
        return;
    }
    let (d, m) = (run.dim, run.sketch_dim);
    let per_tile = sign_table_len(m);
    for (t, (first, size)) in tiles(queries.heads()).enumerate() {
        let q = &queries.queries[first * d..(first + size) * d];
        let w = if m > 0 {
            &queries.sketch[first * m..(first + size) * m]
        } else {
            &[][..]
        };
        let tables = if m > 0 && queries.has_sign_tables() {
            &queries.tables[t * per_tile..(t + 1) * per_tile]
        } else {
            &[][..]
        };
        let o = &mut out[first * stride..];
        // SAFETY: forwarded contract; the tile's slices hold `size` rows.
        unsafe {
            by_bits_heads!(
                run.bits,
                size,
                score_coded_tile(run, q, w, tables, o, stride)
            )
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
unsafe fn score_coded_tile<const B: u32, const H: usize>(
    run: &CodedRun<'_>,
    q: &[f32],
    w: &[f32],
    tables: &[f32],
    out: &mut [f32],
    stride: usize,
) {
    let (d, m, rw) = (run.dim, run.sketch_dim, run.record_words);
    let bytes = 4 * (rw - run.code_offset);
    let full = d / 16;
    let tail = d % 16;
    let fast = fast_chunks(full, B, bytes);
    let scale_stride = run.scale_stride;
    let sign_full = m / 16;
    let sign_tail = m % 16;
    // SAFETY: score writes go to `out[h·stride + i]` with `h < H ≤ heads` and `i < n`, inside
    // `out` (checked by the dispatcher: `(heads − 1)·stride + n ≤ out.len()`); record `i` is
    // `words[i·rw..(i+1)·rw]` and its codes start at `code_offset`; code
    // reads stay inside the record (fast chunks by `fast_chunks`, the others byte by byte below
    // `bytes`; `2B·j ≤ 4·code words` for every chunk, the masked tail included); query loads
    // read 16 floats of row `h < H` below `d` (masked beyond it), sketch loads likewise below
    // `m`; sign reads take the 2-byte groups `< ceil(m/16)` of the sign words (masked ones for
    // the tail come from the same words); table loads as in `sign_table_sum`.
    unsafe {
        let lut = lut::<B>(run.centroids);
        let (qp, wp) = (q.as_ptr(), w.as_ptr());
        let op = out.as_mut_ptr();
        let tail_mask = lanes(tail);
        for (i, record) in run.words.chunks_exact(rw).enumerate() {
            let rec = record[run.code_offset..].as_ptr() as *const u8;
            // One accumulator per head: consecutive tokens are independent, so the out-of-order
            // core overlaps their multiply-add chains.
            let mut a = [_mm512_setzero_ps(); 4];
            for j in 0..fast {
                let c = chunk::<B>(&lut, rec, j);
                for (h, acc) in a.iter_mut().enumerate().take(H) {
                    let qv = _mm512_loadu_ps(qp.add(h * d + 16 * j));
                    *acc = _mm512_fmadd_ps(qv, c, *acc);
                }
            }
            for j in fast..full {
                let c = chunk_padded::<B>(&lut, rec, bytes, j);
                for (h, acc) in a.iter_mut().enumerate().take(H) {
                    let qv = _mm512_loadu_ps(qp.add(h * d + 16 * j));
                    *acc = _mm512_fmadd_ps(qv, c, *acc);
                }
            }
            if tail > 0 {
                let c = chunk_padded::<B>(&lut, rec, bytes, full);
                for (h, acc) in a.iter_mut().enumerate().take(H) {
                    let qv = _mm512_maskz_loadu_ps(tail_mask, qp.add(h * d + 16 * full));
                    *acc = _mm512_fmadd_ps(qv, c, *acc);
                }
            }
            let norm = run.scales[i * scale_stride];
            let mut scores = _mm_mul_ps(_mm_set1_ps(norm), hsum4(&merge(&a, H)));
            if m > 0 {
                let signs = record.as_ptr().add(run.sign_offset) as *const u8;
                let sum = if tables.is_empty() {
                    let mut s = [_mm512_setzero_ps(); 4];
                    for j in 0..sign_full + usize::from(sign_tail > 0) {
                        let bits = (signs.add(2 * j) as *const u16).read_unaligned();
                        let z =
                            _mm512_mask_blend_ps(bits, _mm512_set1_ps(-1.0), _mm512_set1_ps(1.0));
                        let mask = if j < sign_full {
                            lanes(16)
                        } else {
                            lanes(sign_tail)
                        };
                        for (h, acc) in s.iter_mut().enumerate().take(H) {
                            let wv = _mm512_maskz_loadu_ps(mask, wp.add(h * m + 16 * j));
                            *acc = _mm512_fmadd_ps(wv, z, *acc);
                        }
                    }
                    hsum4(&merge(&s, H))
                } else {
                    sign_table_sum(tables, signs, m.div_ceil(8))
                };
                let gamma = run.scales[i * scale_stride + 1];
                scores = _mm_fmadd_ps(_mm_set1_ps(gamma), sum, scores);
            }
            let mut t = [0.0f32; 4];
            _mm_storeu_ps(t.as_mut_ptr(), scores);
            for (h, &score) in t.iter().enumerate().take(H) {
                *op.add(h * stride + i) += score;
            }
        }
    }
}

/// Plain records score in the order every instruction set shares
/// ([`lane8_dot`](super::super::primitives::lane8_dot): eight lanes, AVX2's horizontal adds),
/// so f16 and f32 caches give the same bits here as on AVX2, NEON and scalar. Sixteen lanes
/// keep their width by carrying two tokens per register, each in its own eight lanes, reduced
/// sixteen tokens at a time by [`reduce_token_pairs`].
///
/// # Safety
/// AVX-512 features; `run.dim` is a multiple of 8 (the dispatcher sends other dimensions to
/// the AVX2 kernel, whose trailing values add one at a time); `queries` holds the tile's rows
/// and `out[h·stride + i]` is writable for every head row `h` and record `i`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
pub(super) unsafe fn score_plain(
    run: &PlainRun<'_>,
    queries: &[f32],
    out: &mut [f32],
    stride: usize,
) {
    let d = run.dim;
    debug_assert!(
        d.is_multiple_of(8),
        "score_plain: dimension {d} not a multiple of 8"
    );
    for (first, size) in tiles(queries.len() / d) {
        let q = &queries[first * d..(first + size) * d];
        let o = &mut out[first * stride..];
        // SAFETY: forwarded contract; the tile's slices hold `size` rows.
        unsafe {
            match run.kind {
                PlainKind::F16 => by_heads!(size, score_plain_tile::<true>(run, q, o, stride)),
                PlainKind::F32 => by_heads!(size, score_plain_tile::<false>(run, q, o, stride)),
            }
        }
    }
}

/// Chunk `j` (eight values) of plain records `a` (lanes 0–7) and `b` (lanes 8–15).
///
/// # Safety
/// AVX-512 features; both records hold at least `8j + 8` values.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
unsafe fn plain_chunk_pair<const F16: bool>(a: *const u8, b: *const u8, j: usize) -> __m512 {
    // SAFETY: caller contract.
    unsafe {
        if F16 {
            let lo = _mm_loadu_si128(a.add(16 * j) as *const __m128i);
            let hi = _mm_loadu_si128(b.add(16 * j) as *const __m128i);
            _mm512_cvtph_ps(_mm256_set_m128i(hi, lo))
        } else {
            let lo = _mm256_loadu_pd(a.add(32 * j) as *const f64);
            let hi = _mm256_loadu_pd(b.add(32 * j) as *const f64);
            _mm512_castpd_ps(_mm512_insertf64x4::<1>(_mm512_castpd256_pd512(lo), hi))
        }
    }
}

/// First token (within a block of sixteen) of the pair register `p`; its partner is four
/// tokens later. This pairing is what puts [`reduce_token_pairs`]' sums in token order.
const fn pair_first(p: usize) -> usize {
    if p < 4 { p } else { p + 4 }
}

/// `[a0+a1, a2+a3, b0+b1, b2+b3]` in each 128-bit quarter (AVX2's `hadd` on sixteen lanes).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
fn hadd16(a: __m512, b: __m512) -> __m512 {
    _mm512_add_ps(
        _mm512_shuffle_ps::<0b10_00_10_00>(a, b),
        _mm512_shuffle_ps::<0b11_01_11_01>(a, b),
    )
}

/// The sixteen token sums of eight pair registers, lane `s` for token `s` of the block:
/// register `p` holds tokens `pair_first(p)` (lanes 0–7) and `pair_first(p) + 4` (lanes 8–15),
/// each reduced exactly as AVX2's `hsum4` reduces a head: adjacent pairs, then pairs of pairs
/// within each half, then the two halves.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
fn reduce_token_pairs(v: &[__m512; 8]) -> __m512 {
    let h = [
        hadd16(v[0], v[1]),
        hadd16(v[2], v[3]),
        hadd16(v[4], v[5]),
        hadd16(v[6], v[7]),
    ];
    // Quarter `k` of `g0` holds the four-lane sums of quarter `k` of registers 0–3.
    let g0 = hadd16(h[0], h[1]);
    let g1 = hadd16(h[2], h[3]);
    // Low half (quarters 0, 1) plus high half (2, 3) of each token.
    _mm512_add_ps(
        _mm512_shuffle_f32x4::<0b10_00_10_00>(g0, g1),
        _mm512_shuffle_f32x4::<0b11_01_11_01>(g0, g1),
    )
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
unsafe fn score_plain_tile<const F16: bool, const H: usize>(
    run: &PlainRun<'_>,
    q: &[f32],
    out: &mut [f32],
    stride: usize,
) {
    let d = run.dim;
    let chunks = d / 8;
    let record_bytes = 4 * run.record_words;
    let n = run.len();
    // SAFETY: records `i < n` start `i·record_bytes` bytes from the run's first vector and hold
    // `d = 8·chunks` values (a missing partner reads its first token again, and its lanes are
    // never stored); query loads read 8 floats of row `h < H` below `d`; score writes go to
    // `out[h·stride + first + s]` for `s < count`, masked, inside `out` (checked by the
    // dispatcher).
    unsafe {
        let base = run.words.as_ptr().add(run.offset) as *const u8;
        let qp = q.as_ptr();
        let op = out.as_mut_ptr();
        for first in (0..n).step_by(16) {
            let count = (n - first).min(16);
            let mut batch = [[_mm512_setzero_ps(); 8]; 4];
            for p in 0..8 {
                let a = first + pair_first(p);
                if a >= n {
                    break;
                }
                let b = if a + 4 < n { a + 4 } else { a };
                let (ra, rb) = (base.add(a * record_bytes), base.add(b * record_bytes));
                prefetch_record(ra, record_bytes, record_bytes);
                prefetch_record(rb, record_bytes, record_bytes);
                let mut acc = [_mm512_setzero_ps(); 4];
                for j in 0..chunks {
                    let x = plain_chunk_pair::<F16>(ra, rb, j);
                    for (h, acc) in acc.iter_mut().enumerate().take(H) {
                        let row = _mm256_loadu_si256(qp.add(h * d + 8 * j) as *const __m256i);
                        let qv = _mm512_castsi512_ps(_mm512_broadcast_i64x4(row));
                        *acc = _mm512_fmadd_ps(qv, x, *acc);
                    }
                }
                for (row, acc) in batch.iter_mut().zip(acc).take(H) {
                    row[p] = acc;
                }
            }
            let mask = lanes(count);
            for (h, row) in batch.iter().enumerate().take(H) {
                let o = op.add(h * stride + first);
                let old = _mm512_maskz_loadu_ps(mask, o);
                _mm512_mask_storeu_ps(o, mask, _mm512_add_ps(old, reduce_token_pairs(row)));
            }
        }
    }
}

/// Sixteen values of chunk `j` of a plain record, lanes outside `mask` zero.
///
/// # Safety
/// AVX-512 features; `record` holds the values of chunk `j` selected by `mask`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
unsafe fn plain_chunk<const F16: bool>(record: *const u8, j: usize, mask: __mmask16) -> __m512 {
    // SAFETY: caller contract; masked-off lanes are not read.
    unsafe {
        if F16 {
            let p = record.add(32 * j);
            if mask == lanes(16) {
                _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
            } else {
                _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, p as *const i16))
            }
        } else {
            let p = record.add(64 * j) as *const f32;
            if mask == lanes(16) {
                _mm512_loadu_ps(p)
            } else {
                _mm512_maskz_loadu_ps(mask, p)
            }
        }
    }
}

/// Where a value pass reads and writes (see the AVX2 `Pass`).
struct Pass {
    base: *const u8,
    stride: usize,
    bytes: usize,
    weights: *const f32,
    heads: usize,
    acc: *mut f32,
    d: usize,
}

/// Accumulates the `C` chunks from `j` (`C ≤ 4`; with `TAIL` a single masked chunk of `count`
/// lanes) of tokens `start..end` into the tile's accumulators.
///
/// # Safety
/// AVX-512 features; `p` describes `end` records, `H` heads and accumulator rows holding those
/// chunks (the masked lanes of a tail); without `PADDED` the chunks are fast.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
unsafe fn coded_pass<const B: u32, const H: usize, const C: usize, const PADDED: bool>(
    lut: &Lut,
    p: &Pass,
    j: usize,
    mask: __mmask16,
    start: usize,
    end: usize,
) {
    // SAFETY: caller contract.
    unsafe {
        let mut r = [[_mm512_setzero_ps(); 4]; 4];
        for (s, set) in r.iter_mut().enumerate().take(C) {
            for (h, v) in set.iter_mut().enumerate().take(H) {
                *v = _mm512_maskz_loadu_ps(mask, p.acc.add(h * p.d + 16 * (j + s)));
            }
        }
        for i in start..end {
            let rec = p.base.add(i * p.stride);
            if j == 0 {
                prefetch_record(rec, p.stride, p.stride);
            }
            let mut c = [_mm512_setzero_ps(); 4];
            for (s, v) in c.iter_mut().enumerate().take(C) {
                *v = if PADDED {
                    chunk_padded::<B>(lut, rec, p.bytes, j + s)
                } else {
                    chunk::<B>(lut, rec, j + s)
                };
            }
            let wi = p.weights.add(i * p.heads);
            for h in 0..H {
                let wv = _mm512_set1_ps(*wi.add(h));
                for (set, &cv) in r.iter_mut().zip(&c).take(C) {
                    set[h] = _mm512_fmadd_ps(wv, cv, set[h]);
                }
            }
        }
        for (s, set) in r.iter().enumerate().take(C) {
            for (h, v) in set.iter().enumerate().take(H) {
                _mm512_mask_storeu_ps(p.acc.add(h * p.d + 16 * (j + s)), mask, *v);
            }
        }
    }
}

/// The plain-record counterpart of [`coded_pass`].
///
/// # Safety
/// As [`coded_pass`], for plain records holding `d` values.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
unsafe fn plain_pass<const F16: bool, const H: usize, const C: usize>(
    p: &Pass,
    j: usize,
    mask: __mmask16,
    start: usize,
    end: usize,
) {
    // SAFETY: caller contract.
    unsafe {
        let mut r = [[_mm512_setzero_ps(); 4]; 4];
        for (s, set) in r.iter_mut().enumerate().take(C) {
            for (h, v) in set.iter_mut().enumerate().take(H) {
                *v = _mm512_maskz_loadu_ps(mask, p.acc.add(h * p.d + 16 * (j + s)));
            }
        }
        for i in start..end {
            let rec = p.base.add(i * p.stride);
            if j == 0 {
                prefetch_record(rec, p.stride, p.stride);
            }
            let mut x = [_mm512_setzero_ps(); 4];
            for (s, v) in x.iter_mut().enumerate().take(C) {
                *v = plain_chunk::<F16>(rec, j + s, mask);
            }
            let wi = p.weights.add(i * p.heads);
            for h in 0..H {
                let wv = _mm512_set1_ps(*wi.add(h));
                for (set, &xv) in r.iter_mut().zip(&x).take(C) {
                    set[h] = _mm512_fmadd_ps(wv, xv, set[h]);
                }
            }
        }
        for (s, set) in r.iter().enumerate().take(C) {
            for (h, v) in set.iter().enumerate().take(H) {
                _mm512_mask_storeu_ps(p.acc.add(h * p.d + 16 * (j + s)), mask, *v);
            }
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
pub(super) unsafe fn accumulate_coded(
    run: &CodedRun<'_>,
    code_weights: &[f32],
    sign_weights: &[f32],
    acc: &mut [f32],
    sign_acc: &mut [f32],
) {
    let heads = acc.len() / run.dim;
    for (first, size) in tiles(heads) {
        // SAFETY: forwarded contract; the tile covers rows `first..first + size < heads`.
        unsafe {
            by_bits_heads!(
                run.bits,
                size,
                accumulate_coded_tile(run, code_weights, sign_weights, heads, first, acc, sign_acc)
            )
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
unsafe fn accumulate_coded_tile<const B: u32, const H: usize>(
    run: &CodedRun<'_>,
    code_weights: &[f32],
    sign_weights: &[f32],
    heads: usize,
    first: usize,
    acc: &mut [f32],
    sign_acc: &mut [f32],
) {
    let (d, m, rw) = (run.dim, run.sketch_dim, run.record_words);
    let stride = 4 * rw;
    let bytes = 4 * (rw - run.code_offset);
    let n = run.len();
    let full = d / 16;
    let tail = d % 16;
    let fast = fast_chunks(full, B, bytes);
    let sub = (L1_BYTES / stride).max(1);
    let all = lanes(16);
    // SAFETY: record `i < n` starts at byte `i·stride` of the run and its codes `4·code_offset`
    // bytes later; code reads stay inside the record (fast chunks by `fast_chunks`, the others
    // byte by byte below `bytes`); sign reads take 2-byte groups `< ceil(m/16)` of record `i`'s
    // sign words; weights are read at `i·heads + first + h < n·heads`; accumulator rows
    // `first + h < heads` hold `d` (or `m`) floats and every access is masked to them.
    unsafe {
        let lut = lut::<B>(run.centroids);
        let words = run.words.as_ptr();
        let pass = Pass {
            base: words.add(run.code_offset) as *const u8,
            stride,
            bytes,
            weights: code_weights.as_ptr().add(first),
            heads,
            acc: acc.as_mut_ptr().add(first * d),
            d,
        };
        let sw = sign_weights.as_ptr();
        let ps = sign_acc.as_mut_ptr().add(first * m);
        let mut start = 0;
        while start < n {
            let end = n.min(start + sub);
            let mut j = 0;
            while j + 4 <= fast {
                coded_pass::<B, H, 4, false>(&lut, &pass, j, all, start, end);
                j += 4;
            }
            match fast - j {
                3 => coded_pass::<B, H, 3, false>(&lut, &pass, j, all, start, end),
                2 => coded_pass::<B, H, 2, false>(&lut, &pass, j, all, start, end),
                1 => coded_pass::<B, H, 1, false>(&lut, &pass, j, all, start, end),
                _ => {}
            }
            for j in fast..full {
                coded_pass::<B, H, 1, true>(&lut, &pass, j, all, start, end);
            }
            if tail > 0 {
                coded_pass::<B, H, 1, true>(&lut, &pass, full, lanes(tail), start, end);
            }
            for j in 0..m.div_ceil(16) {
                let mask = if 16 * (j + 1) <= m {
                    all
                } else {
                    lanes(m % 16)
                };
                let mut r = [_mm512_setzero_ps(); 4];
                for (h, v) in r.iter_mut().enumerate().take(H) {
                    *v = _mm512_maskz_loadu_ps(mask, ps.add(h * m + 16 * j));
                }
                for i in start..end {
                    let signs = words.add(i * rw + run.sign_offset) as *const u8;
                    let bits = (signs.add(2 * j) as *const u16).read_unaligned();
                    let z = _mm512_mask_blend_ps(bits, _mm512_set1_ps(-1.0), _mm512_set1_ps(1.0));
                    let wi = sw.add(i * heads + first);
                    for (h, v) in r.iter_mut().enumerate().take(H) {
                        *v = _mm512_fmadd_ps(_mm512_set1_ps(*wi.add(h)), z, *v);
                    }
                }
                for (h, v) in r.iter().enumerate().take(H) {
                    _mm512_mask_storeu_ps(ps.add(h * m + 16 * j), mask, *v);
                }
            }
            start = end;
        }
    }
}

/// Whether [`accumulate_parts`] takes these runs: codes of at most 4 bits, no QJL signs,
/// whole chunks of sixteen coordinates, at least 8 bytes from each part's codes to the record's
/// end.
pub(super) fn value_parts_supported(runs: &[CodedRun<'_>]) -> bool {
    runs.iter().all(|r| {
        r.bits <= 4
            && r.sketch_dim == 0
            && r.dim.is_multiple_of(16)
            && 4 * (r.record_words - r.code_offset) >= 8
    })
}

/// One part of a record for [`accumulate_parts`]: how its codes decode ([`Segment`]'s way),
/// its norms and its accumulator rows.
struct ValuePart {
    table: __m512,
    control: __m512i,
    chunk_bytes: usize,
    code_offset: usize,
    bytes: usize,
    fast: usize,
    chunks: usize,
    /// Norm of record `i` at `scales[i·scale_stride]`.
    scales: *const f32,
    scale_stride: usize,
    /// The tile's first accumulator row (`[H, dim]`).
    acc: *mut f32,
    dim: usize,
}

/// Where an [`accumulate_parts`] pass reads: records (base, bytes each) and the tile's first
/// weight row (head `h`'s weight of token `i` at `weights[h·weight_stride + i]`).
#[derive(Clone, Copy)]
struct PartsPass {
    base: *const u8,
    record_bytes: usize,
    weights: *const f32,
    weight_stride: usize,
}

/// Accumulates the records of runs that share their records (one part, or the two tiers of a
/// two-tier record), weighted by head-major weights times each part's norm: part `k`'s
/// accumulator row `h` gains `Σ_i (weights[h·stride + i]·norm_k,i)·c_k,i`, token by token, the
/// same fused multiply-adds as [`accumulate_coded`] over the token-major `p·norm` weights
/// [`scale_rows`](super::super::fused) writes — so the same bits — without writing those
/// weights or transposing the probabilities, and with the chunks of both tiers in one pass
/// over the tokens (a 16-coordinate tier alone gave a pass only `H` multiply-add chains).
///
/// # Safety
/// AVX-512 features; every run passed the dispatcher's checks and [`value_parts_supported`],
/// shares `words` and `record_words` with the first; `weights` holds `(heads − 1)·stride + n`
/// floats and `accs[k]` holds `heads·runs[k].dim`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
pub(super) unsafe fn accumulate_parts(
    runs: &[CodedRun<'_>],
    weights: &[f32],
    weight_stride: usize,
    heads: usize,
    accs: &mut [&mut [f32]],
) {
    let (words, record_words) = (runs[0].words, runs[0].record_words);
    let record_bytes = 4 * record_words;
    let n = words.len() / record_words;
    let sub = (L1_BYTES / record_bytes).max(1);
    for (first, size) in tiles(heads) {
        // SAFETY: a checked run holds `2^b` centroids; the accumulators hold `heads` rows.
        let part = |run: &CodedRun<'_>, acc: &mut [f32]| unsafe {
            let b = run.bits as usize;
            let bytes = 4 * (record_words - run.code_offset);
            let (table, control) = small_code_lut(run.centroids, b);
            ValuePart {
                table,
                control,
                chunk_bytes: 2 * b,
                code_offset: 4 * run.code_offset,
                bytes,
                fast: fast_chunks(run.dim / 16, b as u32, bytes),
                chunks: run.dim / 16,
                scales: run.scales.as_ptr(),
                scale_stride: run.scale_stride,
                acc: acc.as_mut_ptr().add(first * run.dim),
                dim: run.dim,
            }
        };
        let (p0, p1) = match (runs, &mut *accs) {
            ([r0], [a0]) => (part(r0, a0), None),
            ([r0, r1], [a0, a1]) => (part(r0, a0), Some(part(r1, a1))),
            _ => unreachable!("accumulate_parts: one or two runs, one accumulator each"),
        };
        let pass = PartsPass {
            base: words.as_ptr() as *const u8,
            record_bytes,
            // SAFETY: row `first < heads` of the weights.
            weights: unsafe { weights.as_ptr().add(first * weight_stride) },
            weight_stride,
        };
        // The chunks of part 0, then of part 1, four per pass over the tokens.
        let (c0, c1) = (p0.chunks, p1.as_ref().map_or(0, |p| p.chunks));
        let mut start = 0;
        while start < n {
            let end = n.min(start + sub);
            let mut slot = 0;
            while slot < c0 + c1 {
                let count = (c0 + c1 - slot).min(4);
                let (j0, a) = (slot.min(c0), (c0.saturating_sub(slot)).min(count));
                let (j1, b) = (slot.saturating_sub(c0), count - a);
                let second = p1.as_ref().unwrap_or(&p0);
                let prefetch = slot == 0;
                // SAFETY: forwarded contract; chunks `j0..j0 + a` of part 0 and `j1..j1 + b` of
                // part 1 exist, tokens `start..end < n`.
                unsafe {
                    parts_pass_dispatch(
                        size,
                        (a, b),
                        (&p0, second),
                        (j0, j1),
                        &pass,
                        start..end,
                        prefetch,
                    );
                }
                slot += count;
            }
            start = end;
        }
    }
}

/// [`parts_pass`] with its constants: `H` heads, `(A, B)` chunks of the two parts.
///
/// # Safety
/// As [`parts_pass`].
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
unsafe fn parts_pass_dispatch(
    heads: usize,
    chunks: (usize, usize),
    parts: (&ValuePart, &ValuePart),
    first: (usize, usize),
    pass: &PartsPass,
    tokens: std::ops::Range<usize>,
    prefetch: bool,
) {
    macro_rules! by_heads_chunks {
        ($(($a:literal, $b:literal)),*) => {
            match chunks {
                $(($a, $b) => match heads {
                    1 => parts_pass::<1, $a, $b>(parts, first, pass, tokens, prefetch),
                    2 => parts_pass::<2, $a, $b>(parts, first, pass, tokens, prefetch),
                    3 => parts_pass::<3, $a, $b>(parts, first, pass, tokens, prefetch),
                    _ => parts_pass::<4, $a, $b>(parts, first, pass, tokens, prefetch),
                },)*
                _ => unreachable!("parts_pass: at most four chunks per pass"),
            }
        };
    }
    // SAFETY: forwarded contract.
    unsafe {
        by_heads_chunks!(
            (1, 0),
            (2, 0),
            (3, 0),
            (4, 0),
            (0, 1),
            (0, 2),
            (0, 3),
            (0, 4),
            (1, 1),
            (1, 2),
            (1, 3),
            (2, 1),
            (2, 2),
            (3, 1)
        )
    }
}

/// One pass of [`accumulate_parts`] over `tokens`: chunks `j0..j0 + A` of part 0 and
/// `j1..j1 + B` of part 1, `H` heads, accumulators in registers across the tokens.
///
/// # Safety
/// AVX-512 features; the parts describe `tokens.end` records of `pass`, chunks `j0 + A ≤
/// chunks` (`j1 + B`) of each part, and accumulator rows `h < H`; weight rows `h < H` hold
/// `tokens.end` floats.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
unsafe fn parts_pass<const H: usize, const A: usize, const B: usize>(
    (p0, p1): (&ValuePart, &ValuePart),
    (j0, j1): (usize, usize),
    pass: &PartsPass,
    tokens: std::ops::Range<usize>,
    prefetch: bool,
) {
    // SAFETY: caller contract: chunk reads as in `chunk_bits` (whole chunks, `bytes ≥ 8`);
    // accumulator loads and stores of rows `h < H`, chunks below `dim/16`; weight and norm reads
    // of tokens below `tokens.end`.
    unsafe {
        let load = |p: &ValuePart, j: usize| -> [__m512; 4] {
            std::array::from_fn(|h| {
                if h < H {
                    _mm512_loadu_ps(p.acc.add(h * p.dim + 16 * j))
                } else {
                    _mm512_setzero_ps()
                }
            })
        };
        let mut r0: [[__m512; 4]; A] = std::array::from_fn(|s| load(p0, j0 + s));
        let mut r1: [[__m512; 4]; B] = std::array::from_fn(|s| load(p1, j1 + s));
        for i in tokens {
            let rec = pass.base.add(i * pass.record_bytes);
            if prefetch {
                prefetch_record(rec, pass.record_bytes, pass.record_bytes);
            }
            let w: [f32; 4] = std::array::from_fn(|h| {
                if h < H {
                    *pass.weights.add(h * pass.weight_stride + i)
                } else {
                    0.0
                }
            });
            // Part `p`'s chunks from `j` of token `i` into its accumulators `r`.
            let add = |p: &ValuePart, j: usize, r: &mut [[__m512; 4]]| {
                let norm = *p.scales.add(i * p.scale_stride);
                let codes = rec.add(p.code_offset);
                for (s, r) in r.iter_mut().enumerate() {
                    let bits = chunk_bits(codes, j + s, p.chunk_bytes, p.fast, p.bytes);
                    let c = decode_small(p.control, bits, p.table);
                    for h in 0..H {
                        r[h] = _mm512_fmadd_ps(_mm512_set1_ps(w[h] * norm), c, r[h]);
                    }
                }
            };
            if A > 0 {
                add(p0, j0, &mut r0);
            }
            if B > 0 {
                add(p1, j1, &mut r1);
            }
        }
        let store = |p: &ValuePart, j: usize, r: &[__m512; 4]| {
            for (h, v) in r.iter().enumerate().take(H) {
                _mm512_storeu_ps(p.acc.add(h * p.dim + 16 * j), *v);
            }
        };
        for (s, r) in r0.iter().enumerate() {
            store(p0, j0 + s, r);
        }
        for (s, r) in r1.iter().enumerate() {
            store(p1, j1 + s, r);
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
pub(super) unsafe fn accumulate_plain(run: &PlainRun<'_>, weights: &[f32], acc: &mut [f32]) {
    let heads = acc.len() / run.dim;
    for (first, size) in tiles(heads) {
        // SAFETY: forwarded contract; the tile covers rows `first..first + size < heads`.
        unsafe {
            match run.kind {
                PlainKind::F16 => by_heads!(
                    size,
                    accumulate_plain_tile::<true>(run, weights, heads, first, acc)
                ),
                PlainKind::F32 => by_heads!(
                    size,
                    accumulate_plain_tile::<false>(run, weights, heads, first, acc)
                ),
            }
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
unsafe fn accumulate_plain_tile<const F16: bool, const H: usize>(
    run: &PlainRun<'_>,
    weights: &[f32],
    heads: usize,
    first: usize,
    acc: &mut [f32],
) {
    let d = run.dim;
    let rw = run.record_words;
    let stride = 4 * rw;
    let n = run.len();
    let full = d / 16;
    let tail = d % 16;
    let sub = (L1_BYTES / stride).max(1);
    let all = lanes(16);
    // SAFETY: record `i < n` starts at byte `i·stride`, its vector `4·offset` bytes later and
    // holds `d` values; chunks stay below `16·full ≤ d` and the tail is masked to `d`; weights
    // are read at `i·heads + first + h < n·heads`; accumulator rows `first + h < heads` hold
    // `d` floats.
    unsafe {
        let pass = Pass {
            base: run.words.as_ptr().add(run.offset) as *const u8,
            stride,
            bytes: 4 * (rw - run.offset),
            weights: weights.as_ptr().add(first),
            heads,
            acc: acc.as_mut_ptr().add(first * d),
            d,
        };
        let mut start = 0;
        while start < n {
            let end = n.min(start + sub);
            let mut j = 0;
            while j + 4 <= full {
                plain_pass::<F16, H, 4>(&pass, j, all, start, end);
                j += 4;
            }
            match full - j {
                3 => plain_pass::<F16, H, 3>(&pass, j, all, start, end),
                2 => plain_pass::<F16, H, 2>(&pass, j, all, start, end),
                1 => plain_pass::<F16, H, 1>(&pass, j, all, start, end),
                _ => {}
            }
            if tail > 0 {
                plain_pass::<F16, H, 1>(&pass, full, lanes(tail), start, end);
            }
            start = end;
        }
    }
}

/// `exp` of sixteen lanes: bit-identical to [`exp_poly`] on each lane (same operations as the
/// AVX2 `exp8`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
unsafe fn exp16(x: __m512) -> __m512 {
    let low = _mm512_set1_ps(EXP_LOW);
    let valid = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(x, low);
    let x = _mm512_min_ps(_mm512_max_ps(x, low), _mm512_set1_ps(EXP_HIGH));
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
        _mm512_mul_ps(x, _mm512_set1_ps(EXP_LOG2E)),
    );
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(EXP_LN2_HI), x);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(EXP_LN2_LO), r);
    let mut p = _mm512_set1_ps(EXP_POLY[0]);
    for &c in &EXP_POLY[1..] {
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
    }
    let y = _mm512_fmadd_ps(
        p,
        _mm512_mul_ps(r, r),
        _mm512_add_ps(r, _mm512_set1_ps(1.0)),
    );
    let e = _mm512_slli_epi32::<23>(_mm512_add_epi32(
        _mm512_cvtps_epi32(n),
        _mm512_set1_epi32(127),
    ));
    _mm512_maskz_mov_ps(valid, _mm512_mul_ps(y, _mm512_castsi512_ps(e)))
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
pub(super) unsafe fn exp_shifted_sum(values: &mut [f32], shift: f32) -> f32 {
    let n = values.len();
    let full = n / 16 * 16;
    let mut lanes = [0.0f32; 8];
    // SAFETY: every access covers 16 floats below `full ≤ n`; `lanes` holds 8 floats.
    unsafe {
        let p = values.as_mut_ptr();
        let s = _mm512_set1_ps(shift);
        // Eight lanes, the low half of each 16 added before the high half: value `i` goes to
        // lane `i mod 8` in order, as on every other path, so the sum is the same bits.
        let mut acc = _mm256_setzero_ps();
        let mut k = 0;
        while k < full {
            let e = exp16(_mm512_sub_ps(_mm512_loadu_ps(p.add(k)), s));
            _mm512_storeu_ps(p.add(k), e);
            acc = _mm256_add_ps(acc, _mm512_castps512_ps256(e));
            acc = _mm256_add_ps(
                acc,
                _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(e))),
            );
            k += 16;
        }
        _mm256_storeu_ps(lanes.as_mut_ptr(), acc);
    }
    for (i, v) in values.iter_mut().enumerate().skip(full) {
        *v = exp_poly(*v - shift);
        lanes[i % 8] += *v;
    }
    ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5]))
        + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]))
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
pub(super) unsafe fn max(values: &[f32]) -> f32 {
    let n = values.len();
    let full = n / 16 * 16;
    // SAFETY: every load reads 16 floats below `full ≤ n`.
    let mut m = unsafe {
        let p = values.as_ptr();
        let mut acc = _mm512_set1_ps(f32::NEG_INFINITY);
        let mut k = 0;
        while k < full {
            acc = _mm512_max_ps(acc, _mm512_loadu_ps(p.add(k)));
            k += 16;
        }
        let mut lanes = [0.0f32; 16];
        _mm512_storeu_ps(lanes.as_mut_ptr(), acc);
        lanes.iter().copied().fold(f32::NEG_INFINITY, f32::max)
    };
    for &v in &values[full..] {
        m = m.max(v);
    }
    m
}

#[cfg(test)]
mod tests {

    use rand::SeedableRng;
    use rand_chacha::ChaCha20Rng;
    use rand_distr::{Distribution, StandardNormal};

    use super::FLAT_LOOP;
    use crate::CodecSpec;
    use crate::allocation::Allocation;
    use crate::attention::AttentionShape;
    use crate::attention::simd::{Isa, fused_attention_on};
    use crate::codec::MseSpec;
    use crate::kv_cache::{KvCache, KvKind, KvLayout};
    use crate::token_store::Growth;

    fn layout(head_dim: usize) -> KvLayout {
        KvLayout {
            kv_heads: 2,
            head_dim,
            kind: KvKind::Growing {
                growth: Growth::Doubling { initial: 64 },
            },
            max_rewind: 0,
            rope_pairs: crate::basis::RopePairs::Adjacent,
            rope_base: Default::default(),
        }
    }

    fn normal(n: usize, seed: u64) -> Vec<f32> {
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        (0..n).map(|_| StandardNormal.sample(&mut rng)).collect()
    }

    /// The flat loop gives the general loop's bits on every layout it takes, the 3- and 2-bit
    /// keys whose last chunk loads the record's last 8 bytes and shifts included (a shift off
    /// by a byte reads other codes and moves scores by far more than a bit).
    #[test]
    fn flat_loop_gives_the_general_loops_bits() {
        if !Isa::available().contains(&Isa::Avx512) {
            return;
        }
        let mut caches = Vec::new();
        for d in [64usize, 128] {
            for bits in [2u8, 3, 4] {
                let spec = CodecSpec::Mse(MseSpec::new(d, bits, 5));
                caches.push(KvCache::uniform(layout(d), spec, spec).unwrap());
            }
            for preset in ["tq3.5", "tq2.5", "mse-k4v4"] {
                let allocation = Allocation::preset(preset).unwrap();
                caches.push(KvCache::with_allocation(layout(d), &allocation, 0, 1).unwrap());
            }
        }
        for (c, cache) in caches.iter_mut().enumerate() {
            let d = cache.layout().head_dim;
            let n = 77;
            let positions: Vec<u32> = (0..n as u32).collect();
            let keys = normal(n * 2 * d, c as u64);
            let values = normal(n * 2 * d, c as u64 + 100);
            cache.append(&keys, &values, &positions).unwrap();
            let shape = AttentionShape {
                q_heads: 8,
                scale: 1.0 / (d as f32).sqrt(),
            };
            let queries = normal(2 * 8 * d, c as u64 + 200);
            let run = |flat: bool| {
                FLAT_LOOP.set(flat);
                let mut out = vec![0.0f32; queries.len()];
                let result = fused_attention_on(
                    Isa::Avx512,
                    cache,
                    &queries,
                    &positions[75..],
                    shape,
                    &mut out,
                );
                FLAT_LOOP.set(true);
                result.unwrap();
                out
            };
            let (flat, general) = (run(true), run(false));
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&flat), bits(&general), "cache {c} (d = {d})");
        }
    }
}
