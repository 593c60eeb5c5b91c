//! The data-aware basis (`basis = "pca"`): integer reverse water-filling, the codec over a
//! fitted basis, its reduction to the plain codec, the fused kernel on it, save / load, and
//! the fallbacks and errors.
//!
//! Catches: a group over budget or not word-aligned, a non-optimal allocation, a group scale
//! not folded into the query (or applied twice to values), a wrong projection or scatter, a
//! basis that is not saved or refitted by later chunks, a short first batch that panics or fits
//! a rank-deficient basis, and a basis accepted where it cannot apply.

mod common;

use common::{two_heads, vectors};
use half::f16;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use rand_distr::{Distribution, StandardNormal};
use tq_cache::allocation::{Allocation, AllocationError, FieldProblem};
use tq_cache::attention::simd::Isa;
use tq_cache::attention::{AttentionKernel, AttentionShape, attend};
use tq_cache::basis::{
    BasisCodec, BasisFit, BasisGroup, BasisPolicy, FittedBasis, allocate_bits, distortion_table,
    fit_basis,
};
use tq_cache::codec::packing::words_for;
use tq_cache::codec::{CodecScratch, MseSpec, TqMse};
use tq_cache::kv_cache::{KvCache, KvKind, KvLayout, uniform_streams};
use tq_cache::persist::{from_bytes, to_bytes};
use tq_cache::states::{ModelCache, StateKind, StateSpec};
use tq_cache::token_store::Growth;
use tq_cache::{CodecSpec, TokenCodec};

const D: usize = 64;

fn config(cases: u32) -> Config {
    Config {
        cases,
        rng_seed: RngSeed::Fixed(0xBA51_5000),
        failure_persistence: None,
        ..Config::default()
    }
}

/// `n` vectors of dimension `D` with component variances `0.9^i` in a random orthonormal basis
/// (fixed by `basis_seed`), plus `offset` on every coordinate: anisotropic like real keys.
fn anisotropic(n: usize, basis_seed: u64, seed: u64) -> Vec<f32> {
    let basis = tq_rotation::Rotation::new(tq_rotation::RotationKind::Haar, D, basis_seed).unwrap();
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    let mut out = Vec::with_capacity(n * D);
    let mut z = vec![0.0f32; D];
    let mut x = vec![0.0f32; D];
    for _ in 0..n {
        for (i, v) in z.iter_mut().enumerate() {
            let g: f32 = StandardNormal.sample(&mut rng);
            *v = g * 0.9f32.powi(i as i32).sqrt();
        }
        basis.apply_inverse(&z, &mut x).unwrap();
        out.extend_from_slice(&x);
    }
    out
}

fn check_groups(groups: &[BasisGroup], d: usize, words: usize) {
    let mut used = 0;
    for (k, g) in groups.iter().enumerate() {
        assert!((1..=8).contains(&g.bits) && g.len > 0, "{groups:?}");
        if k + 1 < groups.len() {
            assert_eq!(
                g.len * g.bits as usize % 32,
                0,
                "group {k} not whole words: {groups:?}"
            );
            assert!(
                groups[k + 1].bits < g.bits,
                "bits not decreasing: {groups:?}"
            );
        }
        used += words_for(g.len, g.bits);
    }
    assert!(used <= words, "{used} words > {words}: {groups:?}");
    assert!(groups.iter().map(|g| g.len).sum::<usize>() <= d);
}

fn cost(variances: &[f64], groups: &[BasisGroup], table: &[f64; 9]) -> f64 {
    let mut bits = vec![0usize; variances.len()];
    let mut start = 0;
    for g in groups {
        bits[start..start + g.len].fill(g.bits as usize);
        start += g.len;
    }
    variances
        .iter()
        .zip(&bits)
        .map(|(v, &b)| v * table[b])
        .sum()
}

