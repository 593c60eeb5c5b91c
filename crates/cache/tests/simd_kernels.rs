//! The run kernels of `attention::simd` (scoring and accumulating runs of records) against the
//! scalar reference, on every instruction set this CPU runs.
//!
//! Inputs are random: code words (so every code value and random padding bits), sign words,
//! scales, queries, weights; dimensions that are and are not multiples of 8 (and of 16), every
//! bit width 1..=8, 1..=9 query heads (tiles of up to four), records with codes at an offset (a
//! second tier) and sign words after them, f16 and f32 records, with and without sign tables.
//!
//! Tolerance: a score is `norm·Σ q·c + γ·Σ ±w`; each path's result lies within
//! `γ_n·(|norm|·Σ|q·c| + |γ|·Σ|w|)` of the exact value (`n` terms plus the lane reductions; the
//! sign tables add up to 8 more roundings per entry), so two paths differ by at most twice
//! that, with `n = d + m + 24`. Accumulators likewise per coordinate over the tokens. A wrong
//! code, lane, head, sign or scale moves results by whole terms, far above these bounds.
//! Plain (f16/f32) records are stricter: every path sums them in one order, so they must match
//! the scalar path bit for bit, and the scalar path is held to the bound against exact sums.

use half::f16;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};
use tq_cache::attention::simd::{self, CodedRun, Isa, KeyQueries, PlainKind, PlainRun};

const U: f64 = 1.0 / (1u64 << 24) as f64;

fn config(cases: u32) -> Config {
    Config {
        cases,
        rng_seed: RngSeed::Fixed(0x51AD_0002),
        failure_persistence: None,
        ..Config::default()
    }
}

fn vector_isas() -> Vec<Isa> {
    Isa::available()
        .into_iter()
        .filter(|&isa| isa != Isa::Scalar)
        .collect()
}

fn gamma(n: usize) -> f64 {
    let n = n as f64;
    n * U / (1.0 - n * U)
}

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

fn words(len: usize, seed: u64) -> Vec<u32> {
    let mut s = seed.wrapping_mul(0xD1B5_4A32_D192_ED03) | 1;
    (0..len)
        .map(|_| {
            s = s
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (s >> 32) as u32
        })
        .collect()
}

fn code_at(words: &[u32], bits: usize, j: usize) -> usize {
    let bit = j * bits;
    let mut x = u64::from(words[bit / 32]) >> (bit % 32);
    if bit % 32 + bits > 32 {
        x |= u64::from(words[bit / 32 + 1]) << (32 - bit % 32);
    }
    (x as usize) & ((1 << bits) - 1)
}

fn sign_at(words: &[u32], j: usize) -> f64 {
    if (words[j / 32] >> (j % 32)) & 1 == 1 {
        1.0
    } else {
        -1.0
    }
}

/// A random coded run: `n` records of `[padding][codes][signs][padding]`.
struct Coded {
    words: Vec<u32>,
    record_words: usize,
    code_offset: usize,
    sign_offset: usize,
    bits: u8,
    dim: usize,
    sketch_dim: usize,
    centroids: Vec<f32>,
    scales: Vec<f32>,
    scale_stride: usize,
}

impl Coded {
    fn new(n: usize, dim: usize, bits: u8, sketch_dim: usize, offset: usize, seed: u64) -> Self {
        let code_words = (dim * bits as usize).div_ceil(32);
        let sign_offset = offset + code_words;
        let record_words = sign_offset + sketch_dim.div_ceil(32) + (seed % 2) as usize;
        let spt = if sketch_dim > 0 { 2 } else { 1 };
        // Odd seeds interleave the scales with another part's (a stride past the run's own).
        let scale_stride = spt + (seed % 2) as usize;
        Self {
            words: words(n * record_words, seed),
            record_words,
            code_offset: offset,
            sign_offset,
            bits,
            dim,
            sketch_dim,
            centroids: floats(1 << bits, seed ^ 1),
            scales: floats(n * scale_stride, seed ^ 2)
                .iter()
                .map(|v| 1.5 + v)
                .collect(),
            scale_stride,
        }
    }

