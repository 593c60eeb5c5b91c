//! The plane basis (`basis = "planes"`): bits per RoPE plane water-filled on the product of
//! the key and query energy of the plane, the codec over a coordinate list, the query energy
//! taken from the write-then-attend entry point, save / load, the fallbacks and the errors.
//!
//! Catches: weights that ignore the queries (or the keys), planes split by the wrong pairing,
//! a fit that depends on the positions of the batch (what RoPE changes), a coordinate-list
//! codec that differs from the same basis written as rows, a fit from an append that brought
//! no queries, query energies mixed across KV heads, a fit that is not saved, and a plane
//! basis accepted on values or given bad input.

mod common;

use common::{two_heads, vectors};
use half::f16;
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use rand_distr::{Distribution, StandardNormal};
use tq_cache::allocation::{Allocation, AllocationError, FieldProblem, StreamKind};
use tq_cache::attention::{AttentionKernel, AttentionShape, attend};
use tq_cache::basis::{
    BasisCodec, BasisFit, BasisPolicy, FittedBasis, RopePairs, fit_planes, min_basis_tokens,
};
use tq_cache::codec::packing::words_for;
use tq_cache::codec::{CodecScratch, MseSpec};
use tq_cache::kv_cache::{KvCache, KvKind, KvLayout, uniform_streams};
use tq_cache::persist::{from_bytes, to_bytes};
use tq_cache::states::{ModelCache, StateKind, StateSpec};
use tq_cache::token_store::Growth;
use tq_cache::{CodecSpec, TokenCodec};

const D: usize = 64;
const PLANES: usize = D / 2;
const KV: usize = 2;
const Q_HEADS: usize = 4;

/// Plane `p`'s magnitude in the keys: spread over an order of magnitude, all distinct, with
/// plane 23 far above the rest (sampled energies over 256 tokens vary by ~6%, so the orders
/// the tests check are separated by much more than that).
fn key_magnitude(p: usize) -> f32 {
    if p == 23 {
        12.0
    } else {
        1.0 + (0.3 * p as f32) % 7.0 + 0.01 * p as f32
    }
}

/// Keys as RoPE leaves them: plane `p` of token `t` is a Gaussian 2-vector of scale
/// `key_magnitude(p)` turned by `(start + t)·θ_p`, `θ_p = 10000^(−2p/D)`, laid out by `pairs`.
/// `[n, D]`.
fn rope_keys(n: usize, start: usize, pairs: RopePairs, seed: u64) -> Vec<f32> {
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    let mut out = vec![0.0f32; n * D];
    for (t, row) in out.chunks_exact_mut(D).enumerate() {
        for p in 0..PLANES {
            let g: [f32; 2] = [
                StandardNormal.sample(&mut rng),
                StandardNormal.sample(&mut rng),
            ];
            let m = key_magnitude(p);
            let angle = (start + t) as f64 * 10000f64.powf(-2.0 * p as f64 / D as f64);
            let (s, c) = (angle.sin() as f32, angle.cos() as f32);
            let [a, b] = pairs.plane(p, D);
            row[a] = m * (g[0] * c - g[1] * s);
            row[b] = m * (g[0] * s + g[1] * c);
        }
    }
    out
}

/// Query energy per coordinate: most of it in planes 5, 6 and 20 (not where the keys are
/// largest), a little everywhere.
fn query_energy(pairs: RopePairs) -> Vec<f64> {
    let mut e = vec![0.02; D];
    for p in [5, 6, 20] {
        for c in pairs.plane(p, D) {
            e[c] = 4.0;
        }
    }
    e
}

/// Queries `[n, Q_HEADS, D]` whose coordinate `i` has variance `energy[i]` (the same for
/// every head).
fn queries_with(energy: &[f64], n: usize, seed: u64) -> Vec<f32> {
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    (0..n * Q_HEADS * D)
        .map(|i| {
            let g: f32 = StandardNormal.sample(&mut rng);
            g * (energy[i % D] as f32).sqrt()
        })
        .collect()
}

fn planes_fit(fit: BasisFit) -> FittedBasis {
    match fit {
        BasisFit::Planes(f) => f,
        other => panic!("expected a plane basis, got {other:?}"),
    }
}

