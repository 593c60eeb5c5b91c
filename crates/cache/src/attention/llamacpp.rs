//! Attention with the arithmetic of llama.cpp's CPU flash-attention kernel, for f16 caches.
//!
//! The reference engine's greedy outputs are the ground truth the model runner is tested
//! against, and greedy decoding flips on near-ties, so the baseline must round where that
//! engine rounds: the query is converted to f16 before the dot products with the f16 keys,
//! scores are `scale·⟨q₁₆, k⟩`, and the value accumulator itself is kept in f16 through an
//! online softmax that visits tokens in order (`acc ← f16(acc·e^{m_old−m_new})`, then
//! `acc ← f16(acc + v·e^{s−m})` per token), its denominator updated with one fused
//! multiply-add (`S ← fma(S, e^{m_old−m_new}, e^{s−m})`, as the compiler fuses ggml's C). Only f16 key and value streams without sinks or a
//! recent window qualify; anything else is refused — this kernel exists to reproduce one
//! engine's f16 baseline, not to serve compressed caches.

use half::f16;
use rayon::prelude::*;

use super::{AttentionShape, check_shapes};
use crate::error::CacheError;
use crate::kv_cache::KvCache;
use crate::token_codec::TokenCodec;

/// Which build of the reference engine the kernel rounds like: its SIMD width decides the f16
/// dot's summation order and whether the value accumulator is updated with f32 or native f16
/// arithmetic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum LlamaCppBuild {
    /// An AVX2 build (the SmolLM2 reference data).
    Avx2,
    /// A `-march=native` build on a CPU with AVX512-FP16 (the Gemma 3 reference data).
    Avx512Fp16,
}

/// `⟨q, k⟩` summed as ggml's AVX-512 `ggml_vec_dot_f16` sums: four 16-lane FMA accumulators
/// over steps of 64, reduced `(0+2)+(1+3)`, the 16 lanes folded as GCC's
/// `_mm512_reduce_add_ps` does (`h[i] = x[i+8]+x[i]`, `q[i] = h[i+4]+h[i]`,
/// `(q0+q2)+(q1+q3)`), and the tail added one by one in f64.
fn ggml_dot_f16_avx512(q: &[f32], k: &[f32]) -> f32 {
    let n = q.len();
    let steps = n / 64;
    let mut acc = [[0.0f32; 16]; 4];
    for step in 0..steps {
        for (j, lanes) in acc.iter_mut().enumerate() {
            for (l, lane) in lanes.iter_mut().enumerate() {
                let i = step * 64 + j * 16 + l;
                *lane = q[i].mul_add(k[i], *lane);
            }
        }
    }
    let add = |a: [f32; 16], b: [f32; 16]| -> [f32; 16] { std::array::from_fn(|l| a[l] + b[l]) };
    let x = add(add(acc[0], acc[2]), add(acc[1], acc[3]));
    let h: [f32; 8] = std::array::from_fn(|i| x[i + 8] + x[i]);
    let q4: [f32; 4] = std::array::from_fn(|i| h[i + 4] + h[i]);
    let mut sum = f64::from((q4[0] + q4[2]) + (q4[1] + q4[3]));
    for i in steps * 64..n {
        sum += f64::from(q[i] * k[i]);
    }
    sum as f32
}

/// `⟨q, k⟩` summed as ggml's AVX2 `ggml_vec_dot_f16` sums: four 8-lane FMA accumulators over
/// steps of 32, reduced pairwise (0+2, 1+3, then 0+1), the 8 lanes folded as
/// `((l0+h0)+(l1+h1)) + ((l2+h2)+(l3+h3))`, and the tail added one by one.
fn ggml_dot_f16(q: &[f32], k: &[f32]) -> f32 {
    let n = q.len();
    let steps = n / 32;
    let mut acc = [[0.0f32; 8]; 4];
    for step in 0..steps {
        for (j, lanes) in acc.iter_mut().enumerate() {
            for (l, lane) in lanes.iter_mut().enumerate() {
                let i = step * 32 + j * 8 + l;
                *lane = q[i].mul_add(k[i], *lane);
            }
        }
    }
    let add = |a: [f32; 8], b: [f32; 8]| -> [f32; 8] { std::array::from_fn(|l| a[l] + b[l]) };
    let x0 = add(add(acc[0], acc[2]), add(acc[1], acc[3]));
    let quad: [f32; 4] = std::array::from_fn(|l| x0[l] + x0[l + 4]);
    let mut sum = f64::from((quad[0] + quad[1]) + (quad[2] + quad[3]));
    for i in steps * 32..n {
        sum += f64::from(q[i] * k[i]);
    }
    sum as f32
}