    fn run(&self) -> CodedRun<'_> {
        CodedRun {
            words: &self.words,
            record_words: self.record_words,
            code_offset: self.code_offset,
            bits: self.bits,
            dim: self.dim,
            centroids: &self.centroids,
            sign_offset: self.sign_offset,
            sketch_dim: self.sketch_dim,
            scales: &self.scales,
            scale_stride: self.scale_stride,
        }
    }

    fn record(&self, i: usize) -> &[u32] {
        &self.words[i * self.record_words..(i + 1) * self.record_words]
    }

    fn centroid(&self, i: usize, j: usize) -> f64 {
        let codes = &self.record(i)[self.code_offset..];
        f64::from(self.centroids[code_at(codes, self.bits as usize, j)])
    }

    fn sign(&self, i: usize, j: usize) -> f64 {
        sign_at(&self.record(i)[self.sign_offset..], j)
    }
}

fn check_close(isa: Isa, what: &str, got: &[f32], reference: &[f32], bounds: &[f64]) {
    for (k, ((g, r), b)) in got.iter().zip(reference).zip(bounds).enumerate() {
        assert!(
            (f64::from(*g) - f64::from(*r)).abs() <= *b,
            "{isa:?} {what}[{k}]: {g} vs scalar {r} (bound {b:e})"
        );
    }
}

