//! AVX2 + FMA + F16C kernels.
//!
//! Every function here is `unsafe` only because it requires those CPU features: the dispatcher
//! in `mod.rs` calls them after runtime detection, with lengths already checked. Memory is read
//! through raw pointers only inside the checked bounds stated at each `unsafe` block.
//!
//! Packed codes: eight b-bit codes take exactly `b` bytes, so chunk `j` (codes `8j..8j+8`)
//! starts at byte `b·j` of the record. For b ≤ 4 the chunk is read as one little-endian `u32`
//! (bytes `b·j..b·j+4`), broadcast to eight lanes and shifted right by `b·lane`; `vpermps`
//! looks the low three bits up in an 8-entry table (for b < 3 the table repeats the `2^b`
//! centroids, so higher bits are ignored; for b = 4 a second table holds centroids 8..16 and
//! bit 3, moved to the sign bit, selects). For b ≥ 5 a `u64` holds the chunk: lanes 0–3 take
//! the low `4b` bits, lanes 4–7 the next `4b`, and a gather reads the codebook. A read that
//! would run past the record loads the record's last bytes instead and shifts (zero padded).
//!
//! Scores keep one accumulator per head (consecutive tokens are independent, so the
//! out-of-order core overlaps their chains); the QJL sign term comes from the sign tables of
//! [`KeyQueries`] (or `±1` vectors and multiply-adds without them). Every part of a record (a
//! tier, a basis group) is scored eight tokens at a time into registers, and the eight tokens'
//! scores of every part go to the output together, transposed to one 8-float add per head and
//! part: the per-token bookkeeping of a pass per part and its scattered score writes were most
//! of a two-tier step's instructions (callgrind, `examples/decode_steps.rs`). Values accumulate
//! two to four chunks per pass over a run's tokens, sub-blocked so the records stay in L1.

use core::arch::x86_64::*;

use half::f16;

use super::super::primitives::{
    EXP_HIGH, EXP_LN2_HI, EXP_LN2_LO, EXP_LOG2E, EXP_LOW, EXP_POLY, exp_poly,
};
use super::{CodedRun, KeyQueries, PlainKind, PlainRun, sign_table_len, tiles};

/// Bytes of a token sub-block whose records stay in L1 while value chunks sweep over it.
pub(super) const L1_BYTES: usize = 24 * 1024;

/// Sums the eight lanes: `((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let t = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps::<1>(t, t)))
}

/// `out[h·n + i] = Σ_{j ∈ live} Σ_k c_h[8j+k]·a_i[8j+k]`, summed as
/// [`score_bias`](crate::rope_center::score_bias) sums (lane `k` collects entries `≡ k mod 8`
/// in index order, product then add, never fused; then [`hsum`]'s order), for the `n` blocks
/// of angles in `span` (`a_i = span[i·d..]`) and the heads of `coefficients` (`c_h =
/// coefficients[h·d..]`). Four blocks at a time: four independent chains per head.
///
/// # Safety
/// AVX2/FMA/F16C; `d % 8 == 0`; `span` holds `n·d` floats, `coefficients` a whole number of
/// `d`-rows, `out` at least `group·n` floats and every `live` chunk `j` has `8j + 8 ≤ d`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn center_biases(
    coefficients: &[f32],
    d: usize,
    live: &[u32],
    span: &[f32],
    n: usize,
    out: &mut [f32],
) {
    // SAFETY: the caller's contract (above) bounds every pointer read and AVX2 is present.
    unsafe {
        let group = coefficients.len() / d;
        let mut i = 0;
        while i + 4 <= n {
            let a = span.as_ptr().add(i * d);
            for h in 0..group {
                let c = coefficients.as_ptr().add(h * d);
                let mut acc = [_mm256_setzero_ps(); 4];
                for &j in live {
                    let o = j as usize * 8;
                    // SAFETY (bounds): `o + 8 ≤ d`, so the reads stay in row `h` and blocks `i..i + 4`.
                    let cv = _mm256_loadu_ps(c.add(o));
                    for (k, acc) in acc.iter_mut().enumerate() {
                        let av = _mm256_loadu_ps(a.add(k * d + o));
                        *acc = _mm256_add_ps(*acc, _mm256_mul_ps(cv, av));
                    }
                }
                for (k, acc) in acc.iter().enumerate() {
                    out[h * n + i + k] = hsum(*acc);
                }
            }
            i += 4;
        }
        while i < n {
            let a = span.as_ptr().add(i * d);
            for h in 0..group {
                let c = coefficients.as_ptr().add(h * d);
                let mut acc = _mm256_setzero_ps();
                for &j in live {
                    let o = j as usize * 8;
                    // SAFETY (bounds): as above, block `i`.
                    acc = _mm256_add_ps(
                        acc,
                        _mm256_mul_ps(_mm256_loadu_ps(c.add(o)), _mm256_loadu_ps(a.add(o))),
                    );
                }
                out[h * n + i] = hsum(acc);
            }
            i += 1;
        }
    }
}

/// The lane sums of four vectors, `[Σa, Σb, Σc, Σd]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn hsum4(v: &[__m256; 4]) -> __m128 {
    let ab = _mm256_hadd_ps(v[0], v[1]);
    let cd = _mm256_hadd_ps(v[2], v[3]);
    let abcd = _mm256_hadd_ps(ab, cd);
    _mm_add_ps(
        _mm256_castps256_ps128(abcd),
        _mm256_extractf128_ps::<1>(abcd),
    )
}

/// Lane `l` of the result is `+1.0` if bit `31 − shifts[l]` of `word` is set, else `−1.0`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn sign_vector(word: __m256i, shifts: __m256i) -> __m256 {
    let negative =
        _mm256_andnot_si256(_mm256_sllv_epi32(word, shifts), _mm256_set1_epi32(i32::MIN));
    _mm256_xor_ps(_mm256_set1_ps(1.0), _mm256_castsi256_ps(negative))
}

/// `[Σ_k table[k][signs[k]]]` for the (up to) four heads of a tile: `bytes` 16-byte loads from
/// sign tables laid out `[k][256][4]` (see `KeyQueries`), four partial sums in a fixed order.
///
/// # Safety
/// AVX2/FMA/F16C; `signs` points to `bytes` readable bytes and `tables` holds `bytes·256·4`
/// floats.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn sign_table_sum(tables: &[f32], signs: *const u8, bytes: usize) -> __m128 {
    // SAFETY: caller contract; entry `[k][b]` ends at `4·(256·k + b) + 4 ≤ tables.len()`.
    unsafe {
        let tp = tables.as_ptr();
        let entry = |k: usize| _mm_loadu_ps(tp.add(4 * (256 * k + usize::from(*signs.add(k)))));
        let mut s = [_mm_setzero_ps(); 4];
        let mut k = 0;
        while k + 4 <= bytes {
            s[0] = _mm_add_ps(s[0], entry(k));
            s[1] = _mm_add_ps(s[1], entry(k + 1));
            s[2] = _mm_add_ps(s[2], entry(k + 2));
            s[3] = _mm_add_ps(s[3], entry(k + 3));
            k += 4;
        }
        while k < bytes {
            s[0] = _mm_add_ps(s[0], entry(k));
            k += 1;
        }
        _mm_add_ps(_mm_add_ps(s[0], s[1]), _mm_add_ps(s[2], s[3]))
    }
}

/// Shift vectors moving bit `8k + l` of a word to bit 31 of lane `l`, for byte `k` = 0..4.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn sign_shifts() -> [__m256i; 4] {
    let byte = |k: i32| {
        let b = 31 - 8 * k;
        _mm256_setr_epi32(b, b - 1, b - 2, b - 3, b - 4, b - 5, b - 6, b - 7)
    };
    [byte(0), byte(1), byte(2), byte(3)]
}

/// Code `j` (b bits, `b ≤ 8`) of a packed record.
#[inline]
pub(super) fn code_at(words: &[u32], b: usize, j: usize) -> usize {
    let bit = j * b;
    let (w, s) = (bit / 32, bit % 32);
    let mut x = u64::from(words[w]) >> s;
    if s + b > 32 {
        x |= u64::from(words[w + 1]) << (32 - s);
    }
    (x as usize) & ((1 << b) - 1)
}