fn f16_row(record: &[u32], out: &mut [f32]) {
    for (i, o) in out.iter_mut().enumerate() {
        let w = record[i / 2];
        let half = if i % 2 == 0 { w & 0xFFFF } else { w >> 16 };
        *o = f16::from_bits(half as u16).to_f32();
    }
}

/// llama.cpp-compatible attention over an all-f16 cache (see the module docs), in the stored
/// domain: the value means of centered streams are added by [`attend`](super::attend), through
/// which the public [`llamacpp_f16_attention`](super::llamacpp_f16_attention) runs.
pub(super) fn run(
    cache: &KvCache,
    queries: &[f32],
    query_positions: &[u32],
    shape: AttentionShape,
    build: LlamaCppBuild,
    out: &mut [f32],
) -> Result<(), CacheError> {
    let (_, group) = check_shapes(cache, queries, query_positions, shape, out)?;
    let layout = cache.layout();
    for h in 0..layout.kv_heads {
        for stream in [cache.keys(h), cache.values(h)] {
            let plain = matches!(stream.codec(), TokenCodec::F16 { .. })
                && stream.sink_end() == 0
                && stream.recent_start() == stream.len();
            if !plain {
                return Err(CacheError::InvalidConfig(
                    "the llama.cpp-compatible kernel needs f16 streams without sinks or recent windows"
                        .into(),
                ));
            }
            if stream.center().turns_with_position() {
                return Err(CacheError::InvalidConfig(
                    "the llama.cpp-compatible kernel cannot add back a RoPE-aware key center \
                     (center = \"rope\"); use the fused or reference kernel"
                        .into(),
                ));
            }
        }
    }
    let d = layout.head_dim;
    let q_heads = shape.q_heads;
    #[cfg(target_arch = "x86_64")]
    let fast = d.is_multiple_of(8) && crate::attention::simd::Isa::Avx2.is_available();
    out.par_chunks_mut(d)
        .enumerate()
        .try_for_each(|(row, o)| -> Result<(), CacheError> {
            let (i, h) = (row / q_heads, row % q_heads);
            let kv = h / group;
            let q: Vec<f32> = queries[row * d..(row + 1) * d]
                .iter()
                .map(|v| f16::from_f32(*v).to_f32())
                .collect();
            let rows = Rows {
                keys: cache.keys(kv),
                values: cache.values(kv),
                range: cache.visible(query_positions[i]),
            };
            if build == LlamaCppBuild::Avx512Fp16 {
                return row_avx512fp16(&q, &rows, shape.scale, o);
            }
            #[cfg(target_arch = "x86_64")]
            if fast {
                // SAFETY: `fast` holds only where AVX2, FMA and F16C were detected at run
                // time and d is a multiple of 8, which `x86::row` requires.
                return unsafe { x86::row(&q, &rows, shape.scale, o) };
            }
            row_scalar(&q, &rows, shape.scale, o)
        })
}

/// The visible tokens of one KV head: its f16 key and value streams and the token range.
struct Rows<'a> {
    keys: &'a crate::stream::Stream,
    values: &'a crate::stream::Stream,
    range: std::ops::Range<usize>,
}

impl<'a> Rows<'a> {
    /// The f16 key and value records of token `t` (two f16 per `u32`, low half first).
    fn records(&self, t: usize) -> Result<(&[u32], &[u32]), CacheError> {
        let missing = || CacheError::InvalidConfig("token missing".into());
        // f16 records are rows, borrowed from the store.
        let borrowed = |record: std::borrow::Cow<'a, [u32]>| match record {
            std::borrow::Cow::Borrowed(words) => Some(words),
            std::borrow::Cow::Owned(_) => None,
        };
        let (_, k, _) = self.keys.token(t).ok_or_else(missing)?;
        let (_, v, _) = self.values.token(t).ok_or_else(missing)?;
        Ok((
            borrowed(k).ok_or_else(missing)?,
            borrowed(v).ok_or_else(missing)?,
        ))
    }
}