proptest! {
    #![proptest_config(config(160))]

    /// Scores of coded runs: every bit width, with and without QJL signs and sign tables.
    #[test]
    fn score_coded_matches_scalar(
        dim in prop_oneof![1usize..40, Just(64), Just(96), Just(128), 120usize..200],
        bits in 1u8..=8,
        heads in 1usize..=9,
        n in 1usize..24,
        prod in any::<bool>(),
        extra_sketch in 0usize..3,
        offset in 0usize..3,
        tables in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let m = if prod { dim + extra_sketch } else { 0 };
        let coded = Coded::new(n, dim, bits, m, offset, seed);
        let queries = floats(heads * dim, seed ^ 3);
        let sketch = if prod { floats(heads * m, seed ^ 4) } else { Vec::new() };
        let stride = n + (seed % 3) as usize;
        let out0 = floats(heads * stride, seed ^ 5);
        let scalar = KeyQueries::new(Isa::Scalar, queries.clone(), sketch.clone(), dim, m, tables);
        let mut reference = out0.clone();
        simd::score_coded(Isa::Scalar, &coded.run(), &scalar, &mut reference, stride);
        let ss = coded.scale_stride;
        let mut bounds = vec![0.0f64; out0.len()];
        for h in 0..heads {
            for i in 0..n {
                let norm = f64::from(coded.scales[i * ss]).abs();
                let codes: f64 = (0..dim)
                    .map(|j| (f64::from(queries[h * dim + j]) * coded.centroid(i, j)).abs())
                    .sum();
                let mut abs = norm * codes;
                if prod {
                    let g = f64::from(coded.scales[i * ss + 1]).abs();
                    abs += g * (0..m).map(|j| f64::from(sketch[h * m + j]).abs()).sum::<f64>();
                }
                let k = h * stride + i;
                bounds[k] = 2.0 * gamma(dim + m + 24) * abs + 4.0 * U * f64::from(out0[k]).abs();
            }
        }
        for isa in vector_isas() {
            let keys = KeyQueries::new(isa, queries.clone(), sketch.clone(), dim, m, tables);
            let mut got = out0.clone();
            simd::score_coded(isa, &coded.run(), &keys, &mut got, stride);
            check_close(isa, "score", &got, &reference, &bounds);
        }
        // Interleaved scales read through the stride score exactly as a compact copy does.
        let spt = if prod { 2 } else { 1 };
        let compact: Vec<f32> = coded.scales.chunks(coded.scale_stride).flat_map(|s| s[..spt].to_vec()).collect();
        let compact_run = CodedRun { scales: &compact, scale_stride: spt, ..coded.run() };
        for isa in Isa::available() {
            let keys = KeyQueries::new(isa, queries.clone(), sketch.clone(), dim, m, tables);
            let (mut strided, mut packed) = (out0.clone(), out0.clone());
            simd::score_coded(isa, &coded.run(), &keys, &mut strided, stride);
            simd::score_coded(isa, &compact_run, &keys, &mut packed, stride);
            prop_assert!(
                strided.iter().zip(&packed).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{:?}: strided scales score differently from compact ones", isa
            );
        }
    }

    /// Accumulating coded runs into the rotated and sketch domains.
    #[test]
    fn accumulate_coded_matches_scalar(
        dim in prop_oneof![1usize..40, Just(64), Just(128), 120usize..200],
        bits in 1u8..=8,
        heads in 1usize..=9,
        n in 1usize..40,
        prod in any::<bool>(),
        offset in 0usize..3,
        seed in any::<u64>(),
    ) {
        let m = if prod { dim } else { 0 };
        let coded = Coded::new(n, dim, bits, m, offset, seed);
        let weights = floats(n * heads, seed ^ 6);
        let sign_weights = if prod { floats(n * heads, seed ^ 7) } else { Vec::new() };
        let acc0 = floats(heads * dim, seed ^ 8);
        let sign0 = floats(heads * m, seed ^ 9);
        let (mut reference, mut reference_signs) = (acc0.clone(), sign0.clone());
        simd::accumulate_coded(
            Isa::Scalar, &coded.run(), &weights, &sign_weights, &mut reference, &mut reference_signs,
        );
        let mut bounds = vec![0.0f64; acc0.len()];
        let mut sign_bounds = vec![0.0f64; sign0.len()];
        for h in 0..heads {
            for j in 0..dim {
                let abs: f64 = (0..n)
                    .map(|i| (f64::from(weights[i * heads + h]) * coded.centroid(i, j)).abs())
                    .sum::<f64>()
                    + f64::from(acc0[h * dim + j]).abs();
                bounds[h * dim + j] = 2.0 * gamma(n + 2) * abs;
            }
            for j in 0..m {
                let abs: f64 = (0..n)
                    .map(|i| (f64::from(sign_weights[i * heads + h]) * coded.sign(i, j)).abs())
                    .sum::<f64>()
                    + f64::from(sign0[h * m + j]).abs();
                sign_bounds[h * m + j] = 2.0 * gamma(n + 2) * abs;
            }
        }
        for isa in vector_isas() {
            let (mut got, mut got_signs) = (acc0.clone(), sign0.clone());
            simd::accumulate_coded(isa, &coded.run(), &weights, &sign_weights, &mut got, &mut got_signs);
            check_close(isa, "values", &got, &reference, &bounds);
            check_close(isa, "signs", &got_signs, &reference_signs, &sign_bounds);
        }
    }

    /// Scores and accumulators of plain f16 / f32 records at an offset within the record: the
    /// scalar path within the rounding bound of the exact sums, and every vector path equal to
    /// it bit for bit (plain records sum in one order on every instruction set,
    /// `primitives::lane8_dot`; an AVX-512 lane pairing or reduction that strays from it shows
    /// as a last-bit difference on most records).
    #[test]
    fn plain_kernels_match_scalar_bit_for_bit(
        dim in prop_oneof![1usize..40, Just(64), Just(128), 120usize..200],
        f16_records in any::<bool>(),
        heads in 1usize..=9,
        n in 1usize..70,
        offset in 0usize..3,
        seed in any::<u64>(),
    ) {
        let kind = if f16_records { PlainKind::F16 } else { PlainKind::F32 };
        let record_words = offset + kind.record_words(dim) + (seed % 2) as usize;
        let values = floats(n * record_words * 2, seed);
        let mut packed = words(n * record_words, seed ^ 1);
        for i in 0..n {
            let record = &mut packed[i * record_words + offset..(i + 1) * record_words];
            for j in 0..dim {
                let v = values[i * dim + j] * 8.0;
                match kind {
                    PlainKind::F32 => record[j] = v.to_bits(),
                    PlainKind::F16 => {
                        let h = u32::from(f16::from_f32(v).to_bits());
                        let w = &mut record[j / 2];
                        *w = if j % 2 == 0 { (*w & 0xFFFF_0000) | h } else { (*w & 0xFFFF) | (h << 16) };
                    }
                }
            }
        }
        let value = |i: usize, j: usize| -> f64 {
            let record = &packed[i * record_words + offset..];
            match kind {
                PlainKind::F32 => f64::from(f32::from_bits(record[j])),
                PlainKind::F16 => {
                    let w = record[j / 2];
                    let h = if j.is_multiple_of(2) { w & 0xFFFF } else { w >> 16 };
                    f64::from(f16::from_bits(h as u16).to_f32())
                }
            }
        };
        let run = PlainRun { words: &packed, record_words, offset, kind, dim };
        let queries = floats(heads * dim, seed ^ 2);
        let stride = n + 1;
        let out0 = floats(heads * stride, seed ^ 3);
        let mut reference = out0.clone();
        simd::score_plain(Isa::Scalar, &run, &queries, &mut reference, stride);
        let mut bounds = vec![0.0f64; out0.len()];
        for h in 0..heads {
            for i in 0..n {
                let abs: f64 = (0..dim).map(|j| (f64::from(queries[h * dim + j]) * value(i, j)).abs()).sum();
                let k = h * stride + i;
                bounds[k] = 2.0 * gamma(dim + 24) * abs + 4.0 * U * f64::from(out0[k]).abs();
            }
        }
        let weights = floats(n * heads, seed ^ 4);
        let acc0 = floats(heads * dim, seed ^ 5);
        let mut reference_acc = acc0.clone();
        simd::accumulate_plain(Isa::Scalar, &run, &weights, &mut reference_acc);
        let mut acc_bounds = vec![0.0f64; acc0.len()];
        for h in 0..heads {
            for j in 0..dim {
                let abs: f64 = (0..n).map(|i| (f64::from(weights[i * heads + h]) * value(i, j)).abs()).sum::<f64>()
                    + f64::from(acc0[h * dim + j]).abs();
                acc_bounds[h * dim + j] = 2.0 * gamma(n + 2) * abs;
            }
        }
        let exact: Vec<f32> = (0..out0.len())
            .map(|k| {
                let (h, i) = (k / stride, k % stride);
                let dot: f64 = if i < n {
                    (0..dim).map(|j| f64::from(queries[h * dim + j]) * value(i, j)).sum()
                } else {
                    0.0
                };
                (f64::from(out0[k]) + dot) as f32
            })
            .collect();
        check_close(Isa::Scalar, "plain score vs exact", &reference, &exact, &bounds);
        let exact_acc: Vec<f32> = (0..acc0.len())
            .map(|k| {
                let (h, j) = (k / dim, k % dim);
                let sum: f64 = (0..n).map(|i| f64::from(weights[i * heads + h]) * value(i, j)).sum();
                (f64::from(acc0[k]) + sum) as f32
            })
            .collect();
        check_close(Isa::Scalar, "plain values vs exact", &reference_acc, &exact_acc, &acc_bounds);
        for isa in vector_isas() {
            let mut got = out0.clone();
            simd::score_plain(isa, &run, &queries, &mut got, stride);
            let same = got.iter().zip(&reference).all(|(a, b)| a.to_bits() == b.to_bits());
            prop_assert!(same, "{:?} plain scores differ from scalar (dim {}, heads {}, n {})", isa, dim, heads, n);
            let mut got_acc = acc0.clone();
            simd::accumulate_plain(isa, &run, &weights, &mut got_acc);
            let same = got_acc.iter().zip(&reference_acc).all(|(a, b)| a.to_bits() == b.to_bits());
            prop_assert!(same, "{:?} plain values differ from scalar (dim {}, heads {}, n {})", isa, dim, heads, n);
        }
    }
}