/// Sign `j` (±1) of packed sign words.
#[inline]
pub(super) fn sign_at(words: &[u32], j: usize) -> f32 {
    if (words[j / 32] >> (j % 32)) & 1 == 1 {
        1.0
    } else {
        -1.0
    }
}

/// Centroid tables and shifts for b-bit codes.
struct Lut {
    lo: __m256,
    hi: __m256,
    shifts: __m256i,
    mask: __m256i,
    centroids: *const f32,
}

/// Bytes one chunk read takes: 4 for b ≤ 4, 8 above.
const fn read_width(b: u32) -> usize {
    if b <= 4 { 4 } else { 8 }
}

/// Chunks `j < full` whose read (`read_width` bytes at `b·j`) stays inside a `bytes`-byte
/// record; they come first, the rest need [`read_padded`].
fn fast_chunks(full: usize, b: u32, bytes: usize) -> usize {
    let width = read_width(b);
    if bytes < width {
        0
    } else {
        full.min((bytes - width) / b as usize + 1)
    }
}

/// Reads up to `width` (≤ 8) bytes at `offset` of a `bytes`-byte record, little-endian, zero
/// padded past the record's end. When the record holds at least `width` bytes this is one
/// unaligned load of the last `width` bytes, shifted; otherwise byte by byte.
///
/// # Safety
/// `record` must point to `bytes` readable bytes and `offset ≤ bytes`.
#[inline]
pub(super) unsafe fn read_padded(
    record: *const u8,
    bytes: usize,
    offset: usize,
    width: usize,
) -> u64 {
    if offset >= bytes {
        return 0;
    }
    if bytes >= width {
        let base = offset.min(bytes - width);
        // SAFETY: `base + width ≤ bytes`; unaligned reads are fine.
        let x = unsafe {
            if width == 4 {
                u64::from((record.add(base) as *const u32).read_unaligned())
            } else {
                (record.add(base) as *const u64).read_unaligned()
            }
        };
        // `offset − base < width`; the bytes past the record shift in as zeros.
        let shifted = x >> (8 * (offset - base));
        return if width == 8 {
            shifted
        } else {
            shifted & ((1u64 << (8 * width)) - 1)
        };
    }
    let mut x = 0u64;
    for k in 0..width.min(bytes - offset) {
        // SAFETY: offset + k < bytes (caller's contract).
        x |= u64::from(unsafe { *record.add(offset + k) }) << (8 * k);
    }
    x
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn lut<const B: u32>(centroids: &[f32]) -> Lut {
    let b = B as i32;
    let levels = 1usize << B;
    let table = |first: usize| {
        let mut t = [0.0f32; 8];
        for (k, v) in t.iter_mut().enumerate() {
            *v = centroids[(first + k) % levels];
        }
        t
    };
    let (lo, hi) = if B == 4 {
        (table(0), table(8))
    } else {
        (table(0), table(0))
    };
    // SAFETY: the tables are arrays of 8 floats.
    unsafe {
        Lut {
            lo: _mm256_loadu_ps(lo.as_ptr()),
            hi: _mm256_loadu_ps(hi.as_ptr()),
            shifts: if B <= 4 {
                _mm256_setr_epi32(0, b, 2 * b, 3 * b, 4 * b, 5 * b, 6 * b, 7 * b)
            } else {
                _mm256_setr_epi32(0, b, 2 * b, 3 * b, 0, b, 2 * b, 3 * b)
            },
            mask: _mm256_set1_epi32((1 << B) - 1),
            centroids: centroids.as_ptr(),
        }
    }
}

/// The centroids of the eight codes held in the low `8b` bits of `x`.
///
/// # Safety
/// AVX2/FMA/F16C; `lut` was built by [`lut::<B>`] from a slice of `2^B` centroids that is
/// still alive.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn lookup<const B: u32>(lut: &Lut, x: u64) -> __m256 {
    if B <= 4 {
        let idx = _mm256_srlv_epi32(_mm256_set1_epi32(x as u32 as i32), lut.shifts);
        let lo = _mm256_permutevar8x32_ps(lut.lo, idx);
        if B < 4 {
            lo
        } else {
            let hi = _mm256_permutevar8x32_ps(lut.hi, idx);
            let select = _mm256_castsi256_ps(_mm256_slli_epi32::<28>(idx));
            _mm256_blendv_ps(lo, hi, select)
        }
    } else {
        let low = x as u32 as i32;
        let high = (x >> (4 * B)) as u32 as i32;
        let v = _mm256_setr_epi32(low, low, low, low, high, high, high, high);
        let idx = _mm256_and_si256(_mm256_srlv_epi32(v, lut.shifts), lut.mask);
        // SAFETY: every index is masked below 2^B, the length of the centroid slice.
        unsafe { _mm256_i32gather_ps::<4>(lut.centroids, idx) }
    }
}

/// The centroids of chunk `j` (codes `8j..8j+8`), read directly.
///
/// # Safety
/// As [`lookup`]; `record` points to at least `B·j + read_width(B)` readable bytes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn chunk<const B: u32>(lut: &Lut, record: *const u8, j: usize) -> __m256 {
    // SAFETY: the caller guarantees the bytes are readable; unaligned reads are fine.
    unsafe {
        let p = record.add(B as usize * j);
        if B <= 4 {
            lookup::<B>(lut, u64::from((p as *const u32).read_unaligned()))
        } else {
            lookup::<B>(lut, (p as *const u64).read_unaligned())
        }
    }
}