/// One query row, scalar: the definition the SIMD path is tested against bit for bit.
fn row_scalar(q: &[f32], rows: &Rows<'_>, scale: f32, o: &mut [f32]) -> Result<(), CacheError> {
    let d = q.len();
    let mut k = vec![0.0f32; d];
    let mut v = vec![0.0f32; d];
    let mut acc = vec![f16::ZERO; d];
    let (mut max, mut sum) = (f32::NEG_INFINITY, 0.0f32);
    for t in rows.range.clone() {
        let (k_record, v_record) = rows.records(t)?;
        f16_row(k_record, &mut k);
        let s = ggml_dot_f16(q, &k) * scale;
        let old = max;
        let mut rescale = 1.0f32;
        let weight;
        if s > max {
            max = s;
            rescale = (old - max).exp();
            for a in acc.iter_mut() {
                *a = f16::from_f32(a.to_f32() * rescale);
            }
            weight = 1.0;
        } else {
            weight = (s - max).exp();
        }
        f16_row(v_record, &mut v);
        for (a, x) in acc.iter_mut().zip(&v) {
            *a = f16::from_f32(x.mul_add(weight, a.to_f32()));
        }
        // ggml writes `S = S*ms + vs;`, which GCC (its default `-ffp-contract=fast`
        // with FMA enabled by `-march=native`) compiles to one fused multiply-add.
        // Rounding the product separately flips two of the four reference
        // continuations at near-ties.
        sum = sum.mul_add(rescale, weight);
    }
    let inv = if sum > 0.0 { 1.0 / sum } else { 0.0 };
    for (o, a) in o.iter_mut().zip(&acc) {
        *o = a.to_f32() * inv;
    }
    Ok(())
}

/// `x·w + a` rounded once to f16 (`_mm512_fmadd_ph`), for `x`, `w` holding f16 values.
///
/// The product is exact in f64 and so is the sum unless the addends lie more than ~30 binades
/// apart, when the smaller one cannot move the f16 result. The f64 value is narrowed to f32 by
/// rounding to odd (truncate, then set the last bit if anything was dropped), which keeps the
/// information a second rounding needs: f32 has more than two bits beyond f16's precision, so
/// the final f32 → f16 rounding (nearest even) equals one rounding of the exact value. (A plain
/// f64 → f32 → f16 chain, which is what a conversion through f32 does, rounds twice.)
fn f16_fma(x: f32, w: f32, a: f16) -> f16 {
    let exact = f64::from(x).mul_add(f64::from(w), f64::from(a.to_f32()));
    let mut narrow = exact as f32;
    if f64::from(narrow).abs() > exact.abs() {
        narrow = f32::from_bits(narrow.to_bits() - 1);
    }
    if f64::from(narrow) != exact {
        narrow = f32::from_bits(narrow.to_bits() | 1);
    }
    f16::from_f32(narrow)
}

/// Values per step of the AVX512-FP16 build's f16 vector loops (`GGML_F16_STEP`): elements
/// below the last whole step use native f16 arithmetic, the rest ggml's scalar leftovers.
const FP16_STEP: usize = 128;