proptest! {
    #![proptest_config(config(96))]

    /// Two parts of the same records (tiers of a two-tier record: codes at different offsets
    /// and widths, the second part possibly with signs) scored together match the sum of the
    /// scalar scores of each part.
    #[test]
    fn score_coded_parts_matches_scalar(
        dims in (1usize..70, 1usize..150),
        bits in (1u8..=8, 1u8..=8),
        heads in 1usize..=9,
        n in 1usize..24,
        prod in any::<bool>(),
        tables in any::<bool>(),
        seed in any::<u64>(),
    ) {
        check_two_parts(dims, bits, heads, n, prod, tables, seed);
    }

    /// The two-tier layouts of the presets (25% and 75% of d = 64 or 128 channels, codes of
    /// at most 4 bits, signs on the second part or none), which the AVX-512 path scores with
    /// unrolled chunk loops when the signs go through tables.
    #[test]
    fn score_two_tier_layouts_match_scalar(
        dims in prop_oneof![Just((16usize, 48usize)), Just((32, 96))],
        bits in (1u8..=4, 1u8..=4),
        heads in 1usize..=9,
        n in 1usize..40,
        prod in any::<bool>(),
        tables in any::<bool>(),
        seed in any::<u64>(),
    ) {
        check_two_parts(dims, bits, heads, n, prod, tables, seed);
    }
}