#[test]
fn the_planes_the_queries_read_come_first_and_get_the_most_bits() {
    let keys = rope_keys(256, 0, RopePairs::Adjacent, 1);
    let energy = query_energy(RopePairs::Adjacent);
    let fit = planes_fit(fit_planes(&keys, D, 4, RopePairs::Adjacent, &energy).unwrap());
    // Weight κ_p·ρ_p: the three query planes lead, ordered by their key magnitude.
    let mut lead = [5usize, 6, 20];
    lead.sort_by(|&a, &b| key_magnitude(b).total_cmp(&key_magnitude(a)));
    let first: Vec<u16> = lead
        .iter()
        .flat_map(|&p| [2 * p as u16, 2 * p as u16 + 1])
        .collect();
    assert_eq!(&fit.components[..6], &first[..]);
    // Coordinates of a plane stay next to each other, and no coordinate repeats.
    for pair in fit.components.chunks(2).filter(|c| c.len() == 2) {
        assert_eq!(pair[0] / 2, pair[1] / 2, "{:?}", fit.components);
    }
    let mut sorted = fit.components.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), fit.components.len());
    // Feasible: decreasing bits, whole words but the last group, within the plain record.
    let mut words = 0;
    for (k, g) in fit.groups.iter().enumerate() {
        if k + 1 < fit.groups.len() {
            assert_eq!(g.len * usize::from(g.bits) % 32, 0, "{:?}", fit.groups);
            assert!(fit.groups[k + 1].bits < g.bits, "{:?}", fit.groups);
        }
        words += words_for(g.len, g.bits);
    }
    assert!(words <= words_for(D, 4));
    assert!(fit.groups[0].bits > 4, "{:?}", fit.groups);
    // Stored: two bytes per coordinate, eight per group, no rows.
    assert!(fit.rows.is_empty());
    assert_eq!(fit.bytes(), 2 * fit.components.len() + 8 * fit.groups.len());
    // Queries spread evenly instead: the order follows the keys alone.
    let flat = vec![1.0; D];
    let by_keys = planes_fit(fit_planes(&keys, D, 4, RopePairs::Adjacent, &flat).unwrap());
    let largest = (0..PLANES)
        .max_by(|&a, &b| key_magnitude(a).total_cmp(&key_magnitude(b)))
        .unwrap();
    assert_eq!(by_keys.components[0] / 2, largest as u16);
}

#[test]
fn the_fit_does_not_depend_on_where_the_batch_sits_in_the_sequence() {
    // The same draws turned to positions 0.. and 10000..: every plane's energy is the same
    // (RoPE keeps a plane's norm), so the fit must be too.
    let energy = query_energy(RopePairs::Adjacent);
    for bits in [3u8, 4, 5] {
        let early = planes_fit(
            fit_planes(
                &rope_keys(200, 0, RopePairs::Adjacent, 9),
                D,
                bits,
                RopePairs::Adjacent,
                &energy,
            )
            .unwrap(),
        );
        let late = planes_fit(
            fit_planes(
                &rope_keys(200, 10_000, RopePairs::Adjacent, 9),
                D,
                bits,
                RopePairs::Adjacent,
                &energy,
            )
            .unwrap(),
        );
        assert_eq!(early.components, late.components, "{bits} bits");
        assert_eq!(early.groups, late.groups, "{bits} bits");
        for (a, b) in early.scales.iter().zip(&late.scales) {
            let (a, b) = (f32::from_bits(*a), f32::from_bits(*b));
            assert!((a - b).abs() <= 1e-5 * a, "{bits} bits: scales {a} and {b}");
        }
    }
}

#[test]
fn halves_pairs_give_the_adjacent_fit_with_the_coordinates_moved() {
    // The same keys and queries laid out (2p, 2p+1) and (p, p + D/2).
    let adjacent = rope_keys(256, 3, RopePairs::Adjacent, 4);
    let halves = rope_keys(256, 3, RopePairs::Halves, 4);
    let a = planes_fit(
        fit_planes(
            &adjacent,
            D,
            4,
            RopePairs::Adjacent,
            &query_energy(RopePairs::Adjacent),
        )
        .unwrap(),
    );
    let h = planes_fit(
        fit_planes(
            &halves,
            D,
            4,
            RopePairs::Halves,
            &query_energy(RopePairs::Halves),
        )
        .unwrap(),
    );
    let moved: Vec<u16> = a
        .components
        .iter()
        .map(|&c| {
            let (p, second) = (usize::from(c) / 2, c % 2 == 1);
            RopePairs::Halves.plane(p, D)[usize::from(second)] as u16
        })
        .collect();
    assert_eq!(h.components, moved);
    assert_eq!(h.groups, a.groups);
    // The wrong pairing reads each "plane" as two unrelated coordinates: another fit.
    let wrong = fit_planes(
        &halves,
        D,
        4,
        RopePairs::Adjacent,
        &query_energy(RopePairs::Halves),
    )
    .unwrap();
    assert_ne!(wrong, BasisFit::Planes(h));
}