/// One query row as the AVX512-FP16 build computes it. The score is
/// [`ggml_dot_f16_avx512`]; the value accumulator is updated with native f16 arithmetic
/// (`_mm512_fmadd_ph` / `_mm512_mul_ph`), so the softmax weight is first rounded to f16 and
/// each update rounds once, from the exact result, to f16 ([`f16_fma`]). Elements past the last whole step of 128 take ggml's scalar leftover loop instead
/// (`f16(y + x·w)` with the weight in f32, contracted to one f32 FMA by the compiler).
fn row_avx512fp16(q: &[f32], rows: &Rows<'_>, scale: f32, o: &mut [f32]) -> Result<(), CacheError> {
    let d = q.len();
    let simd = d - d % FP16_STEP;
    let mut k = vec![0.0f32; d];
    let mut v = vec![0.0f32; d];
    let mut acc = vec![f16::ZERO; d];
    let (mut max, mut sum) = (f32::NEG_INFINITY, 0.0f32);
    for t in rows.range.clone() {
        let (k_record, v_record) = rows.records(t)?;
        f16_row(k_record, &mut k);
        let s = ggml_dot_f16_avx512(q, &k) * scale;
        let old = max;
        let mut rescale = 1.0f32;
        let weight;
        if s > max {
            max = s;
            rescale = (old - max).exp();
            let r16 = f16::from_f32(rescale).to_f32();
            for (i, a) in acc.iter_mut().enumerate() {
                let r = if i < simd { r16 } else { rescale };
                *a = f16::from_f32(a.to_f32() * r);
            }
            weight = 1.0;
        } else {
            weight = (s - max).exp();
        }
        f16_row(v_record, &mut v);
        let w16 = f16::from_f32(weight).to_f32();
        for (i, (a, x)) in acc.iter_mut().zip(&v).enumerate() {
            *a = if i < simd {
                f16_fma(*x, w16, *a)
            } else {
                f16::from_f32(x.mul_add(weight, a.to_f32()))
            };
        }
        sum = sum.mul_add(rescale, weight);
    }
    let inv = if sum > 0.0 { 1.0 / sum } else { 0.0 };
    for (o, a) in o.iter_mut().zip(&acc) {
        *o = a.to_f32() * inv;
    }
    Ok(())
}