/// The body of the two-part tests: `runs` interleave their scales as the fused kernel does.
#[allow(clippy::too_many_arguments)]
fn check_two_parts(
    (d1, d2): (usize, usize),
    (b1, b2): (u8, u8),
    heads: usize,
    n: usize,
    prod: bool,
    tables: bool,
    seed: u64,
) {
    let m = if prod { d2 } else { 0 };
    let w1 = (d1 * b1 as usize).div_ceil(32);
    let w2 = (d2 * b2 as usize).div_ceil(32);
    let record_words = w1 + w2 + m.div_ceil(32) + (seed % 2) as usize;
    let packed = words(n * record_words, seed);
    let c1 = floats(1 << b1, seed ^ 1);
    let c2 = floats(1 << b2, seed ^ 2);
    let s1: Vec<f32> = floats(n, seed ^ 3).iter().map(|v| 1.5 + v).collect();
    let s2: Vec<f32> = floats(n * if prod { 2 } else { 1 }, seed ^ 4)
        .iter()
        .map(|v| 1.5 + v)
        .collect();
    let spt2 = if prod { 2 } else { 1 };
    let runs = [
        CodedRun {
            words: &packed,
            record_words,
            code_offset: 0,
            bits: b1,
            dim: d1,
            centroids: &c1,
            sign_offset: w1,
            sketch_dim: 0,
            scales: &s1,
            scale_stride: 1,
        },
        CodedRun {
            words: &packed,
            record_words,
            code_offset: w1,
            bits: b2,
            dim: d2,
            centroids: &c2,
            sign_offset: w1 + w2,
            sketch_dim: m,
            scales: &s2,
            scale_stride: spt2,
        },
    ];
    // What the fused kernel passes: both tiers' scales interleaved in one array per record.
    let shared: Vec<f32> = (0..n)
        .flat_map(|i| std::iter::once(s1[i]).chain(s2[i * spt2..(i + 1) * spt2].iter().copied()))
        .collect();
    let interleaved = [
        CodedRun {
            scales: &shared,
            scale_stride: 1 + spt2,
            ..runs[0]
        },
        CodedRun {
            scales: &shared[1..],
            scale_stride: 1 + spt2,
            ..runs[1]
        },
    ];
    let q1 = floats(heads * d1, seed ^ 5);
    let q2 = floats(heads * d2, seed ^ 6);
    let sketch = if prod {
        floats(heads * m, seed ^ 7)
    } else {
        Vec::new()
    };
    let stride = n + 2;
    let out0 = floats(heads * stride, seed ^ 8);
    let scalar1 = KeyQueries::new(Isa::Scalar, q1.clone(), Vec::new(), d1, 0, tables);
    let scalar2 = KeyQueries::new(Isa::Scalar, q2.clone(), sketch.clone(), d2, m, tables);
    let mut reference = out0.clone();
    simd::score_coded(Isa::Scalar, &runs[0], &scalar1, &mut reference, stride);
    simd::score_coded(Isa::Scalar, &runs[1], &scalar2, &mut reference, stride);
    let mut bounds = vec![0.0f64; out0.len()];
    let code =
        |words: &[u32], b: u8, c: &[f32], j: usize| f64::from(c[code_at(words, b as usize, j)]);
    for h in 0..heads {
        for i in 0..n {
            let record = &packed[i * record_words..(i + 1) * record_words];
            let mut abs = f64::from(s1[i]).abs()
                * (0..d1)
                    .map(|j| (f64::from(q1[h * d1 + j]) * code(record, b1, &c1, j)).abs())
                    .sum::<f64>();
            let spt = if prod { 2 } else { 1 };
            abs += f64::from(s2[i * spt]).abs()
                * (0..d2)
                    .map(|j| (f64::from(q2[h * d2 + j]) * code(&record[w1..], b2, &c2, j)).abs())
                    .sum::<f64>();
            if prod {
                abs += f64::from(s2[i * 2 + 1]).abs()
                    * (0..m)
                        .map(|j| f64::from(sketch[h * m + j]).abs())
                        .sum::<f64>();
            }
            let k = h * stride + i;
            bounds[k] = 2.0 * gamma(d1 + d2 + m + 32) * abs + 8.0 * U * f64::from(out0[k]).abs();
        }
    }
    for isa in vector_isas() {
        let k1 = KeyQueries::new(isa, q1.clone(), Vec::new(), d1, 0, tables);
        let k2 = KeyQueries::new(isa, q2.clone(), sketch.clone(), d2, m, tables);
        let mut got = out0.clone();
        simd::score_coded_parts(isa, &interleaved, &[&k1, &k2], &mut got, stride);
        check_close(isa, "two-part score", &got, &reference, &bounds);
    }
}