/// The centroids of chunk `j` read byte by byte (for chunks near the end of a record).
///
/// # Safety
/// As [`lookup`]; `record` points to `bytes` readable bytes and `B·j ≤ bytes`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn chunk_padded<const B: u32>(
    lut: &Lut,
    record: *const u8,
    bytes: usize,
    j: usize,
) -> __m256 {
    // SAFETY: forwarded caller contract.
    unsafe {
        let x = read_padded(record, bytes, B as usize * j, read_width(B));
        lookup::<B>(lut, x)
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

// ---------------------------------------------------------------------------------------------
// Primitives.

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let full = n / 8 * 8;
    // SAFETY: every load reads 8 floats starting below `full ≤ n`.
    unsafe {
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut acc0 = _mm256_setzero_ps();
        let mut acc1 = _mm256_setzero_ps();
        let mut k = 0;
        while k + 16 <= full {
            acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(k)), _mm256_loadu_ps(pb.add(k)), acc0);
            acc1 = _mm256_fmadd_ps(
                _mm256_loadu_ps(pa.add(k + 8)),
                _mm256_loadu_ps(pb.add(k + 8)),
                acc1,
            );
            k += 16;
        }
        if k < full {
            acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(k)), _mm256_loadu_ps(pb.add(k)), acc0);
        }
        let mut s = hsum(_mm256_add_ps(acc0, acc1));
        for i in full..n {
            s += a[i] * b[i];
        }
        s
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
    let n = x.len().min(y.len());
    let full = n / 8 * 8;
    // SAFETY: every access covers 8 floats starting below `full ≤ n`.
    unsafe {
        let a = _mm256_set1_ps(alpha);
        let (px, py) = (x.as_ptr(), y.as_mut_ptr());
        let mut k = 0;
        while k < full {
            let v = _mm256_fmadd_ps(a, _mm256_loadu_ps(px.add(k)), _mm256_loadu_ps(py.add(k)));
            _mm256_storeu_ps(py.add(k), v);
            k += 8;
        }
    }
    for i in full..n {
        y[i] = alpha.mul_add(x[i], y[i]);
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dequantize(words: &[u32], bits: u8, centroids: &[f32], out: &mut [f32]) {
    // SAFETY: forwarded contract (features present, lengths checked by the dispatcher).
    unsafe {
        match bits {
            1 => dequantize_b::<1>(words, centroids, out),
            2 => dequantize_b::<2>(words, centroids, out),
            3 => dequantize_b::<3>(words, centroids, out),
            4 => dequantize_b::<4>(words, centroids, out),
            5 => dequantize_b::<5>(words, centroids, out),
            6 => dequantize_b::<6>(words, centroids, out),
            7 => dequantize_b::<7>(words, centroids, out),
            _ => dequantize_b::<8>(words, centroids, out),
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dequantize_b<const B: u32>(words: &[u32], centroids: &[f32], out: &mut [f32]) {
    let n = out.len();
    let full = n / 8;
    let bytes = 4 * words.len();
    let fast = fast_chunks(full, B, bytes);
    let record = words.as_ptr() as *const u8;
    // SAFETY: chunks below `fast` read inside the words (see `fast_chunks`), the others read
    // byte by byte below `bytes`; `B·j ≤ bytes` because the words hold all `n` codes; stores
    // cover 8 floats below `8·full ≤ n`.
    unsafe {
        let lut = lut::<B>(centroids);
        let po = out.as_mut_ptr();
        for j in 0..fast {
            _mm256_storeu_ps(po.add(8 * j), chunk::<B>(&lut, record, j));
        }
        for j in fast..full {
            _mm256_storeu_ps(po.add(8 * j), chunk_padded::<B>(&lut, record, bytes, j));
        }
    }
    for (j, o) in out.iter_mut().enumerate().skip(8 * full) {
        *o = centroids[code_at(words, B as usize, j)];
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn f16_to_f32(halves: &[f16], out: &mut [f32]) {
    let n = halves.len().min(out.len());
    let full = n / 8 * 8;
    // SAFETY: `f16` is a transparent `u16`; every access covers 8 values below `full ≤ n`.
    unsafe {
        let (ph, po) = (halves.as_ptr() as *const u8, out.as_mut_ptr());
        let mut k = 0;
        while k < full {
            let v = _mm256_cvtph_ps(_mm_loadu_si128(ph.add(2 * k) as *const __m128i));
            _mm256_storeu_ps(po.add(k), v);
            k += 8;
        }
    }
    for i in full..n {
        out[i] = halves[i].to_f32();
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn decode_f16_pairs(words: &[u32], out: &mut [f32]) {
    let n = out.len();
    let full = n / 8 * 8;
    // SAFETY: the words hold `ceil(n/2)` pairs (checked by the dispatcher); every load reads
    // 16 bytes = 8 halves below `full ≤ n`.
    unsafe {
        let (pw, po) = (words.as_ptr() as *const u8, out.as_mut_ptr());
        let mut k = 0;
        while k < full {
            let v = _mm256_cvtph_ps(_mm_loadu_si128(pw.add(2 * k) as *const __m128i));
            _mm256_storeu_ps(po.add(k), v);
            k += 8;
        }
    }
    for i in full..n {
        let w = words[i / 2];
        let half = if i % 2 == 0 { w & 0xFFFF } else { w >> 16 };
        out[i] = f16::from_bits(half as u16).to_f32();
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn signed_dot(w: &[f32], signs: &[u32]) -> f32 {
    let n = w.len();
    let chunks = n / 8;
    // SAFETY: chunk `j` reads sign word `j/4 < ceil(n/32)` (checked by the dispatcher) and
    // 8 weights below `8·chunks ≤ n`.
    let mut s = unsafe {
        let shifts = sign_shifts();
        let (pw, ps) = (w.as_ptr(), signs.as_ptr());
        let mut acc = _mm256_setzero_ps();
        for j in 0..chunks {
            let word = _mm256_set1_epi32(*ps.add(j / 4) as i32);
            let z = sign_vector(word, shifts[j % 4]);
            acc = _mm256_fmadd_ps(_mm256_loadu_ps(pw.add(8 * j)), z, acc);
        }
        hsum(acc)
    };
    for (j, &x) in w.iter().enumerate().skip(8 * chunks) {
        s += sign_at(signs, j) * x;
    }
    s
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn accumulate_signs(alpha: f32, signs: &[u32], acc: &mut [f32]) {
    let n = acc.len();
    let chunks = n / 8;
    // SAFETY: chunk `j` reads sign word `j/4 < ceil(n/32)` (checked by the dispatcher) and
    // updates 8 floats below `8·chunks ≤ n`.
    unsafe {
        let shifts = sign_shifts();
        let a = _mm256_set1_ps(alpha);
        let (pa, ps) = (acc.as_mut_ptr(), signs.as_ptr());
        for j in 0..chunks {
            let word = _mm256_set1_epi32(*ps.add(j / 4) as i32);
            let z = sign_vector(word, shifts[j % 4]);
            let v = _mm256_fmadd_ps(a, z, _mm256_loadu_ps(pa.add(8 * j)));
            _mm256_storeu_ps(pa.add(8 * j), v);
        }
    }
    for (j, a) in acc.iter_mut().enumerate().skip(8 * chunks) {
        *a += alpha * sign_at(signs, j);
    }
}

/// `primitives::q8_to_f32_bits` eight codes at a time: sign-extend, convert, multiply (the
/// same exact products).
///
/// # Safety
/// AVX2 must be available and `record` hold `out.len()` codes.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q8_to_f32_bits(record: &[u32], step: f32, out: &mut [u32]) {
    let full = out.len() / 8 * 8;
    let s = _mm256_set1_ps(step);
    let bytes = record.as_ptr().cast::<u8>();
    let mut k = 0;
    while k < full {
        // SAFETY: bytes k .. k + 8 are codes of the record and out[k .. k + 8] exists
        // (`k + 8 ≤ full ≤ out.len() ≤ 4·record.len()`, the caller's contract).
        unsafe {
            let codes = _mm_loadl_epi64(bytes.add(k).cast());
            let v = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(codes)), s);
            _mm256_storeu_ps(out.as_mut_ptr().add(k).cast(), v);
        }
        k += 8;
    }
    super::super::primitives::q8_to_f32_bits_from(record, step, out, full);
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn max(values: &[f32]) -> f32 {
    let n = values.len();
    let full = n / 8 * 8;
    // SAFETY: every load reads 8 floats below `full ≤ n`.
    let mut m = unsafe {
        let p = values.as_ptr();
        let mut acc = _mm256_set1_ps(f32::NEG_INFINITY);
        let mut k = 0;
        while k < full {
            acc = _mm256_max_ps(acc, _mm256_loadu_ps(p.add(k)));
            k += 8;
        }
        let mut lanes = [0.0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), acc);
        lanes.iter().copied().fold(f32::NEG_INFINITY, f32::max)
    };
    for &v in &values[full..] {
        m = m.max(v);
    }
    m
}

/// `exp` of eight lanes: bit-identical to [`exp_poly`] on each lane.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn exp8(x: __m256) -> __m256 {
    let low = _mm256_set1_ps(EXP_LOW);
    let valid = _mm256_cmp_ps::<_CMP_GE_OQ>(x, low);
    let x = _mm256_min_ps(_mm256_max_ps(x, low), _mm256_set1_ps(EXP_HIGH));
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
        x,
        _mm256_set1_ps(EXP_LOG2E),
    ));
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(EXP_LN2_HI), x);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(EXP_LN2_LO), r);
    let mut p = _mm256_set1_ps(EXP_POLY[0]);
    for &c in &EXP_POLY[1..] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    }
    let y = _mm256_fmadd_ps(
        p,
        _mm256_mul_ps(r, r),
        _mm256_add_ps(r, _mm256_set1_ps(1.0)),
    );
    let e = _mm256_slli_epi32::<23>(_mm256_add_epi32(
        _mm256_cvtps_epi32(n),
        _mm256_set1_epi32(127),
    ));
    _mm256_and_ps(_mm256_mul_ps(y, _mm256_castsi256_ps(e)), valid)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn exp_shifted_sum(values: &mut [f32], shift: f32) -> f32 {
    let n = values.len();
    let full = n / 8 * 8;
    let mut lanes = [0.0f32; 8];
    // SAFETY: every access covers 8 floats below `full ≤ n`.
    unsafe {
        let p = values.as_mut_ptr();
        let s = _mm256_set1_ps(shift);
        let mut acc = _mm256_setzero_ps();
        let mut k = 0;
        while k < full {
            let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(p.add(k)), s));
            _mm256_storeu_ps(p.add(k), e);
            acc = _mm256_add_ps(acc, e);
            k += 8;
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

// ---------------------------------------------------------------------------------------------
// Block kernels.

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn score_coded(
    run: &CodedRun<'_>,
    queries: &KeyQueries,
    out: &mut [f32],
    stride: usize,
) {
    // SAFETY: forwarded contract; one run is trivially the parts of its own records.
    unsafe { score_parts(std::slice::from_ref(run), &[queries], out, stride) }
}

/// The most parts [`score_parts`] takes (a plane basis has at most one group per code width,
/// 1 to 8 bits).
pub(super) const MAX_PARTS: usize = 8;

/// One part of a tile's records (a tier or a basis group) with the tile's query rows `[H, d]`,
/// sketch rows `[H, m]` and sign tables (empty without).
#[derive(Clone, Copy)]
struct Part<'a> {
    run: &'a CodedRun<'a>,
    q: &'a [f32],
    w: &'a [f32],
    tables: &'a [f32],
}

/// Adds the scores of runs that are parts of the same records (one run, the tiers of a two-tier
/// record, the groups of a basis record), eight tokens at a time: every part's scores of the
/// eight, then their sum into `out`, part after part. A token's score of each part is computed
/// as a pass per part computes it and added in the same order, so the bits are those of a pass
/// per part; what this saves is the per-token bookkeeping and the score writes of every pass
/// but one (`out` is read and written once per eight tokens and head).
///
/// # Safety
/// AVX2/FMA/F16C; `runs` (at most [`MAX_PARTS`]) passed the dispatcher's checks, share their
/// records, and `queries[k]` matches `runs[k]`; `out` holds `(heads − 1)·stride + n` floats.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn score_parts(
    runs: &[CodedRun<'_>],
    queries: &[&KeyQueries],
    out: &mut [f32],
    stride: usize,
) {
    debug_assert!(!runs.is_empty() && runs.len() <= MAX_PARTS);
    let n = runs[0].len();
    for (t, (first, size)) in tiles(queries[0].heads()).enumerate() {
        let part = |k: usize| {
            let (run, q) = (&runs[k], queries[k]);
            let (d, m) = (run.dim, run.sketch_dim);
            let per_tile = sign_table_len(m);
            Part {
                run,
                q: &q.queries[first * d..(first + size) * d],
                w: if m > 0 {
                    &q.sketch[first * m..(first + size) * m]
                } else {
                    &[][..]
                },
                tables: if m > 0 && q.has_sign_tables() {
                    &q.tables[t * per_tile..(t + 1) * per_tile]
                } else {
                    &[][..]
                },
            }
        };
        let mut parts = [part(0); MAX_PARTS];
        for (k, slot) in parts.iter_mut().enumerate().take(runs.len()).skip(1) {
            *slot = part(k);
        }
        let o = &mut out[first * stride..];
        let parts = &parts[..runs.len()];
        // SAFETY: forwarded contract; the tile's slices hold `size` rows.
        unsafe {
            match size {
                1 => score_parts_tile::<1>(parts, n, o, stride),
                2 => score_parts_tile::<2>(parts, n, o, stride),
                3 => score_parts_tile::<3>(parts, n, o, stride),
                _ => score_parts_tile::<4>(parts, n, o, stride),
            }
        }
    }
}

/// [`score_parts`] on one tile of `H` heads.
///
/// # Safety
/// As [`score_parts`]; every part's rows hold `H` heads, and `out` `(H − 1)·stride + n` floats.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn score_parts_tile<const H: usize>(
    parts: &[Part<'_>],
    n: usize,
    out: &mut [f32],
    stride: usize,
) {
    let op = out.as_mut_ptr();
    // SAFETY: forwarded contract.
    if unsafe { score_flat_layouts::<H>(parts, n, op, stride) } {
        return;
    }
    let mut batches = [[_mm_setzero_ps(); 8]; MAX_PARTS];
    for first in (0..n).step_by(8) {
        let len = (n - first).min(8);
        for (part, batch) in parts.iter().zip(&mut batches) {
            // SAFETY: forwarded contract; tokens `first..first + len` are records of the run.
            unsafe {
                match part.run.bits {
                    1 => part_batch::<1, H>(part, first, len, batch),
                    2 => part_batch::<2, H>(part, first, len, batch),
                    3 => part_batch::<3, H>(part, first, len, batch),
                    4 => part_batch::<4, H>(part, first, len, batch),
                    5 => part_batch::<5, H>(part, first, len, batch),
                    6 => part_batch::<6, H>(part, first, len, batch),
                    7 => part_batch::<7, H>(part, first, len, batch),
                    _ => part_batch::<8, H>(part, first, len, batch),
                }
            }
        }
        // SAFETY: `first + len ≤ n`, so the writes stay inside `out` (caller contract).
        unsafe { flush_scores::<H>(&batches[..parts.len()], len, op.add(first), stride) };
    }
}

/// Whether [`score_parts_tile`] may take [`score_flat`] (tests switch it off).
static FLAT_LOOP: super::FlatSwitch = super::FlatSwitch::new();

/// Runs [`score_flat`] if the parts have one of the presets' layouts — one part of 2, 3 or
/// 4 bits at d = 64 or 128, or the two tiers of `tq3.5` / `tq2.5` (25% of the channels at
/// 4 / 3 bits, the rest at 3 / 2) at d = 64, 128 or 256 — with no signs and every chunk read
/// directly; `false` if not.
///
/// # Safety
/// As [`score_parts_tile`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn score_flat_layouts<const H: usize>(
    parts: &[Part<'_>],
    n: usize,
    out: *mut f32,
    stride: usize,
) -> bool {
    let flat = |p: &Part<'_>| {
        let r = p.run;
        let full = r.dim / 8;
        r.sketch_dim == 0
            && r.dim.is_multiple_of(8)
            && r.bits <= 4
            && fast_chunks(
                full,
                u32::from(r.bits),
                4 * (r.record_words - r.code_offset),
            ) == full
    };
    if !FLAT_LOOP.enabled() || !parts.iter().all(flat) {
        return false;
    }
    let layout = |p: &Part<'_>| (p.run.bits, p.run.dim / 8);
    // SAFETY: forwarded contract; the match fixes every part's width and chunk count, and
    // `flat` checked that each chunk reads directly inside the record.
    unsafe {
        match parts {
            [a] => match layout(a) {
                (4, 8) => score_flat::<4, 8, 0, 0, H>(parts, n, out, stride),
                (4, 16) => score_flat::<4, 16, 0, 0, H>(parts, n, out, stride),
                (3, 8) => score_flat::<3, 8, 0, 0, H>(parts, n, out, stride),
                (3, 16) => score_flat::<3, 16, 0, 0, H>(parts, n, out, stride),
                (2, 8) => score_flat::<2, 8, 0, 0, H>(parts, n, out, stride),
                (2, 16) => score_flat::<2, 16, 0, 0, H>(parts, n, out, stride),
                _ => return false,
            },
            [a, b] => match (layout(a), layout(b)) {
                ((4, 2), (3, 6)) => score_flat::<4, 2, 3, 6, H>(parts, n, out, stride),
                ((4, 4), (3, 12)) => score_flat::<4, 4, 3, 12, H>(parts, n, out, stride),
                ((4, 8), (3, 24)) => score_flat::<4, 8, 3, 24, H>(parts, n, out, stride),
                ((3, 2), (2, 6)) => score_flat::<3, 2, 2, 6, H>(parts, n, out, stride),
                ((3, 4), (2, 12)) => score_flat::<3, 4, 2, 12, H>(parts, n, out, stride),
                ((3, 8), (2, 24)) => score_flat::<3, 8, 2, 24, H>(parts, n, out, stride),
                _ => return false,
            },
            _ => return false,
        }
    }
    true
}

/// [`score_parts_tile`] for one part of `C0` chunks of `B0`-bit codes, or two (`C1` > 0 chunks
/// of `B1` bits), without signs, every chunk read directly: one token loop with the chunk
/// loops unrolled and no per-part bookkeeping. The same multiply-adds, horizontal sums and
/// additions as [`part_batch`] and [`flush_scores`], so the same bits.
///
/// # Safety
/// As [`score_parts_tile`]; `parts` holds one part (`C1` = 0) or two, part `k` with `B_k`-bit
/// codes of `8·C_k` coordinates, no signs, and every chunk's read inside the record.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn score_flat<
    const B0: u32,
    const C0: usize,
    const B1: u32,
    const C1: usize,
    const H: usize,
>(
    parts: &[Part<'_>],
    n: usize,
    out: *mut f32,
    stride: usize,
) {
    let (p0, p1) = (&parts[0], &parts[parts.len() - 1]);
    let rw = p0.run.record_words;
    let count = if C1 > 0 { 2 } else { 1 };
    // SAFETY: record `i < n` spans `4·rw` bytes from `4·i·rw`; part `k`'s chunk `j < C_k`
    // reads `read_width` bytes at `code_offset + B_k·j` inside it (caller contract); query loads
    // read 8 floats of row `h < H` below `8·C_k`; scale reads take `scales[i·scale_stride]`,
    // which `CodedRun::check` made cover every record; `flush_scores` writes inside `out`.
    unsafe {
        let base = p0.run.words.as_ptr() as *const u8;
        let lut0 = lut::<B0>(p0.run.centroids);
        let lut1 = lut::<B1>(p1.run.centroids);
        let (q0, q1) = (p0.q.as_ptr(), p1.q.as_ptr());
        let (off0, off1) = (4 * p0.run.code_offset, 4 * p1.run.code_offset);
        let (s0, s1) = (p0.run.scales.as_ptr(), p1.run.scales.as_ptr());
        let (t0, t1) = (p0.run.scale_stride, p1.run.scale_stride);
        let mut batches = [[_mm_setzero_ps(); 8]; 2];
        for first in (0..n).step_by(8) {
            let len = (n - first).min(8);
            let [b0, b1] = &mut batches;
            for (t, (x0, x1)) in b0.iter_mut().zip(b1.iter_mut()).enumerate().take(len) {
                let i = first + t;
                let rec = base.add(4 * i * rw);
                let mut a = [_mm256_setzero_ps(); 4];
                for j in 0..C0 {
                    let c = chunk::<B0>(&lut0, rec.add(off0), j);
                    for (h, acc) in a.iter_mut().enumerate().take(H) {
                        *acc =
                            _mm256_fmadd_ps(_mm256_loadu_ps(q0.add(h * 8 * C0 + 8 * j)), c, *acc);
                    }
                }
                *x0 = _mm_mul_ps(_mm_set1_ps(*s0.add(i * t0)), hsum4(&a));
                if C1 > 0 {
                    let mut a = [_mm256_setzero_ps(); 4];
                    for j in 0..C1 {
                        let c = chunk::<B1>(&lut1, rec.add(off1), j);
                        for (h, acc) in a.iter_mut().enumerate().take(H) {
                            let q = _mm256_loadu_ps(q1.add(h * 8 * C1 + 8 * j));
                            *acc = _mm256_fmadd_ps(q, c, *acc);
                        }
                    }
                    *x1 = _mm_mul_ps(_mm_set1_ps(*s1.add(i * t1)), hsum4(&a));
                }
            }
            flush_scores::<H>(&batches[..count], len, out.add(first), stride);
        }
    }
}

/// Chunks a value pass accumulates at once for `heads` heads (about eight chains in flight
/// while everything stays in the 16 registers).
const fn value_sets(heads: usize) -> usize {
    match heads {
        1 => 4,
        2 => 3,
        _ => 2,
    }
}

/// One part's scores of tokens `first..first + len` (`len ≤ 8`) against the tile's `H` heads,
/// `batch[t]` for token `first + t` with the heads in its lanes: `norm·Σ_j q_hj·c[code_j]` plus
/// the sign term, in the order of a pass per part.
///
/// # Safety
/// AVX2/FMA/F16C; the part's run passed the dispatcher's checks, its `bits` is `B`, its rows
/// hold `H` heads, and `first + len ≤ n`.
#[inline(never)]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn part_batch<const B: u32, const H: usize>(
    part: &Part<'_>,
    first: usize,
    len: usize,
    batch: &mut [__m128; 8],
) {
    let (d, m) = (part.run.dim, part.run.sketch_dim);
    let use_tables = !part.tables.is_empty();
    // Codes past the last whole chunk, and sign terms without tables, take `token_extras`.
    let extras = 8 * (d / 8) < d || (m > 0 && !use_tables);
    // SAFETY: forwarded contract.
    unsafe {
        match (extras, m > 0) {
            (true, _) => part_tokens::<B, H, true, true>(part, first, len, batch),
            (false, true) => part_tokens::<B, H, false, true>(part, first, len, batch),
            (false, false) => part_tokens::<B, H, false, false>(part, first, len, batch),
        }
    }
}

/// The token loop of [`part_batch`], with `token_extras` (`EXTRAS`) and sign-table terms
/// (`SIGNS`) compiled in only where a part has them: a loop that never calls out keeps its
/// tables and pointers in registers.
///
/// # Safety
/// As [`part_batch`]; `EXTRAS` is set when the part has codes past its last whole chunk or
/// signs without tables, `SIGNS` when it has signs.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn part_tokens<const B: u32, const H: usize, const EXTRAS: bool, const SIGNS: bool>(
    part: &Part<'_>,
    first: usize,
    len: usize,
    batch: &mut [__m128; 8],
) {
    let run = part.run;
    let (d, m, rw) = (run.dim, run.sketch_dim, run.record_words);
    let bytes = 4 * (rw - run.code_offset);
    let full = d / 8;
    let fast = fast_chunks(full, B, bytes);
    let use_tables = !part.tables.is_empty();
    let sign_bytes = m.div_ceil(8);
    // SAFETY: record `i < n` is `words[i·rw..(i+1)·rw]` and its codes start at `code_offset`;
    // code reads stay inside the record (fast chunks by `fast_chunks`, the others through
    // `read_padded` below `bytes`); query loads read 8 floats of row `h < H` below `d`, the
    // part's rows holding `H`; scale reads take `scales[i·scale_stride (+1)]`, which
    // `CodedRun::check` made cover every record; sign-table reads as in `sign_table_sum`
    // (`ceil(m/8)` bytes of the sign words, inside the record).
    unsafe {
        let lut = lut::<B>(run.centroids);
        let qp = part.q.as_ptr();
        let base = run.words.as_ptr() as *const u8;
        let scales = run.scales.as_ptr();
        for (t, slot) in batch.iter_mut().enumerate().take(len) {
            let i = first + t;
            let rec = base.add(4 * i * rw);
            let codes = rec.add(4 * run.code_offset);
            // One accumulator per head: consecutive tokens are independent, so the
            // out-of-order core overlaps their multiply-add chains.
            let mut a = [_mm256_setzero_ps(); 4];
            for j in 0..fast {
                let c = chunk::<B>(&lut, codes, j);
                for (h, acc) in a.iter_mut().enumerate().take(H) {
                    *acc = _mm256_fmadd_ps(_mm256_loadu_ps(qp.add(h * d + 8 * j)), c, *acc);
                }
            }
            for j in fast..full {
                let c = chunk_padded::<B>(&lut, codes, bytes, j);
                for (h, acc) in a.iter_mut().enumerate().take(H) {
                    *acc = _mm256_fmadd_ps(_mm256_loadu_ps(qp.add(h * d + 8 * j)), c, *acc);
                }
            }
            let norm = *scales.add(i * run.scale_stride);
            let mut scores = _mm_mul_ps(_mm_set1_ps(norm), hsum4(&a));
            if SIGNS && use_tables {
                let sum = sign_table_sum(part.tables, rec.add(4 * run.sign_offset), sign_bytes);
                let gamma = *scales.add(i * run.scale_stride + 1);
                scores = _mm_fmadd_ps(_mm_set1_ps(gamma), sum, scores);
            }
            if EXTRAS {
                scores = token_extras::<B, H>(run, (part.q, part.w, use_tables), i, scores);
            }
            *slot = scores;
        }
    }
}

/// What [`part_batch`]'s token loop leaves out, added to token `i`'s `scores` in the
/// general order: sign terms without tables (`±1` vectors and multiply-adds), then per head the
/// codes past the last whole chunk (`+ norm·tail`) and, without tables, the signs past the last
/// whole byte (`+ γ·tail`).
///
/// # Safety
/// AVX2/FMA/F16C; `i` is a record of `run`, `q` (`w`) hold the tile's `H` query (sketch) rows.
#[inline(never)]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn token_extras<const B: u32, const H: usize>(
    run: &CodedRun<'_>,
    (q, w, use_tables): (&[f32], &[f32], bool),
    i: usize,
    mut scores: __m128,
) -> __m128 {
    let (d, m, rw) = (run.dim, run.sketch_dim, run.record_words);
    let full = d / 8;
    let sign_chunks = m / 8;
    let sign_words = sign_chunks / 4;
    let record = &run.words[i * rw..(i + 1) * rw];
    let codes = &record[run.code_offset..];
    let norm = run.scales[i * run.scale_stride];
    if m > 0 && !use_tables {
        // SAFETY: sign reads take words `sign_offset + j/4 < rw` for `j < m/8`; sketch loads
        // read 8 floats of row `h < H` below `m`, the tile holding `H` rows.
        unsafe {
            let shifts = sign_shifts();
            let wp = w.as_ptr();
            let sp = record.as_ptr().add(run.sign_offset);
            let mut s = [_mm256_setzero_ps(); 4];
            for g in 0..sign_words {
                let word = _mm256_set1_epi32(*sp.add(g) as i32);
                for (k, &shift) in shifts.iter().enumerate() {
                    let z = sign_vector(word, shift);
                    let j = 4 * g + k;
                    for (h, acc) in s.iter_mut().enumerate().take(H) {
                        *acc = _mm256_fmadd_ps(_mm256_loadu_ps(wp.add(h * m + 8 * j)), z, *acc);
                    }
                }
            }
            for j in 4 * sign_words..sign_chunks {
                let z = sign_vector(_mm256_set1_epi32(*sp.add(j / 4) as i32), shifts[j % 4]);
                for (h, acc) in s.iter_mut().enumerate().take(H) {
                    *acc = _mm256_fmadd_ps(_mm256_loadu_ps(wp.add(h * m + 8 * j)), z, *acc);
                }
            }
            let gamma = run.scales[i * run.scale_stride + 1];
            scores = _mm_fmadd_ps(_mm_set1_ps(gamma), hsum4(&s), scores);
        }
    }
    let mut t = [0.0f32; 4];
    // SAFETY: `t` holds four floats.
    unsafe { _mm_storeu_ps(t.as_mut_ptr(), scores) };
    for (h, v) in t.iter_mut().enumerate().take(H) {
        if 8 * full < d {
            let mut tail = 0.0f32;
            for j in 8 * full..d {
                tail += q[h * d + j] * run.centroids[code_at(codes, B as usize, j)];
            }
            *v += norm * tail;
        }
        if 8 * sign_chunks < m && !use_tables {
            let signs = &record[run.sign_offset..];
            let mut tail = 0.0f32;
            for j in 8 * sign_chunks..m {
                tail += w[h * m + j] * sign_at(signs, j);
            }
            *v += run.scales[i * run.scale_stride + 1] * tail;
        }
    }
    // SAFETY: `t` holds four floats.
    unsafe { _mm_loadu_ps(t.as_ptr()) }
}