#[test]
fn a_coordinate_list_codes_exactly_like_the_same_basis_written_as_rows() {
    let keys = rope_keys(300, 0, RopePairs::Adjacent, 5);
    let energy = query_energy(RopePairs::Adjacent);
    for bits in [2u8, 4, 5] {
        let fit = planes_fit(
            fit_planes(&keys[..128 * D], D, bits, RopePairs::Adjacent, &energy).unwrap(),
        );
        let mut rows = vec![0u16; fit.components.len() * D];
        for (r, &c) in fit.components.iter().enumerate() {
            rows[r * D + usize::from(c)] = f16::ONE.to_bits();
        }
        let dense = FittedBasis {
            rows,
            components: Vec::new(),
            ..fit.clone()
        };
        let spec = MseSpec::new(D, bits, 77);
        let list = BasisCodec::new(spec, fit).unwrap();
        let rows = BasisCodec::new(spec, dense).unwrap();
        assert_eq!(list.rows(), rows.rows());
        let mut scratch = CodecScratch::new(D);
        let (mut a, mut b) = (
            vec![0u32; list.record_words()],
            vec![0u32; list.record_words()],
        );
        let (mut x, mut y) = (vec![0.0f32; D], vec![0.0f32; D]);
        for v in keys.chunks_exact(D) {
            let na = list.encode_into(v, &mut scratch, &mut a).unwrap();
            let nb = rows.encode_into(v, &mut scratch, &mut b).unwrap();
            assert_eq!((a.as_slice(), na.to_bits()), (b.as_slice(), nb.to_bits()));
            list.decode_into(&a, na, &mut scratch, &mut x).unwrap();
            rows.decode_into(&b, nb, &mut scratch, &mut y).unwrap();
            assert_eq!(
                x.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                y.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            );
        }
    }
}

fn layout() -> KvLayout {
    KvLayout {
        kv_heads: KV,
        head_dim: D,
        kind: KvKind::Growing {
            growth: Growth::Doubling { initial: 16 },
        },
        max_rewind: 0,
        rope_pairs: RopePairs::Adjacent,
        rope_base: Default::default(),
    }
}

fn cache(bits: u8, policy: BasisPolicy) -> KvCache {
    let layout = layout();
    let streams = |seed, policy| {
        uniform_streams(&layout, CodecSpec::Mse(MseSpec::new(D, bits, seed)))
            .into_iter()
            .map(|mut s| {
                s.basis = policy;
                s
            })
            .collect::<Vec<_>>()
    };
    KvCache::new(layout, &streams(5, policy), &streams(6, BasisPolicy::None)).unwrap()
}

fn positions(from: usize, n: usize) -> Vec<u32> {
    (from as u32..(from + n) as u32).collect()
}

/// `Σ (q·(k − k̃))²` over `queries` (`[m, D]`) and the keys of head 0 from token `from` on.
fn score_error(cache: &KvCache, keys: &[f32], queries: &[f32], from: usize) -> f64 {
    let stream = cache.keys(0);
    let mut scratch = CodecScratch::new(D);
    let mut decoded = vec![0.0f32; D];
    let mut total = 0.0;
    for (t, k) in keys.chunks_exact(D).enumerate().skip(from) {
        stream.decode(t, &mut scratch, &mut decoded).unwrap();
        for q in queries.chunks_exact(D) {
            let e: f64 = q
                .iter()
                .zip(k.iter().zip(&decoded))
                .map(|(&q, (&k, &y))| f64::from(q) * f64::from(k - y))
                .sum();
            total += e * e;
        }
    }
    total
}