/// Sign tables and multiply-adds give the same scores within the bound, on the same path.
#[test]
fn sign_tables_agree_with_multiply_adds() {
    for isa in Isa::available() {
        for (dim, heads) in [(64usize, 3usize), (128, 4), (100, 7)] {
            let n = 50;
            let coded = Coded::new(n, dim, 4, dim, 0, dim as u64);
            let queries = floats(heads * dim, 1);
            let sketch = floats(heads * dim, 2);
            let with = KeyQueries::new(isa, queries.clone(), sketch.clone(), dim, dim, true);
            let without = KeyQueries::new(isa, queries, sketch, dim, dim, false);
            let (mut a, mut b) = (vec![0.0f32; heads * n], vec![0.0f32; heads * n]);
            simd::score_coded(isa, &coded.run(), &with, &mut a, n);
            simd::score_coded(isa, &coded.run(), &without, &mut b, n);
            for (x, y) in a.iter().zip(&b) {
                assert!(
                    (x - y).abs() <= 1e-4 * (1.0 + y.abs()),
                    "{isa:?}: {x} vs {y}"
                );
            }
        }
    }
}

proptest! {
    #![proptest_config(config(64))]

    /// Up to eight parts of the same records (the groups of a basis record, the tiers of a
    /// two-tier one: any width 1..=8, dimensions with and without a partial last chunk, signs
    /// with and without tables) scored in one call give the bits of one call per part, in part
    /// order, on every path that promises them: all but AVX-512 with one or two parts (its
    /// fused two-tier pass reduces once per token). A batch of eight tokens added to the wrong
    /// columns, a part skipped or added twice, or parts summed in another order move bits.
    #[test]
    fn score_coded_parts_has_the_bits_of_a_pass_per_part(
        parts in prop::collection::vec((1usize..40, 1u8..=8, any::<bool>()), 1..=8),
        heads in 1usize..=9,
        n in 1usize..40,
        tables in any::<bool>(),
        seed in any::<u64>(),
    ) {
        // Part `p`'s codes then its signs (if any), every part's scales interleaved per record
        // as the fused kernel passes them.
        let records = SharedRecords::new(&parts, n, seed);
        let runs = records.runs();
        let stride = n + 3;
        let out0 = floats(heads * stride, seed ^ 2);
        for isa in Isa::available() {
            // AVX-512 scores one or two parts its own way (a fused two-tier pass, or a pass per
            // part through another kernel than a one-part record's); more go part by part.
            if isa == Isa::Avx512 && runs.len() <= 2 {
                continue;
            }
            let keys: Vec<KeyQueries> = parts
                .iter()
                .zip(&records.offsets)
                .enumerate()
                .map(|(p, (&(d, _, _), &(_, _, _, m)))| {
                    let q = floats(heads * d, seed ^ (32 + p as u64));
                    let w = floats(heads * m, seed ^ (64 + p as u64));
                    KeyQueries::new(isa, q, w, d, m, tables)
                })
                .collect();
            let mut per_part = out0.clone();
            for (run, k) in runs.iter().zip(&keys) {
                let one = std::slice::from_ref(run);
                simd::score_coded_parts(isa, one, &[k], &mut per_part, stride);
            }
            let mut together = out0.clone();
            let refs: Vec<&KeyQueries> = keys.iter().collect();
            simd::score_coded_parts(isa, &runs, &refs, &mut together, stride);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            prop_assert_eq!(bits(&together), bits(&per_part), "{:?}", isa);
        }
    }
}