/// Every allocation the family allows, by brute force: consecutive groups with strictly
/// decreasing bits, all but the last whole words, within `words`.
fn brute_force(variances: &[f64], words: usize, table: &[f64; 9]) -> f64 {
    fn go(v: &[f64], pos: usize, used: usize, last: usize, words: usize, t: &[f64; 9]) -> f64 {
        let rest: f64 = v[pos..].iter().sum();
        let mut best = rest;
        for bits in 1..last {
            for len in 1..=v.len() - pos {
                let span: f64 = v[pos..pos + len].iter().sum::<f64>() * t[bits];
                if used + words_for(len, bits as u8) > words {
                    break;
                }
                // As the last group.
                best = best.min(span + v[pos + len..].iter().sum::<f64>());
                if (len * bits).is_multiple_of(32) && pos + len < v.len() {
                    let next = used + len * bits / 32;
                    best = best.min(span + go(v, pos + len, next, bits, words, t));
                }
            }
        }
        best
    }
    go(variances, 0, 0, 9, words, table)
}

proptest! {
    #![proptest_config(config(64))]

    /// The dynamic program respects the packing rules and finds the brute-force optimum
    /// (d ≤ 24, so the exhaustive search stays small; the rules are the same at any d).
    #[test]
    fn allocation_is_feasible_and_optimal(
        d in 4usize..=24,
        bits in 1u8..=8,
        raw in prop::collection::vec(0.0f64..1.0, 24),
        power in 1i32..6,
    ) {
        let table = distortion_table(64).unwrap();
        let mut variances: Vec<f64> = raw[..d].iter().map(|v| v.powi(power)).collect();
        variances.sort_by(|a, b| b.total_cmp(a));
        let words = words_for(d, bits);
        let groups = allocate_bits(&variances, words, &table);
        check_groups(&groups, d, words);
        let found = cost(&variances, &groups, &table);
        let best = brute_force(&variances, words, &table);
        prop_assert!(found <= best * (1.0 + 1e-12) + 1e-300, "dp {found} vs brute force {best}");
    }
}

#[test]
fn equal_variances_get_equal_bits_and_spread_ones_do_not() {
    let table = distortion_table(D).unwrap();
    for bits in 1..=8u8 {
        let groups = allocate_bits(&[1.0; D], words_for(D, bits), &table);
        assert_eq!(groups, vec![BasisGroup { len: D, bits }]);
    }
    let spread: Vec<f64> = (0..D).map(|i| 0.9f64.powi(i as i32)).collect();
    let groups = allocate_bits(&spread, words_for(D, 4), &table);
    check_groups(&groups, D, words_for(D, 4));
    assert!(groups.len() > 2 && groups[0].bits > 4, "{groups:?}");
    // At 0.9^i the rate-distortion gain is ~6 dB; the packed allocation keeps most of it.
    let flat = spread.iter().sum::<f64>() * table[4];
    assert!(cost(&spread, &groups, &table) < 0.4 * flat);
}

/// A basis of identity rows with one group at the stream's bits and gain 1 is today's codec:
/// the same words and norms, the same decoded vectors, bit for bit.
#[test]
fn a_single_identity_group_is_the_plain_codec_bit_for_bit() {
    for bits in [2u8, 3, 4, 5, 8] {
        let spec = MseSpec::new(D, bits, 11);
        let rows: Vec<u16> = (0..D * D)
            .map(|i| f16::from_f32(if i / D == i % D { 1.0 } else { 0.0 }).to_bits())
            .collect();
        let fit = FittedBasis {
            rows,
            groups: vec![BasisGroup { len: D, bits }],
            scales: vec![1.0f32.to_bits()],
            components: Vec::new(),
        };
        let basis = BasisCodec::new(spec, fit).unwrap();
        let plain = TqMse::new(spec).unwrap();
        let x = anisotropic(40, 1, 2);
        let mut scratch = CodecScratch::new(D);
        let mut a = vec![0u32; basis.record_words()];
        let mut b = vec![0u32; plain.words_per_vector()];
        let (mut xa, mut xb) = (vec![0.0f32; D], vec![0.0f32; D]);
        for row in x.chunks_exact(D) {
            let na = basis.encode_into(row, &mut scratch, &mut a).unwrap();
            let nb = plain.encode_into(row, &mut scratch, &mut b).unwrap();
            assert_eq!((a.clone(), na), (b.clone(), nb), "bits {bits}");
            basis.decode_into(&a, na, &mut scratch, &mut xa).unwrap();
            plain.decode_into(&b, nb, &mut scratch, &mut xb).unwrap();
            // Equal as numbers: the basis path sums `0 + (−0)·1 = +0` where the plain one
            // returns the rotation's `−0` (the only bit that differs, and no kernel sees it).
            assert_eq!(xa, xb);
        }
    }
}