/// The same arithmetic as [`row_scalar`] eight lanes at a time (AVX2 + FMA + F16C): ggml's
/// dot already sums in 8-lane FMA accumulators, and F16C's conversions round to nearest
/// even exactly as `half` does, so every operation and its order are unchanged — ~8x faster,
/// which is what lets the perplexity protocol run this kernel over whole texts.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{CacheError, Rows};

    /// Eight f16 at `words[i / 2..]` (`i` a multiple of 8) as f32.
    ///
    /// # Safety
    /// F16C must be available and `words` must hold at least `i / 2 + 4` words.
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn load8(words: &[u32], i: usize) -> __m256 {
        debug_assert!(words.len() >= i / 2 + 4);
        // SAFETY: the caller guarantees 4 words (8 halves, 16 bytes) from `i / 2`;
        // `loadu` has no alignment requirement.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(words.as_ptr().add(i / 2).cast())) }
    }

    /// f32 lanes rounded to f16 (nearest even) and back.
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    fn round_f16(x: __m256) -> __m256 {
        _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x))
    }

    /// `ggml_dot_f16` of `q` with the f16 `record`: four 8-lane FMA accumulators over steps
    /// of 32, reduced `(0+2)+(1+3)`, folded `((l0+h0)+(l1+h1))+((l2+h2)+(l3+h3))`, the tail
    /// (multiples of 8 below 32) added one product at a time in f64 as the scalar path does.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot(q: &[f32], record: &[u32]) -> f32 {
        let n = q.len();
        let steps = n / 32;
        let mut acc = [_mm256_setzero_ps(); 4];
        for step in 0..steps {
            for (j, a) in acc.iter_mut().enumerate() {
                let i = step * 32 + j * 8;
                // SAFETY: i + 8 <= n and the record holds n halves.
                let (qv, kv) = unsafe { (_mm256_loadu_ps(q.as_ptr().add(i)), load8(record, i)) };
                *a = _mm256_fmadd_ps(qv, kv, *a);
            }
        }
        let x0 = _mm256_add_ps(_mm256_add_ps(acc[0], acc[2]), _mm256_add_ps(acc[1], acc[3]));
        let quad = _mm_add_ps(_mm256_castps256_ps128(x0), _mm256_extractf128_ps::<1>(x0));
        let mut lanes = [0.0f32; 4];
        // SAFETY: `lanes` holds four f32.
        unsafe { _mm_storeu_ps(lanes.as_mut_ptr(), quad) };
        let mut sum = f64::from((lanes[0] + lanes[1]) + (lanes[2] + lanes[3]));
        for i in (steps * 32..n).step_by(8) {
            let mut k = [0.0f32; 8];
            // SAFETY: i + 8 <= n halves in the record; `k` holds eight f32.
            unsafe { _mm256_storeu_ps(k.as_mut_ptr(), load8(record, i)) };
            for (l, kl) in k.iter().enumerate() {
                sum += f64::from(q[i + l] * kl);
            }
        }
        sum as f32
    }

    /// One query row (see [`super::row_scalar`]).
    ///
    /// # Safety
    /// AVX2, FMA and F16C must be available and `q.len()` (the head dimension) a multiple of 8.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn row(
        q: &[f32],
        rows: &Rows<'_>,
        scale: f32,
        o: &mut [f32],
    ) -> Result<(), CacheError> {
        let d = q.len();
        let mut acc = vec![0.0f32; d];
        let (mut max, mut sum) = (f32::NEG_INFINITY, 0.0f32);
        for t in rows.range.clone() {
            let (k_record, v_record) = rows.records(t)?;
            if k_record.len() * 2 < d || v_record.len() * 2 < d {
                return Err(CacheError::InvalidConfig("short f16 record".into()));
            }
            // SAFETY: the record holds d halves (checked above), d a multiple of 8.
            let s = unsafe { dot(q, k_record) } * scale;
            let mut rescale = 1.0f32;
            let weight;
            if s > max {
                rescale = (max - s).exp();
                max = s;
                let r = _mm256_set1_ps(rescale);
                for i in (0..d).step_by(8) {
                    // SAFETY: i + 8 <= d = acc.len().
                    unsafe {
                        let a = _mm256_loadu_ps(acc.as_ptr().add(i));
                        _mm256_storeu_ps(acc.as_mut_ptr().add(i), round_f16(_mm256_mul_ps(a, r)));
                    }
                }
                weight = 1.0;
            } else {
                weight = (s - max).exp();
            }
            let w = _mm256_set1_ps(weight);
            for i in (0..d).step_by(8) {
                // SAFETY: i + 8 <= d = acc.len() and the record holds d halves.
                unsafe {
                    let a = _mm256_loadu_ps(acc.as_ptr().add(i));
                    let v = load8(v_record, i);
                    _mm256_storeu_ps(acc.as_mut_ptr().add(i), round_f16(_mm256_fmadd_ps(v, w, a)));
                }
            }
            sum = sum.mul_add(rescale, weight);
        }
        let inv = if sum > 0.0 { 1.0 / sum } else { 0.0 };
        for (o, a) in o.iter_mut().zip(&acc) {
            *o = a * inv;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha20Rng;

    use super::*;

    /// The SIMD row equals the scalar definition bit for bit (the public kernel tests compare
    /// whichever path this CPU takes with a transcription of ggml's loop; this pins the other
    /// one): head dimensions with and without a tail below 32, scores spread wide enough that
    /// the running maximum changes often, and some f16 subnormals in the values.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn simd_row_equals_scalar_row() {
        use crate::kv_cache::{KvKind, KvLayout, uniform_streams};
        use crate::token_store::Growth;
        if crate::attention::simd::Isa::Avx2.is_available() {
            for (d, seed) in [(64usize, 1u64), (40, 2), (256, 3), (8, 4)] {
                let layout = KvLayout {
                    kv_heads: 1,
                    head_dim: d,
                    kind: KvKind::Growing {
                        growth: Growth::Static { capacity: 300 },
                    },
                    max_rewind: 0,
                    rope_pairs: crate::basis::RopePairs::Adjacent,
                    rope_base: Default::default(),
                };
                let streams = uniform_streams(&layout, crate::CodecSpec::F16 { dim: d });
                let mut cache = KvCache::new(layout, &streams, &streams).unwrap();
                let mut rng = ChaCha20Rng::seed_from_u64(seed);
                let n = 300;
                let keys: Vec<f32> = (0..n * d).map(|_| rng.random_range(-4.0..4.0)).collect();
                let values: Vec<f32> = (0..n * d)
                    .map(|i| {
                        let v: f32 = rng.random_range(-3.0..3.0);
                        if i % 17 == 0 { v * 1e-6 } else { v }
                    })
                    .collect();
                let positions: Vec<u32> = (0..n as u32).collect();
                cache.append(&keys, &values, &positions).unwrap();
                for trial in 0..20 {
                    let q: Vec<f32> = (0..d)
                        .map(|_| f16::from_f32(rng.random_range(-2.0..2.0)).to_f32())
                        .collect();
                    let rows = Rows {
                        keys: cache.keys(0),
                        values: cache.values(0),
                        range: 0..(1 + trial * 15).min(n),
                    };
                    let (mut a, mut b) = (vec![0.0f32; d], vec![0.0f32; d]);
                    row_scalar(&q, &rows, 0.7, &mut a).unwrap();
                    // SAFETY: AVX2, FMA and F16C were detected; d is a multiple of 8.
                    unsafe { x86::row(&q, &rows, 0.7, &mut b) }.unwrap();
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&a), bits(&b), "d {d} trial {trial}");
                }
            }
        }
    }

    /// `f16_fma` is one rounding of the exact `x·w + a` (ties to even), checked against exact
    /// integer arithmetic (every f16 is an integer times 2⁻²⁴, so the sum is an integer times
    /// 2⁻⁴⁸) over random operands spanning normal and subnormal f16 values; a double rounding
    /// through f32 fails this on about one case in a few thousand, so 200 000 cases catch it.
    #[test]
    fn f16_fma_rounds_once() {
        let units = |h: f16| -> i128 { (f64::from(h.to_f32()) * 2f64.powi(24)) as i128 };
        let mut rng = ChaCha20Rng::seed_from_u64(7);
        let random = |rng: &mut ChaCha20Rng, lo: i32, hi: i32| -> f16 {
            let m: f32 = rng.random_range(1.0..2.0);
            let e = rng.random_range(lo..hi);
            let sign = if rng.random_bool(0.5) { -1.0 } else { 1.0 };
            f16::from_f32(sign * m * 2f32.powi(e))
        };
        for _ in 0..200_000 {
            let (x, w) = (random(&mut rng, -12, 4), random(&mut rng, -12, 2));
            let a = random(&mut rng, -26, 6);
            let got = f16_fma(x.to_f32(), w.to_f32(), a);
            let exact = units(x) * units(w) + units(a) * (1i128 << 24);
            let dist = |h: f16| (exact - units(h) * (1i128 << 24)).abs();
            let neighbours = [got.to_bits().wrapping_sub(1), got.to_bits().wrapping_add(1)];
            for n in neighbours
                .map(f16::from_bits)
                .into_iter()
                .filter(|n| n.is_finite())
            {
                if (n.to_f32() > 0.0) != (got.to_f32() > 0.0) && got.to_f32() != 0.0 {
                    continue;
                }
                assert!(
                    dist(got) < dist(n)
                        || (dist(got) == dist(n) && got.to_bits().is_multiple_of(2)),
                    "{x}·{w} + {a}: got {got}, {n} is nearer"
                );
            }
        }
    }

    /// The AVX-512 order sums the same products as the AVX2 one, differently grouped: both are
    /// within the dot's rounding bound of the exact sum, and they do differ on some inputs
    /// (which is why a kernel per engine build exists).
    #[test]
    fn avx512_and_avx2_dot_orders_are_both_exact_up_to_rounding() {
        let mut rng = ChaCha20Rng::seed_from_u64(11);
        let mut differ = 0;
        for _ in 0..2000 {
            let q: Vec<f32> = (0..256)
                .map(|_| f16::from_f32(rng.random_range(-2.0..2.0)).to_f32())
                .collect();
            let k: Vec<f32> = (0..256)
                .map(|_| f16::from_f32(rng.random_range(-2.0..2.0)).to_f32())
                .collect();
            let exact: f64 = q
                .iter()
                .zip(&k)
                .map(|(a, b)| f64::from(*a) * f64::from(*b))
                .sum();
            let mag: f64 = q
                .iter()
                .zip(&k)
                .map(|(a, b)| (f64::from(*a) * f64::from(*b)).abs())
                .sum();
            let bound = 16.0 * 2f64.powi(-24) * mag;
            let (a, b) = (ggml_dot_f16(&q, &k), ggml_dot_f16_avx512(&q, &k));
            assert!((f64::from(a) - exact).abs() <= bound && (f64::from(b) - exact).abs() <= bound);
            differ += usize::from(a != b);
        }
        assert!(differ > 100, "the orders differ on {differ} of 2000 inputs");
    }
}