/// Random parts of the same records (`(d, b, signs)` each, every part's scales interleaved per
/// record as the fused kernel passes them): the packed words, the scales and each part's
/// centroids, code offset, sign offset, scale offset and sketch dimension.
struct SharedRecords {
    words: Vec<u32>,
    record_words: usize,
    scales: Vec<f32>,
    scale_stride: usize,
    centroids: Vec<Vec<f32>>,
    offsets: Vec<(usize, usize, usize, usize)>,
    parts: Vec<(usize, u8, bool)>,
}

impl SharedRecords {
    fn new(parts: &[(usize, u8, bool)], n: usize, seed: u64) -> Self {
        let mut offsets = Vec::new();
        let (mut record_words, mut scale_stride) = (0, 0);
        for &(d, b, prod) in parts {
            let code_words = (d * b as usize).div_ceil(32);
            let m = if prod { d } else { 0 };
            offsets.push((record_words, record_words + code_words, scale_stride, m));
            record_words += code_words + m.div_ceil(32);
            scale_stride += 1 + usize::from(prod);
        }
        Self {
            words: words(n * record_words, seed),
            record_words,
            scales: floats(n * scale_stride, seed ^ 1)
                .iter()
                .map(|v| 1.5 + v)
                .collect(),
            scale_stride,
            centroids: parts
                .iter()
                .enumerate()
                .map(|(p, &(_, b, _))| floats(1 << b, seed ^ (16 + p as u64)))
                .collect(),
            offsets,
            parts: parts.to_vec(),
        }
    }

    fn runs(&self) -> Vec<CodedRun<'_>> {
        self.parts
            .iter()
            .zip(&self.offsets)
            .zip(&self.centroids)
            .map(
                |((&(d, b, _), &(code_offset, sign_offset, scale_offset, m)), c)| CodedRun {
                    words: &self.words,
                    record_words: self.record_words,
                    code_offset,
                    bits: b,
                    dim: d,
                    centroids: c,
                    sign_offset,
                    sketch_dim: m,
                    scales: &self.scales[scale_offset..],
                    scale_stride: self.scale_stride,
                },
            )
            .collect()
    }
}