/// `±√d·e_i` for every axis: a second moment of exactly `I/d`, so every component has the same
/// variance, the allocation is one group at the stream's bits and the fit is the identity.
fn isotropic_batch() -> Vec<f32> {
    let mut out = vec![0.0f32; 2 * D * D];
    for i in 0..D {
        out[(2 * i) * D + i] = 8.0;
        out[(2 * i + 1) * D + i] = -8.0;
    }
    out
}

#[test]
fn fits_fall_back_to_the_plain_codec_when_one_group_or_too_few_tokens() {
    assert_eq!(
        fit_basis(&isotropic_batch(), D, 4).unwrap(),
        BasisFit::Identity
    );
    // Fewer tokens than dimensions: a rank-deficient estimate, refused.
    let short = anisotropic(D - 1, 3, 4);
    assert_eq!(fit_basis(&short, D, 4).unwrap(), BasisFit::Identity);
    let BasisFit::Pca(fit) = fit_basis(&anisotropic(4 * D, 3, 4), D, 4).unwrap() else {
        panic!("an anisotropic batch must fit a basis");
    };
    assert_eq!(fit.rows.len(), fit.rank() * D);
    assert_eq!(fit.bytes(), 2 * fit.rank() * D + 8 * fit.groups.len());
    // Bad input is a typed error.
    assert!(fit_basis(&short[..D + 1], D, 4).is_err());
    let mut nan = anisotropic(2 * D, 3, 4);
    nan[5] = f32::NAN;
    assert!(fit_basis(&nan, D, 4).is_err());
    assert!(fit_basis(&anisotropic(2 * D, 3, 4), D, 9).is_err());
}

fn layout() -> KvLayout {
    KvLayout {
        kv_heads: 2,
        head_dim: D,
        kind: KvKind::Growing {
            growth: Growth::Doubling { initial: 16 },
        },
        max_rewind: 0,
        rope_pairs: tq_cache::basis::RopePairs::Adjacent,
        rope_base: Default::default(),
    }
}

fn basis_cache(bits: u8, policy: BasisPolicy) -> KvCache {
    let layout = layout();
    let streams = |seed| {
        uniform_streams(&layout, CodecSpec::Mse(MseSpec::new(D, bits, seed)))
            .into_iter()
            .map(|mut s| {
                s.basis = policy;
                s
            })
            .collect::<Vec<_>>()
    };
    KvCache::new(layout, &streams(5), &streams(6)).unwrap()
}

fn append(cache: &mut KvCache, k: &[f32], v: &[f32]) {
    let start = cache.len() as u32;
    let n = k.len() / (2 * D);
    let positions: Vec<u32> = (start..start + n as u32).collect();
    cache.append(k, v, &positions).unwrap();
}

fn records(cache: &KvCache) -> Vec<(Vec<u32>, Vec<u16>)> {
    (0..2)
        .flat_map(|g| [cache.keys(g), cache.values(g)])
        .flat_map(|s| {
            (0..s.len()).map(|t| {
                let (_, r, sc) = s.token(t).unwrap();
                (r.to_vec(), sc.iter().map(|h| h.to_bits()).collect())
            })
        })
        .collect()
}

#[test]
fn an_isotropic_stream_stores_exactly_what_a_plain_one_does() {
    let batch = two_heads(&isotropic_batch(), &isotropic_batch(), D);
    let later = two_heads(&anisotropic(30, 1, 7), &anisotropic(30, 2, 8), D);
    let mut with = basis_cache(4, BasisPolicy::Pca);
    let mut without = basis_cache(4, BasisPolicy::None);
    for c in [&mut with, &mut without] {
        append(c, &batch, &batch);
        append(c, &later, &later);
    }
    assert_eq!(with.keys(0).basis_fit(), Some(&BasisFit::Identity));
    assert!(matches!(with.keys(0).codec(), TokenCodec::Mse(_)));
    assert_eq!(records(&with), records(&without));
    assert_eq!(with.formula_bytes(), without.formula_bytes());
}