/// Adds the parts' scores of `len ≤ 8` tokens (`batches[p][t]`: part `p`'s scores of token `t`,
/// heads in lanes) to `out[h·stride + t]` for the tile's `H` heads, part after part: a whole
/// batch as 8-float adds per head (each part's batch transposed in registers), a partial one
/// float by float. Each float gets the same additions in the same order either way.
///
/// # Safety
/// AVX2/FMA/F16C; `out` points to `(H − 1)·stride + len` writable floats.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn flush_scores<const H: usize>(
    batches: &[[__m128; 8]],
    len: usize,
    out: *mut f32,
    stride: usize,
) {
    // SAFETY: caller contract.
    unsafe {
        if len == 8 {
            // Part `p`'s scores, head `h` in row `h`, token `t` in lane `t`.
            let transposed = |batch: &[__m128; 8]| {
                // Rows `[tokens k | tokens k + 4]`, transposed lane-wise into heads.
                let y: [__m256; 4] =
                    std::array::from_fn(|k| _mm256_set_m128(batch[k + 4], batch[k]));
                let t0 = _mm256_unpacklo_ps(y[0], y[1]);
                let t1 = _mm256_unpacklo_ps(y[2], y[3]);
                let t2 = _mm256_unpackhi_ps(y[0], y[1]);
                let t3 = _mm256_unpackhi_ps(y[2], y[3]);
                [
                    _mm256_shuffle_ps::<0x44>(t0, t1),
                    _mm256_shuffle_ps::<0xEE>(t0, t1),
                    _mm256_shuffle_ps::<0x44>(t2, t3),
                    _mm256_shuffle_ps::<0xEE>(t2, t3),
                ]
            };
            let mut sums: [__m256; 4] = std::array::from_fn(|h| {
                if h < H {
                    _mm256_loadu_ps(out.add(h * stride))
                } else {
                    _mm256_setzero_ps()
                }
            });
            for batch in batches {
                let heads = transposed(batch);
                for h in 0..H {
                    sums[h] = _mm256_add_ps(sums[h], heads[h]);
                }
            }
            for (h, &v) in sums.iter().enumerate().take(H) {
                _mm256_storeu_ps(out.add(h * stride), v);
            }
        } else {
            for t in 0..len {
                for h in 0..H {
                    let mut x = *out.add(h * stride + t);
                    for batch in batches {
                        let mut lanes = [0.0f32; 4];
                        _mm_storeu_ps(lanes.as_mut_ptr(), batch[t]);
                        x += lanes[h];
                    }
                    *out.add(h * stride + t) = x;
                }
            }
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn score_plain(
    run: &PlainRun<'_>,
    queries: &[f32],
    out: &mut [f32],
    stride: usize,
) {
    let d = run.dim;
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

/// Eight values of chunk `j` of a plain record.
///
/// # Safety
/// AVX2/FMA/F16C; `record` points to a record holding at least `8j + 8` values.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn plain_chunk<const F16: bool>(record: *const u8, j: usize) -> __m256 {
    // SAFETY: caller contract.
    unsafe {
        if F16 {
            _mm256_cvtph_ps(_mm_loadu_si128(record.add(16 * j) as *const __m128i))
        } else {
            _mm256_loadu_ps(record.add(32 * j) as *const f32)
        }
    }
}

/// Value `j` of a plain record.
#[inline]
pub(super) fn plain_at<const F16: bool>(record: &[u32], j: usize) -> f32 {
    if F16 {
        let w = record[j / 2];
        let half = if j.is_multiple_of(2) {
            w & 0xFFFF
        } else {
            w >> 16
        };
        f16::from_bits(half as u16).to_f32()
    } else {
        f32::from_bits(record[j])
    }
}

/// Scores in the order every instruction set shares for plain records
/// ([`lane8_dot`](super::super::primitives::lane8_dot)): one 8-lane multiply-add chain per
/// head, [`hsum4`]'s horizontal adds, then the trailing values one at a time.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn score_plain_tile<const F16: bool, const H: usize>(
    run: &PlainRun<'_>,
    q: &[f32],
    out: &mut [f32],
    stride: usize,
) {
    let d = run.dim;
    let full = d / 8;
    // SAFETY: score writes go to `out[h·stride + i]`, inside `out` (checked by the dispatcher);
    // each record holds `d` values from word `offset` and chunks stay below
    // `8·full ≤ d`; query loads read 8 floats of row `h < H` below `d`.
    unsafe {
        let qp = q.as_ptr();
        let op = out.as_mut_ptr();
        for (i, record) in run.words.chunks_exact(run.record_words).enumerate() {
            let record = &record[run.offset..];
            let rec = record.as_ptr() as *const u8;
            let mut a = [_mm256_setzero_ps(); 4];
            for j in 0..full {
                let x = plain_chunk::<F16>(rec, j);
                for (h, acc) in a.iter_mut().enumerate().take(H) {
                    *acc = _mm256_fmadd_ps(_mm256_loadu_ps(qp.add(h * d + 8 * j)), x, *acc);
                }
            }
            let mut t = [0.0f32; 4];
            _mm_storeu_ps(t.as_mut_ptr(), hsum4(&a));
            for (h, &score) in t.iter().enumerate().take(H) {
                let mut v = score;
                for j in 8 * full..d {
                    v += q[h * d + j] * plain_at::<F16>(record, j);
                }
                *op.add(h * stride + i) += v;
            }
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn accumulate_coded(
    run: &CodedRun<'_>,
    code_weights: &[f32],
    sign_weights: &[f32],
    acc: &mut [f32],
    sign_acc: &mut [f32],
) {
    let d = run.dim;
    let heads = acc.len() / d;
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

/// [`accumulate_coded`] from head-major weights: `acc[h] += Σ_i (weights[h·stride + i]·norm_i)·
/// c[idx_i]` for a run without QJL signs, the same products and order (the same bits) without
/// the token-major `p·norm` rows.
///
/// # Safety
/// AVX2, FMA and F16C; the run passed the dispatcher's checks and has no signs; `weights` holds
/// `(heads − 1)·stride + n` floats and `acc` `heads·d`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn accumulate_head_major(
    run: &CodedRun<'_>,
    weights: &[f32],
    stride: usize,
    acc: &mut [f32],
) {
    let heads = acc.len() / run.dim;
    for (first, size) in tiles(heads) {
        // SAFETY: forwarded contract; the tile covers rows `first..first + size < heads`.
        unsafe {
            by_bits_heads!(
                run.bits,
                size,
                accumulate_head_major_tile(run, weights, stride, heads, first, acc)
            )
        }
    }
}

/// Where a value pass reads and writes.
struct Pass {
    /// First byte of record 0's vector (codes or plain values).
    base: *const u8,
    /// Bytes between records.
    stride: usize,
    /// Readable bytes from a record's vector start to the record's end.
    bytes: usize,
    /// Weights `[n, heads]`, offset to the tile's first head; for a head-major coded pass
    /// (`coded_pass::<.., true>`) the tile's first row of head-major weights instead.
    weights: *const f32,
    heads: usize,
    /// Accumulator row of the tile's first head (`d` floats per head).
    acc: *mut f32,
    d: usize,
    /// Head-major coded passes: head `h`'s weight of token `i` is
    /// `weights[h·weight_stride + i]·norms[i·norm_stride]` (the product `scale_rows` writes).
    weight_stride: usize,
    norms: *const f32,
    norm_stride: usize,
}

impl Pass {
    /// Head `h`'s weight of token `i`.
    ///
    /// # Safety
    /// `i` is a token and `h` a head of the pass's tile.
    #[inline]
    unsafe fn weight<const HEAD_MAJOR: bool>(&self, i: usize, h: usize) -> f32 {
        // SAFETY: caller contract.
        unsafe {
            if HEAD_MAJOR {
                *self.weights.add(h * self.weight_stride + i)
                    * *self.norms.add(i * self.norm_stride)
            } else {
                *self.weights.add(i * self.heads + h)
            }
        }
    }
}

/// Accumulates chunks `j..j + C` of tokens `start..end` into the tile's accumulators (`C`
/// chunks at once, so `C·H` multiply-add chains are independent); `PADDED` reads the chunks
/// byte by byte.
///
/// # Safety
/// AVX2/FMA/F16C; `p` describes `end` records, `H` heads and accumulator rows holding chunks
/// `j..j + C`; without `PADDED`, chunks `j..j + C` are fast (see `fast_chunks`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn coded_pass<
    const B: u32,
    const H: usize,
    const C: usize,
    const PADDED: bool,
    const HEAD_MAJOR: bool,
>(
    lut: &Lut,
    p: &Pass,
    j: usize,
    start: usize,
    end: usize,
) {
    // SAFETY: caller contract.
    unsafe {
        let mut r = [[_mm256_setzero_ps(); 4]; 4];
        for (s, set) in r.iter_mut().enumerate().take(C) {
            for (h, v) in set.iter_mut().enumerate().take(H) {
                *v = _mm256_loadu_ps(p.acc.add(h * p.d + 8 * (j + s)));
            }
        }
        for i in start..end {
            let rec = p.base.add(i * p.stride);
            let mut c = [_mm256_setzero_ps(); 4];
            for (s, v) in c.iter_mut().enumerate().take(C) {
                *v = if PADDED {
                    chunk_padded::<B>(lut, rec, p.bytes, j + s)
                } else {
                    chunk::<B>(lut, rec, j + s)
                };
            }
            for h in 0..H {
                let wv = _mm256_set1_ps(p.weight::<HEAD_MAJOR>(i, h));
                for (set, &cv) in r.iter_mut().zip(&c).take(C) {
                    set[h] = _mm256_fmadd_ps(wv, cv, set[h]);
                }
            }
        }
        for (s, set) in r.iter().enumerate().take(C) {
            for (h, v) in set.iter().enumerate().take(H) {
                _mm256_storeu_ps(p.acc.add(h * p.d + 8 * (j + s)), *v);
            }
        }
    }
}

/// The plain-record counterpart of [`coded_pass`].
///
/// # Safety
/// AVX2/FMA/F16C; `p` describes `end` records holding `d` values, `H` heads and accumulator
/// rows holding chunks `j..j + C`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn plain_pass<const F16: bool, const H: usize, const C: usize>(
    p: &Pass,
    j: usize,
    start: usize,
    end: usize,
) {
    // SAFETY: caller contract.
    unsafe {
        let mut r = [[_mm256_setzero_ps(); 4]; 4];
        for (s, set) in r.iter_mut().enumerate().take(C) {
            for (h, v) in set.iter_mut().enumerate().take(H) {
                *v = _mm256_loadu_ps(p.acc.add(h * p.d + 8 * (j + s)));
            }
        }
        for i in start..end {
            let rec = p.base.add(i * p.stride);
            let mut x = [_mm256_setzero_ps(); 4];
            for (s, v) in x.iter_mut().enumerate().take(C) {
                *v = plain_chunk::<F16>(rec, j + s);
            }
            let wi = p.weights.add(i * p.heads);
            for h in 0..H {
                let wv = _mm256_set1_ps(*wi.add(h));
                for (set, &xv) in r.iter_mut().zip(&x).take(C) {
                    set[h] = _mm256_fmadd_ps(wv, xv, set[h]);
                }
            }
        }
        for (s, set) in r.iter().enumerate().take(C) {
            for (h, v) in set.iter().enumerate().take(H) {
                _mm256_storeu_ps(p.acc.add(h * p.d + 8 * (j + s)), *v);
            }
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn accumulate_coded_tile<const B: u32, const H: usize>(
    run: &CodedRun<'_>,
    code_weights: &[f32],
    sign_weights: &[f32],
    heads: usize,
    first: usize,
    acc: &mut [f32],
    sign_acc: &mut [f32],
) {
    // SAFETY: forwarded contract.
    unsafe {
        accumulate_tile::<B, H, false>(
            run,
            (code_weights, 0),
            sign_weights,
            heads,
            first,
            acc,
            sign_acc,
        )
    }
}

/// [`accumulate_coded_tile`] from head-major weights (`weights[h·stride + i]`) times each
/// token's norm, for a run without signs: the same products, so the same bits.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn accumulate_head_major_tile<const B: u32, const H: usize>(
    run: &CodedRun<'_>,
    weights: &[f32],
    stride: usize,
    heads: usize,
    first: usize,
    acc: &mut [f32],
) {
    // SAFETY: forwarded contract; a run without signs reads no sign weights or accumulators.
    unsafe {
        accumulate_tile::<B, H, true>(run, (weights, stride), &[], heads, first, acc, &mut [])
    }
}

/// The body of [`accumulate_coded_tile`] (token-major weights, `(weights, _)`) and of
/// [`accumulate_head_major_tile`] (`HEAD_MAJOR`: `(weights, stride)` head-major, times the
/// norms).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn accumulate_tile<const B: u32, const H: usize, const HEAD_MAJOR: bool>(
    run: &CodedRun<'_>,
    (code_weights, weight_stride): (&[f32], usize),
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
    let full = d / 8;
    let fast = fast_chunks(full, B, bytes);
    let sign_chunks = m / 8;
    let b = B as usize;
    let sub = (L1_BYTES / stride).max(1);
    let sets = value_sets(H);
    // SAFETY: record `i < n` starts at byte `i·stride` of the run and its codes `4·code_offset`
    // bytes later; code reads stay inside the record (fast chunks by `fast_chunks`, the others
    // byte by byte below `bytes`); sign reads take words `i·rw + sign_offset + j/4`, inside
    // record `i`; weights are read at `i·heads + first + h < n·heads` (head-major: at
    // `(first + h)·stride + i`, below the caller's `(heads − 1)·stride + n`, and norms at
    // `i·scale_stride`, checked by the dispatcher); accumulator rows
    // `first + h < heads` hold `d` (or `m`) floats and chunk accesses stay below `8·full ≤ d`
    // (or `8·sign_chunks ≤ m`).
    unsafe {
        let lut = lut::<B>(run.centroids);
        let shifts = sign_shifts();
        let words = run.words.as_ptr();
        let pass = Pass {
            base: words.add(run.code_offset) as *const u8,
            stride,
            bytes,
            weights: if HEAD_MAJOR {
                code_weights.as_ptr().add(first * weight_stride)
            } else {
                code_weights.as_ptr().add(first)
            },
            heads,
            acc: acc.as_mut_ptr().add(first * d),
            d,
            weight_stride,
            norms: run.scales.as_ptr(),
            norm_stride: run.scale_stride,
        };
        let sw = sign_weights.as_ptr();
        let ps = sign_acc.as_mut_ptr().add(first * m);
        let mut start = 0;
        while start < n {
            let end = n.min(start + sub);
            let mut j = 0;
            while j + sets <= fast {
                match sets {
                    2 => coded_pass::<B, H, 2, false, HEAD_MAJOR>(&lut, &pass, j, start, end),
                    3 => coded_pass::<B, H, 3, false, HEAD_MAJOR>(&lut, &pass, j, start, end),
                    _ => coded_pass::<B, H, 4, false, HEAD_MAJOR>(&lut, &pass, j, start, end),
                }
                j += sets;
            }
            for j in j..full {
                if j < fast {
                    coded_pass::<B, H, 1, false, HEAD_MAJOR>(&lut, &pass, j, start, end);
                } else {
                    coded_pass::<B, H, 1, true, HEAD_MAJOR>(&lut, &pass, j, start, end);
                }
            }
            for j in 0..sign_chunks {
                let mut r = [_mm256_setzero_ps(); 4];
                for (h, v) in r.iter_mut().enumerate().take(H) {
                    *v = _mm256_loadu_ps(ps.add(h * m + 8 * j));
                }
                let shift = shifts[j % 4];
                for i in start..end {
                    let word = *words.add(i * rw + run.sign_offset + j / 4);
                    let z = sign_vector(_mm256_set1_epi32(word as i32), shift);
                    let wi = sw.add(i * heads + first);
                    for (h, v) in r.iter_mut().enumerate().take(H) {
                        *v = _mm256_fmadd_ps(_mm256_set1_ps(*wi.add(h)), z, *v);
                    }
                }
                for (h, v) in r.iter().enumerate().take(H) {
                    _mm256_storeu_ps(ps.add(h * m + 8 * j), *v);
                }
            }
            start = end;
        }
    }
    if 8 * full < d || 8 * sign_chunks < m {
        for (i, record) in run.words.chunks_exact(rw).enumerate() {
            for h in 0..H {
                let row = (first + h) * d;
                let weight = if HEAD_MAJOR {
                    code_weights[(first + h) * weight_stride + i] * run.scales[i * run.scale_stride]
                } else {
                    code_weights[i * heads + first + h]
                };
                for j in 8 * full..d {
                    acc[row + j] +=
                        weight * run.centroids[code_at(&record[run.code_offset..], b, j)];
                }
                if m > 0 {
                    let row = (first + h) * m;
                    let weight = sign_weights[i * heads + first + h];
                    let signs = &record[run.sign_offset..];
                    for j in 8 * sign_chunks..m {
                        sign_acc[row + j] += weight * sign_at(signs, j);
                    }
                }
            }
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
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

#[target_feature(enable = "avx2,fma,f16c")]
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
    let full = d / 8;
    let sub = (L1_BYTES / stride).max(1);
    let sets = value_sets(H);
    // SAFETY: record `i < n` starts at byte `i·stride`, its vector `4·offset` bytes later and
    // holds `d` values, chunks stay below `8·full ≤ d`; weights are read at
    // `i·heads + first + h < n·heads`; accumulator rows `first + h < heads` hold `d` floats.
    unsafe {
        let pass = Pass {
            base: run.words.as_ptr().add(run.offset) as *const u8,
            stride,
            bytes: 4 * (rw - run.offset),
            weights: weights.as_ptr().add(first),
            heads,
            acc: acc.as_mut_ptr().add(first * d),
            d,
            weight_stride: 0,
            norms: std::ptr::null(),
            norm_stride: 0,
        };
        let mut start = 0;
        while start < n {
            let end = n.min(start + sub);
            let mut j = 0;
            while j + sets <= full {
                match sets {
                    2 => plain_pass::<F16, H, 2>(&pass, j, start, end),
                    3 => plain_pass::<F16, H, 3>(&pass, j, start, end),
                    _ => plain_pass::<F16, H, 4>(&pass, j, start, end),
                }
                j += sets;
            }
            for j in j..full {
                plain_pass::<F16, H, 1>(&pass, j, start, end);
            }
            start = end;
        }
    }
    if 8 * full < d {
        for (i, record) in run.words.chunks_exact(rw).enumerate() {
            for h in 0..H {
                let weight = weights[i * heads + first + h];
                for j in 8 * full..d {
                    // One rounding, as the vector lanes and every other path.
                    let a = &mut acc[(first + h) * d + j];
                    *a = weight.mul_add(plain_at::<F16>(&record[run.offset..], j), *a);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{CodedRun, Isa, KeyQueries};
    use super::{FLAT_LOOP, score_parts};

    fn floats(len: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..len)
            .map(|_| {
                s = s
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
            })
            .collect()
    }

    /// The unrolled loops of the presets' layouts give the general loop's bits, for every
    /// layout `score_flat_layouts` takes, 1–9 heads (tiles of 1–4) and token counts around the
    /// batches of eight. Mutations of a chunk offset, a part's scale or the flush order fail it.
    #[test]
    fn flat_layouts_match_the_general_loop() {
        if !Isa::Avx2.is_available() {
            return;
        }
        let layouts: [&[(u8, usize)]; 12] = [
            &[(4, 64)],
            &[(4, 128)],
            &[(3, 64)],
            &[(3, 128)],
            &[(2, 64)],
            &[(2, 128)],
            &[(4, 16), (3, 48)],
            &[(4, 32), (3, 96)],
            &[(4, 64), (3, 192)],
            &[(3, 16), (2, 48)],
            &[(3, 32), (2, 96)],
            &[(3, 64), (2, 192)],
        ];
        for (l, parts) in layouts.iter().enumerate() {
            for heads in [1usize, 3, 5, 9] {
                for n in [1usize, 7, 8, 9, 33] {
                    let seed = (l * 1000 + heads * 100 + n) as u64;
                    let mut offsets = Vec::new();
                    let mut record_words = 0;
                    for &(b, d) in parts.iter() {
                        offsets.push(record_words);
                        record_words += (d * b as usize).div_ceil(32);
                    }
                    let words: Vec<u32> = floats(n * record_words, seed)
                        .iter()
                        .map(|x| x.to_bits().rotate_left(9))
                        .collect();
                    let scales: Vec<f32> = floats(n * parts.len(), seed ^ 1)
                        .iter()
                        .map(|v| 1.5 + v)
                        .collect();
                    let centroids: Vec<Vec<f32>> = parts
                        .iter()
                        .enumerate()
                        .map(|(k, &(b, _))| floats(1 << b, seed ^ (2 + k as u64)))
                        .collect();
                    let runs: Vec<CodedRun<'_>> = parts
                        .iter()
                        .enumerate()
                        .map(|(k, &(b, d))| CodedRun {
                            words: &words,
                            record_words,
                            code_offset: offsets[k],
                            bits: b,
                            dim: d,
                            centroids: &centroids[k],
                            sign_offset: record_words,
                            sketch_dim: 0,
                            scales: &scales[k..],
                            scale_stride: parts.len(),
                        })
                        .collect();
                    let keys: Vec<KeyQueries> = parts
                        .iter()
                        .enumerate()
                        .map(|(k, &(_, d))| {
                            let q = floats(heads * d, seed ^ (8 + k as u64));
                            KeyQueries::new(Isa::Avx2, q, Vec::new(), d, 0, false)
                        })
                        .collect();
                    let refs: Vec<&KeyQueries> = keys.iter().collect();
                    let stride = n + 1;
                    let out0 = floats(heads * stride, seed ^ 16);
                    let run = |flat: bool| {
                        FLAT_LOOP.set(flat);
                        let mut out = out0.clone();
                        // SAFETY: AVX2 is available; the runs share their records, each
                        // query set matches its run, and `out` holds `heads` rows of `stride`.
                        unsafe { score_parts(&runs, &refs, &mut out, stride) };
                        FLAT_LOOP.set(true);
                        out.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
                    };
                    assert_eq!(
                        run(true),
                        run(false),
                        "{parts:?}, {heads} heads, {n} tokens"
                    );
                }
            }
        }
    }
}