#[test]
fn the_plane_basis_cuts_the_score_error_where_the_queries_look() {
    // Fitted on the first 256 tokens (with their queries), measured on the next 512 against
    // fresh queries of the same distribution. The model of the fit predicts, at 4 bits, the
    // score error of the plain rotation times Σ_G (mean κ over G)(Σ ρ over G) D(β_G) /
    // ((Σκ/d)(Σρ) D(4)), about −8 dB for these energies; the test asks for −4 dB. Every
    // input is seeded, so the outcome is fixed; the margin covers the sampling error of 512
    // keys × 64 queries (the ratio's relative standard error is a few percent).
    let energy = query_energy(RopePairs::Adjacent);
    let keys0 = rope_keys(768, 0, RopePairs::Adjacent, 11);
    let keys1 = rope_keys(768, 0, RopePairs::Adjacent, 12);
    let keys = two_heads(&keys0, &keys1, D);
    let values = two_heads(&vectors(768, D, 13), &vectors(768, D, 14), D);
    let fit_queries = queries_with(&energy, 256, 15);
    let later_queries: Vec<f32> = queries_with(&energy, 16, 16);
    let mut with = cache(4, BasisPolicy::Planes);
    let mut without = cache(4, BasisPolicy::None);
    for c in [&mut with, &mut without] {
        c.append_with_queries(
            &keys[..256 * KV * D],
            &values[..256 * KV * D],
            &positions(0, 256),
            &fit_queries,
            Q_HEADS,
        )
        .unwrap();
        c.append(
            &keys[256 * KV * D..],
            &values[256 * KV * D..],
            &positions(256, 512),
        )
        .unwrap();
    }
    assert!(matches!(
        with.keys(0).basis_fit(),
        Some(BasisFit::Planes(_))
    ));
    assert!(matches!(with.keys(0).codec(), TokenCodec::Basis(_)));
    // Values never fit a plane basis.
    assert_eq!(with.values(0).basis_fit(), None);
    let gain = 10.0
        * (score_error(&with, &keys0, &later_queries, 256)
            / score_error(&without, &keys0, &later_queries, 256))
        .log10();
    assert!(gain < -4.0, "score error changed by {gain:.2} dB");
    // Same bytes per token as the plain codec; the fit adds its coordinates and groups.
    assert_eq!(with.bytes_per_token(), without.bytes_per_token());
    let fitted: usize = (0..KV)
        .map(|h| planes_fit(with.keys(h).basis_fit().unwrap().clone()).bytes())
        .sum();
    assert_eq!(with.fixed_bytes(), without.fixed_bytes() + fitted);
}

#[test]
fn each_kv_head_is_fitted_with_its_own_query_heads() {
    // KV head 0's queries (query heads 0, 1) read planes 5, 6, 20; head 1's (2, 3) read
    // planes 30, 31: the heads' fits must lead with those.
    let keys = rope_keys(128, 0, RopePairs::Adjacent, 21);
    let batch = two_heads(&keys, &keys, D);
    let mut second = vec![0.02; D];
    second[60..].fill(4.0);
    let first = query_energy(RopePairs::Adjacent);
    let mut queries = queries_with(&first, 64, 22);
    let other = queries_with(&second, 64, 23);
    for (row, o) in queries
        .chunks_exact_mut(Q_HEADS * D)
        .zip(other.chunks_exact(Q_HEADS * D))
    {
        row[2 * D..].copy_from_slice(&o[2 * D..]);
    }
    let mut c = cache(4, BasisPolicy::Planes);
    c.append_with_queries(&batch, &batch, &positions(0, 128), &queries, Q_HEADS)
        .unwrap();
    let lead = |h: usize| {
        let fit = planes_fit(c.keys(h).basis_fit().unwrap().clone());
        let mut planes: Vec<u16> = fit.components[..4].iter().map(|c| c / 2).collect();
        planes.dedup();
        planes.sort_unstable();
        planes
    };
    // The two leading planes: head 0's best two of 5, 6, 20 (by key magnitude: 20 and 6).
    assert_eq!(lead(0), vec![6, 20]);
    assert_eq!(lead(1), vec![30, 31]);
}