/// Mean squared error per coordinate of `cache`'s stored keys of head 0 against `keys`.
fn key_error(cache: &KvCache, keys: &[f32], from: usize) -> f64 {
    let stream = cache.keys(0);
    let mut scratch = CodecScratch::new(D);
    let mut out = vec![0.0f32; D];
    let mut err = 0.0f64;
    let mut energy = 0.0f64;
    for (t, x) in keys.chunks_exact(D).enumerate().skip(from) {
        stream.reconstruct(t, &mut scratch, &mut out).unwrap();
        for (a, b) in x.iter().zip(&out) {
            err += f64::from(a - b).powi(2);
            energy += f64::from(*a).powi(2);
        }
    }
    err / energy
}

/// On vectors with variances `0.9^i` (an arithmetic-to-geometric-mean gap of 6.4 dB) the basis
/// fitted on 2048 tokens cuts the relative error of the 512 tokens after them at 3, 4 and 5 bits
/// by more than half, and lands within −10% / +25% of the allocation's prediction
/// `Σλ_i·D(b_i)/Σλ_i` (measured: +7% to +12%; the excess is the leakage of an estimated basis
/// — with a fit of only 4 tokens per dimension it grows to +30–45%, which is why real prefills
/// should fit on a whole first chunk).
///
/// Sample size: 512 tokens × 64 coordinates. The relative error is a mean of that many
/// squared errors whose spread (coefficient of variation ≈ 1.5 for a squared Lloyd-Max error,
/// widened by the per-token norm) gives a standard error of about 1.5/√32768 ≈ 1% of the mean;
/// every margin (a factor 2 where the model predicts ~3, and 10% / 13% from the measured
/// ratios) is 10 or more standard errors, so a false failure has probability far below 1e-6.
/// A lost gain, a scale applied twice or a group quantized with the wrong codebook moves the
/// error by a factor 2 or more.
#[test]
fn the_basis_cuts_the_error_of_anisotropic_vectors() {
    let table = distortion_table(D).unwrap();
    for bits in [3u8, 4, 5] {
        let fit_batch = anisotropic(32 * D, 21, 22);
        let later = anisotropic(512, 21, 23);
        let mut errors = Vec::new();
        for policy in [BasisPolicy::Pca, BasisPolicy::None] {
            let mut c = basis_cache(bits, policy);
            let batch = two_heads(&fit_batch, &fit_batch, D);
            append(&mut c, &batch, &batch);
            let tail = two_heads(&later, &later, D);
            append(&mut c, &tail, &tail);
            let all: Vec<f32> = fit_batch.iter().chain(&later).copied().collect();
            errors.push(key_error(&c, &all, 32 * D));
            if policy.fits_basis() {
                let Some(BasisFit::Pca(fit)) = c.keys(0).basis_fit() else {
                    panic!("no basis fitted at {bits} bits");
                };
                let spread: Vec<f64> = (0..D).map(|i| 0.9f64.powi(i as i32)).collect();
                let predicted = cost(&spread, &fit.groups, &table) / spread.iter().sum::<f64>();
                let measured = errors[0];
                assert!(
                    (0.9..1.25).contains(&(measured / predicted)),
                    "{bits} bits: measured {measured}, predicted {predicted}"
                );
            }
        }
        assert!(
            errors[0] < 0.5 * errors[1],
            "{bits} bits: basis {} vs plain {}",
            errors[0],
            errors[1]
        );
    }
}