/// `accumulate_coded_parts` on `runs` against one `accumulate_coded` per part with the
/// token-major weights `p·norm` it replaces: the same bits where it takes the runs, nothing
/// touched where it declines. Returns whether it took them.
fn check_coded_parts(isa: Isa, runs: &[CodedRun<'_>], heads: usize, seed: u64) -> bool {
    let n = runs[0].len();
    let stride = n + (seed % 5) as usize;
    let probabilities = floats(heads * stride, seed ^ 3);
    let accs0: Vec<Vec<f32>> = runs
        .iter()
        .enumerate()
        .map(|(p, run)| floats(heads * run.dim, seed ^ (48 + p as u64)))
        .collect();
    let mut got = accs0.clone();
    let mut slices: Vec<&mut [f32]> = got.iter_mut().map(|a| &mut a[..]).collect();
    let taken = simd::accumulate_coded_parts(isa, runs, &probabilities, stride, &mut slices);
    let bits = |v: &[Vec<f32>]| -> Vec<Vec<u32>> {
        v.iter()
            .map(|a| a.iter().map(|x| x.to_bits()).collect())
            .collect()
    };
    if !taken {
        assert_eq!(bits(&got), bits(&accs0), "{isa:?}: declined but wrote");
        return false;
    }
    let mut expected = accs0.clone();
    for (run, acc) in runs.iter().zip(&mut expected) {
        let m = run.sketch_dim;
        let weights: Vec<f32> = (0..n)
            .flat_map(|i| {
                let norm = run.scales[i * run.scale_stride];
                (0..heads).map(move |h| (h, i, norm))
            })
            .map(|(h, i, norm)| probabilities[h * stride + i] * norm)
            .collect();
        let mut signs = vec![0.0f32; heads * m];
        let sign_weights = vec![0.0f32; if m > 0 { n * heads } else { 0 }];
        simd::accumulate_coded(isa, run, &weights, &sign_weights, acc, &mut signs);
    }
    assert_eq!(
        bits(&got),
        bits(&expected),
        "{isa:?}: head-major parts differ"
    );
    true
}

proptest! {
    #![proptest_config(config(64))]

    /// Any parts (every width, signs or none, partial chunks): where `accumulate_coded_parts`
    /// takes them it gives the bits of a token-major pass per part; where not it writes nothing.
    #[test]
    fn accumulate_coded_parts_has_the_bits_of_a_pass_per_part(
        parts in prop::collection::vec((1usize..70, 1u8..=8, any::<bool>()), 1..=8),
        heads in 1usize..=9,
        n in 1usize..40,
        seed in any::<u64>(),
    ) {
        let records = SharedRecords::new(&parts, n, seed);
        for isa in Isa::available() {
            check_coded_parts(isa, &records.runs(), heads, seed);
        }
    }

    /// The layouts it is for (one to three parts of whole 16-coordinate chunks, codes of at
    /// most 4 bits, no signs: the presets' two tiers and single codecs at d = 64 and 128): the
    /// AVX-512 and AVX2 kernels take them — over more tokens than one L1 block too — with the
    /// same bits.
    #[test]
    fn accumulate_coded_parts_takes_the_presets_layouts(
        parts in prop::collection::vec((1usize..=8, 1u8..=4), 1..=3),
        heads in 1usize..=9,
        n in prop_oneof![1usize..40, 900usize..1100],
        seed in any::<u64>(),
    ) {
        let parts: Vec<(usize, u8, bool)> = parts.iter().map(|&(c, b)| (16 * c, b, false)).collect();
        let records = SharedRecords::new(&parts, n, seed);
        // Its chunk reads take 8 bytes, so a part needs that many from its codes to the end
        // of the record (a record of one 16-code part of 1 to 3 bits is shorter).
        let readable = records
            .offsets
            .iter()
            .all(|&(code_offset, ..)| 4 * (records.record_words - code_offset) >= 8);
        for isa in Isa::available() {
            let taken = check_coded_parts(isa, &records.runs(), heads, seed);
            let expected = match isa {
                Isa::Avx512 => readable,
                Isa::Avx2 => true,
                _ => false,
            };
            prop_assert_eq!(taken, expected, "{:?}", isa);
        }
    }
}