#[test]
fn without_queries_the_stream_stays_on_the_plain_codec() {
    let keys = two_heads(
        &rope_keys(128, 0, RopePairs::Adjacent, 31),
        &rope_keys(128, 0, RopePairs::Adjacent, 32),
        D,
    );
    let mut with = cache(4, BasisPolicy::Planes);
    let mut without = cache(4, BasisPolicy::None);
    for c in [&mut with, &mut without] {
        c.append(&keys, &keys, &positions(0, 128)).unwrap();
    }
    assert_eq!(with.keys(0).basis_fit(), Some(&BasisFit::Identity));
    for h in 0..KV {
        for t in 0..128 {
            assert_eq!(
                with.keys(h).token(t).unwrap().1,
                without.keys(h).token(t).unwrap().1
            );
        }
    }
    // Too few tokens, or queries with no energy: the plain codec too.
    let short = rope_keys(min_basis_tokens(D) - 1, 0, RopePairs::Adjacent, 33);
    let energy = query_energy(RopePairs::Adjacent);
    assert_eq!(
        fit_planes(&short, D, 4, RopePairs::Adjacent, &energy).unwrap(),
        BasisFit::Identity
    );
    let long = rope_keys(128, 0, RopePairs::Adjacent, 34);
    assert_eq!(
        fit_planes(&long, D, 4, RopePairs::Adjacent, &[0.0; D]).unwrap(),
        BasisFit::Identity
    );
    // Every plane alike (same key and query energy): one group at the stream's bits.
    let iso: Vec<f32> = vectors(256, D, 35);
    let flat_keys: Vec<f32> = iso
        .chunks_exact(D)
        .flat_map(|row| {
            // Unit energy in every plane: normalize each plane to the same norm.
            let mut r = row.to_vec();
            for p in 0..PLANES {
                let n = (r[2 * p].powi(2) + r[2 * p + 1].powi(2)).sqrt().max(1e-6);
                r[2 * p] /= n;
                r[2 * p + 1] /= n;
            }
            r
        })
        .collect();
    assert_eq!(
        fit_planes(&flat_keys, D, 4, RopePairs::Adjacent, &[1.0; D]).unwrap(),
        BasisFit::Identity
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

const PLANES_TOML: &str = r#"
name = "planes-k4v4"
description = "test: plane basis on the keys"
key = { codec = "mse", bits = 4, center = "first-chunk", basis = "planes" }
value = { codec = "mse", bits = 4 }
"#;

fn forward(cache: &mut ModelCache, k: &[f32], v: &[f32], seed: u64) -> Vec<f32> {
    let n = k.len() / (KV * D);
    let positions = positions(0, cache.len() + n);
    let shape = AttentionShape {
        q_heads: Q_HEADS,
        scale: 0.125,
    };
    let queries = queries_with(&query_energy(RopePairs::Adjacent), n, seed);
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
fn the_write_then_attend_entry_point_fits_it_and_a_reload_is_bit_identical() {
    let allocation = Allocation::from_toml_str(PLANES_TOML).unwrap();
    let mut cache = ModelCache::with_allocation(specs(), &allocation).unwrap();
    let keys = two_heads(
        &rope_keys(300, 0, RopePairs::Adjacent, 41),
        &rope_keys(300, 0, RopePairs::Adjacent, 42),
        D,
    );
    let values = two_heads(&vectors(300, D, 43), &vectors(300, D, 44), D);
    let split = 200 * KV * D;
    forward(&mut cache, &keys[..split], &values[..split], 45);
    let kv = cache.kv(0).unwrap();
    assert!(matches!(kv.keys(0).basis_fit(), Some(BasisFit::Planes(_))));
    assert!(matches!(kv.keys(1).basis_fit(), Some(BasisFit::Planes(_))));
    let bytes = to_bytes(&cache).unwrap();
    let mut reloaded = from_bytes(&bytes).unwrap();
    assert_eq!(to_bytes(&reloaded).unwrap(), bytes);
    let a = forward(&mut cache, &keys[split..], &values[split..], 46);
    let b = forward(&mut reloaded, &keys[split..], &values[split..], 46);
    assert_eq!(
        a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        b.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
    assert_eq!(to_bytes(&cache).unwrap(), to_bytes(&reloaded).unwrap());
    // The fused kernel on the plane basis agrees with the reference kernel.
    let kv = cache.kv(0).unwrap();
    let shape = AttentionShape {
        q_heads: Q_HEADS,
        scale: 0.125,
    };
    let q = queries_with(&query_energy(RopePairs::Adjacent), 3, 47);
    let p = vec![299, 150, 17];
    let (mut fused, mut exact) = (vec![0.0f32; q.len()], vec![0.0f32; q.len()]);
    attend(kv, &q, &p, shape, AttentionKernel::Fused, &mut fused).unwrap();
    attend(kv, &q, &p, shape, AttentionKernel::Reference, &mut exact).unwrap();
    let scale = exact.iter().fold(0.0f32, |m, v| m.max(v.abs())).max(1.0);
    for (i, (a, b)) in fused.iter().zip(&exact).enumerate() {
        assert!(
            (a - b).abs() <= 2e-4 * scale + 1e-5,
            "output {i}: fused {a} vs reference {b}"
        );
    }
    // A rewind to zero forgets the fit; the next first batch fits again.
    cache.truncate(0).unwrap();
    assert_eq!(cache.kv(0).unwrap().keys(0).basis_fit(), None);
    forward(&mut cache, &keys[..split], &values[..split], 45);
    assert_eq!(
        cache.kv(0).unwrap().keys(0).basis_fit(),
        reloaded.kv(0).unwrap().keys(0).basis_fit()
    );
}

#[test]
fn bad_input_is_a_typed_error() {
    let keys = rope_keys(128, 0, RopePairs::Adjacent, 51);
    let energy = query_energy(RopePairs::Adjacent);
    // Odd or ragged head dimension, query energy of the wrong length.
    assert!(fit_planes(&keys[..63 * 5], 63, 4, RopePairs::Adjacent, &energy[..63]).is_err());
    assert!(fit_planes(&keys[..D + 1], D, 4, RopePairs::Adjacent, &energy).is_err());
    assert!(fit_planes(&keys, D, 4, RopePairs::Adjacent, &energy[..D - 2]).is_err());
    // Non-finite keys, negative or non-finite query energy, unsupported bits.
    let mut nan = keys.clone();
    nan[70] = f32::NAN;
    assert!(fit_planes(&nan, D, 4, RopePairs::Adjacent, &energy).is_err());
    let mut negative = energy.clone();
    negative[3] = -1.0;
    assert!(fit_planes(&keys, D, 4, RopePairs::Adjacent, &negative).is_err());
    let mut inf = energy.clone();
    inf[3] = f64::INFINITY;
    assert!(fit_planes(&keys, D, 4, RopePairs::Adjacent, &inf).is_err());
    assert!(fit_planes(&keys, D, 0, RopePairs::Adjacent, &energy).is_err());
    assert!(fit_planes(&keys, D, 9, RopePairs::Adjacent, &energy).is_err());
    // A coordinate list that repeats or leaves the head is refused by the codec.
    let fit = planes_fit(fit_planes(&keys, D, 4, RopePairs::Adjacent, &energy).unwrap());
    let spec = MseSpec::new(D, 4, 1);
    let mut repeated = fit.clone();
    repeated.components[1] = repeated.components[0];
    assert!(BasisCodec::new(spec, repeated).is_err());
    let mut outside = fit.clone();
    outside.components[0] = D as u16;
    assert!(BasisCodec::new(spec, outside).is_err());
    // Norm correction is not applied by a basis codec: refused, not ignored.
    let corrected = MseSpec {
        norm_correction: true,
        ..spec
    };
    assert!(BasisCodec::new(corrected, fit.clone()).is_err());
    let mut both = fit;
    both.rows = vec![0; both.components.len() * D];
    assert!(BasisCodec::new(spec, both).is_err());
    // Planes on values: a field error naming the field.
    let text = "name = \"x\"\nkey = { codec = \"mse\", bits = 4 }\nvalue = { codec = \"mse\", bits = 4, basis = \"planes\" }\n";
    match Allocation::from_toml_str(text)
        .and_then(|a| a.resolve_stream(0, 4, 0, D, StreamKind::Value))
    {
        Err(AllocationError::Field { path, problem, .. }) => {
            assert!(path.ends_with("value.basis"), "{path}");
            assert_eq!(problem, FieldProblem::PlanesOnValues);
        }
        other => panic!("expected a field error, got {other:?}"),
    }
    // The same on keys resolves, and the TOML spelling round-trips.
    let ok = "name = \"x\"\nkey = { codec = \"mse\", bits = 4, basis = \"planes\" }\nvalue = { codec = \"f16\" }\n";
    let a = Allocation::from_toml_str(ok).unwrap();
    assert_eq!(
        a.resolve_stream(0, 4, 0, D, StreamKind::Key).unwrap().basis,
        BasisPolicy::Planes
    );
    assert_eq!(
        Allocation::from_toml_str(&a.to_toml_string().unwrap()).unwrap(),
        a
    );
}