/// The fused kernel scores and sums a basis cache as the exact reference over its decoded
/// vectors does (the f32 tolerance of `attention_fused.rs`: the projection adds `d` more
/// products per stage, well inside it).
#[test]
fn fused_attention_on_a_basis_cache_matches_the_reference() {
    let mut groups_seen = Vec::new();
    for bits in [2u8, 4, 5] {
        let mut c = basis_cache(bits, BasisPolicy::Pca);
        let k = two_heads(&anisotropic(300, 1, 2), &anisotropic(300, 3, 4), D);
        let v = two_heads(&anisotropic(300, 5, 6), &anisotropic(300, 7, 8), D);
        append(&mut c, &k[..200 * 2 * D], &v[..200 * 2 * D]);
        append(&mut c, &k[200 * 2 * D..], &v[200 * 2 * D..]);
        let TokenCodec::Basis(basis) = c.keys(1).codec() else {
            panic!("keys of head 1 must have a basis at {bits} bits");
        };
        groups_seen.push(basis.groups().len());
        assert!(matches!(c.values(0).codec(), TokenCodec::Basis(_)));
        let shape = AttentionShape {
            q_heads: 4,
            scale: 0.125,
        };
        let positions: Vec<u32> = vec![299, 150, 17];
        let queries = vectors(positions.len() * 4, D, 9);
        let mut exact = vec![0.0f32; queries.len()];
        attend(
            &c,
            &queries,
            &positions,
            shape,
            AttentionKernel::Reference,
            &mut exact,
        )
        .unwrap();
        let scale = exact.iter().fold(0.0f32, |m, v| m.max(v.abs())).max(1.0);
        // Every instruction set this CPU has (scalar, AVX2, AVX-512 or NEON run kernels).
        for isa in Isa::available() {
            let mut fused = vec![0.0f32; queries.len()];
            attend(
                &c,
                &queries,
                &positions,
                shape,
                AttentionKernel::FusedOn(isa),
                &mut fused,
            )
            .unwrap();
            for (i, (a, b)) in fused.iter().zip(&exact).enumerate() {
                assert!(
                    (a - b).abs() <= 2e-4 * scale + 1e-5,
                    "{bits} bits, {isa:?}, output {i}: fused {a} vs reference {b}"
                );
            }
        }
    }
    // Both scoring paths ran: up to two parts scored together, more one after another.
    assert!(
        groups_seen.iter().any(|&g| g <= 2) && groups_seen.iter().any(|&g| g > 2),
        "{groups_seen:?}"
    );
}

fn specs() -> Vec<StateSpec> {
    vec![StateSpec {
        name: "blk.0.kv".into(),
        kind: StateKind::Kv {
            layer: 0,
            layout: layout(),
        },
    }]
}

/// Runs layer 0 over `k`/`v` (`[n, 2, D]`) after what the cache holds.
fn forward(cache: &mut ModelCache, k: &[f32], v: &[f32]) -> Vec<f32> {
    let n = k.len() / (2 * D);
    let positions: Vec<u32> = (0..(cache.len() + n) as u32).collect();
    let shape = AttentionShape {
        q_heads: 4,
        scale: 0.125,
    };
    let mut queries = vec![0.0f32; n * 4 * D];
    for (i, q) in queries.iter_mut().enumerate() {
        *q = ((i * 7919) % 113) as f32 / 56.0 - 1.0;
    }
    let mut out = vec![0.0f32; queries.len()];
    cache
        .forward_layer(
            0,
            &queries,
            Some((k, v)),
            &positions,
            shape,
            AttentionKernel::Fused,
            &mut out,
        )
        .unwrap();
    out
}

#[test]
fn basis_caches_save_and_reload_bit_identical_and_refit_only_when_emptied() {
    let allocation = Allocation::from_toml_str(
        r#"
name = "pca-test"
key = { codec = "mse", bits = 4, center = "first-chunk", basis = "pca" }
value = { codec = "mse", bits = 3, basis = "pca" }
"#,
    )
    .unwrap();
    let mut cache = ModelCache::with_allocation(specs(), &allocation).unwrap();
    let k = two_heads(&anisotropic(200, 1, 2), &anisotropic(200, 3, 4), D);
    let v = two_heads(&anisotropic(200, 5, 6), &anisotropic(200, 7, 8), D);
    let split = 150 * 2 * D;
    forward(&mut cache, &k[..split], &v[..split]);
    let fit = cache.kv(0).unwrap().keys(0).basis_fit().cloned();
    assert!(matches!(fit, Some(BasisFit::Pca(_))));
    let bytes = to_bytes(&cache).unwrap();
    let mut reloaded = from_bytes(&bytes).unwrap();
    assert_eq!(to_bytes(&reloaded).unwrap(), bytes);
    // Appending after the reload gives what appending without it gives; the basis stays.
    let a = forward(&mut cache, &k[split..], &v[split..]);
    let b = forward(&mut reloaded, &k[split..], &v[split..]);
    let bits_of = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits_of(&a), bits_of(&b));
    assert_eq!(to_bytes(&reloaded).unwrap(), to_bytes(&cache).unwrap());
    assert_eq!(cache.kv(0).unwrap().keys(0).basis_fit().cloned(), fit);
    // The basis is counted once it exists.
    let kv = cache.kv(0).unwrap();
    let Some(BasisFit::Pca(f)) = kv.keys(0).basis_fit() else {
        unreachable!()
    };
    assert!(kv.keys(0).fixed_bytes() >= f.bytes());
    // Emptied, the cache forgets it and fits again from the next first batch.
    cache.reset();
    assert_eq!(cache.kv(0).unwrap().keys(0).basis_fit(), None);
    forward(&mut cache, &k[..10 * 2 * D], &v[..10 * 2 * D]);
    assert_eq!(
        cache.kv(0).unwrap().keys(0).basis_fit(),
        Some(&BasisFit::Identity)
    );
}

#[test]
fn a_basis_where_it_cannot_apply_is_a_typed_error_naming_the_field() {
    let field = |text: &str| match Allocation::from_toml_str(text).and_then(|a| {
        a.resolve_stream(0, 4, 0, D, tq_cache::allocation::StreamKind::Key)
            .map(|_| ())
    }) {
        Err(AllocationError::Field { path, problem, .. }) => (path, problem),
        other => panic!("expected a field error, got {other:?}"),
    };
    let (path, problem) = field(
        "name = \"x\"\nkey = { codec = \"prod\", bits = 4, basis = \"pca\" }\nvalue = { codec = \"f16\" }\n",
    );
    assert!(path.ends_with("basis"), "{path}");
    assert!(matches!(problem, FieldProblem::NotApplicable { .. }));
    let (path, problem) = field(
        "name = \"x\"\nkey = { codec = \"mse\", bits = 4, basis = \"pca\" }\nvalue = { codec = \"f16\" }\n[outliers]\nchannels = 8\nkey = { bits = 6 }\n",
    );
    assert!(path.ends_with("basis"), "{path}");
    assert!(matches!(problem, FieldProblem::BasisWithOutliers));
    let (path, problem) = field(
        "name = \"x\"\nkey = { codec = \"mse\", bits = 4 }\nvalue = { codec = \"f16\" }\n[outliers]\nchannels = 8\nkey = { bits = 6, basis = \"pca\" }\n",
    );
    assert!(
        path.contains("outliers") && path.ends_with("basis"),
        "{path}"
    );
    assert!(matches!(problem, FieldProblem::WholeStreamOnly));
    let (path, problem) = field(
        "name = \"x\"\nkey = { codec = \"mse\", bits = 4, basis = \"planes\", norm_correction = true }\nvalue = { codec = \"f16\" }\n",
    );
    assert!(path.ends_with("basis"), "{path}");
    assert!(matches!(problem, FieldProblem::BasisWithNormCorrection));
    assert!(Allocation::from_toml_str(
        "name = \"x\"\nkey = { codec = \"mse\", bits = 4, basis = \"svd\" }\nvalue = { codec = \"f16\" }\n"
    )
    .is_err());
    // An override that switches a layer to f16 drops the inherited basis.
    let a = Allocation::from_toml_str(
        "name = \"x\"\nkey = { codec = \"mse\", bits = 4, basis = \"pca\" }\nvalue = { codec = \"f16\" }\n[[override]]\nlayers = [0]\nkey = { codec = \"f16\" }\n",
    )
    .unwrap();
    let r = a
        .resolve_stream(0, 4, 0, D, tq_cache::allocation::StreamKind::Key)
        .unwrap();
    assert_eq!(r.basis, BasisPolicy::None);
    let r = a
        .resolve_stream(1, 4, 0, D, tq_cache::allocation::StreamKind::Key)
        .unwrap();
    assert_eq!(r.basis, BasisPolicy::Pca);
}
