//! Mean-centering (`center = "first-chunk"`): a centered stream stores `x − μ` and attention
//! adds the value mean back, so with an unquantized codec the outputs may move only by rounding,
//! and with a quantizing codec the key error shrinks with the mean's share of the key energy.
//!
//! Catches: a value mean not added back (or added twice, or to the wrong GQA group), a key mean
//! subtracted from the body but not from the sink / recent copies (their scores would shift by
//! `q·μ` against the others), a mean recomputed by later chunks, kept across `clear()` or a
//! rewind to zero, lost or altered by save/load, bytes not counted, centering silently disabled,
//! and an unknown `center` value accepted.
//!
//! # The f32 bound (`f32_bound`)
//!
//! With `u = 2⁻²⁴` and `γ(m) = m·u/(1 − m·u)`, per query row over its `n` visible tokens (exact
//! keys `k_t`, values `v_t`, means `μ_k`, `μ_v`, exact softmax `p_t` of the exact scores `s_t`):
//!
//! - each run's f32 score differs from its exact score (up to the constant `q·μ_k`) by at most
//!   `γ(d + 3)·scale·Σ_j |q_j|·|k_tj|` (uncentered) or the same with `|k_tj − μ_kj|` (centered):
//!   `d` products, `d − 1` additions in any order, the scale, and for the centered run the one
//!   rounding of the stored `fl(k − μ)`. Their sum over both runs, maximized over `t`, is `E`;
//!   the subtraction of the running max rounds once more, `u·(R + E)` per run with `R` the range
//!   of the exact scores. So the two runs' weights differ by a factor of at most
//!   `exp(2E')·(1 + 2⁻²²)²·(1 + γ(n))² = 1 + ρ` (`E' = E + 2u(R + E)`; the 2-ulp `exp` and the
//!   normalizing sum of each run);
//! - `Σ p̂ v` in f32 with its normalization costs at most `γ(2n + 4)·Σ_t p_t|v_tj|` per run (with
//!   `|v_tj − μ_vj|` for the centered run, whose stored `fl(v − μ)` is one rounding more), and
//!   `Σ_t (p̂_t − p̂'_t)(v_tj − μ_vj)` (the weights sum to one, so `μ_v` drops out) at most
//!   `ρ·Σ_t p_t|v_tj − μ_vj|`; adding `μ_v` back rounds once, `u·(|o_j| + |μ_vj|)`.
//!
//! Their sum, doubled to cover the second-order terms dropped above, is `f32_bound`. With the
//! test data (means of 4σ per coordinate) it is 1e-5 to 1e-4 per coordinate (the largest
//! difference measured is under 5% of it), while a missing or doubled value mean moves an
//! output by ~4 and an uncentered sink by ~10.

mod common;

use common::codec;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use rand_distr::{Distribution, StandardNormal};
use tq_cache::allocation::{Allocation, AllocationError, FieldProblem, StreamKind};
use tq_cache::attention::simd::Isa;
use tq_cache::attention::{AttentionKernel, AttentionShape, attend};
use tq_cache::center::{CenterPolicy, MIN_CENTER_TOKENS, first_chunk_mean};
use tq_cache::codec::CodecScratch;
use tq_cache::kv_cache::{KvCache, KvKind, KvLayout, uniform_streams};
use tq_cache::persist::{FORMAT_VERSION, PersistError, from_bytes, to_bytes};
use tq_cache::states::{ModelCache, StateKind, StateSpec};
use tq_cache::stream::StreamLayout;
use tq_cache::token_store::Growth;
use tq_cache::{CacheError, CodecSpec};

const KV: usize = 2;
/// Two query heads per KV head: every test crosses a GQA group.
const Q: usize = 4;
const D: usize = 64;
const SHAPE: AttentionShape = AttentionShape {
    q_heads: Q,
    scale: 0.125,
};
/// Standard deviation of each coordinate of a head's mean, against 1 for the spread: the mean
/// holds 16/17 of the energy.
const MEAN_SD: f32 = 4.0;
const U: f64 = 1.0 / (1u64 << 24) as f64;

fn config(cases: u32) -> Config {
    Config {
        cases,
        rng_seed: RngSeed::Fixed(0xCE47_E400),
        failure_persistence: None,
        ..Config::default()
    }
}

fn gaussians(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    (0..n).map(|_| StandardNormal.sample(&mut rng)).collect()
}

/// `[n, KV, D]` rows: per head a common mean (coordinates N(0, MEAN_SD²), fixed by
/// `mean_seed`, so successive chunks share it) plus N(0, 1) noise drawn from `seed`.
fn with_mean(n: usize, mean_seed: u64, seed: u64) -> Vec<f32> {
    let means = gaussians(KV * D, mean_seed);
    gaussians(n * KV * D, seed)
        .into_iter()
        .enumerate()
        .map(|(i, z)| MEAN_SD * means[i % (KV * D)] + z)
        .collect()
}

fn growing(max_rewind: usize) -> KvLayout {
    KvLayout {
        kv_heads: KV,
        head_dim: D,
        kind: KvKind::Growing {
            growth: Growth::Doubling { initial: 16 },
        },
        max_rewind,
        rope_pairs: tq_cache::basis::RopePairs::Adjacent,
        rope_base: Default::default(),
    }
}

/// Stream layouts of one codec, centered or not, with full-precision f32 sinks and recent
/// copies.
fn streams(
    layout: &KvLayout,
    spec: CodecSpec,
    center: CenterPolicy,
    sinks: usize,
    recent: usize,
) -> Vec<StreamLayout> {
    uniform_streams(layout, spec)
        .into_iter()
        .map(|mut s| {
            s.center = center;
            s.fp = CodecSpec::F32 { dim: D };
            s.sink_tokens = sinks;
            s.recent_tokens = recent;
            s
        })
        .collect()
}

fn centered(yes: bool) -> CenterPolicy {
    if yes {
        CenterPolicy::FirstChunk
    } else {
        CenterPolicy::None
    }
}

/// A cache with the given key / value codecs and centering.
fn cache(key: CodecSpec, value: CodecSpec, center_keys: bool, center_values: bool) -> KvCache {
    let layout = growing(0);
    KvCache::new(
        layout,
        &streams(&layout, key, centered(center_keys), 0, 0),
        &streams(&layout, value, centered(center_values), 0, 0),
    )
    .unwrap()
}

/// Appends `n` tokens after what the cache holds.
fn append(cache: &mut KvCache, k: &[f32], v: &[f32]) {
    let start = cache.len() as u32;
    let n = k.len() / (KV * D);
    let positions: Vec<u32> = (start..start + n as u32).collect();
    cache.append(k, v, &positions).unwrap();
}

/// Attention of `queries` (`[m, Q, D]`) for the newest `m` tokens.
fn attend_newest(cache: &KvCache, queries: &[f32], kernel: AttentionKernel) -> Vec<f32> {
    let m = queries.len() / (Q * D);
    let positions: Vec<u32> = (cache.len() - m..cache.len()).map(|p| p as u32).collect();
    let mut out = vec![0.0; queries.len()];
    attend(cache, queries, &positions, SHAPE, kernel, &mut out).unwrap();
    out
}

fn gamma(m: usize) -> f64 {
    m as f64 * U / (1.0 - m as f64 * U)
}

/// The exact softmax weights of `q` over `keys` (`[n, D]` rows), in f64.
fn exact_weights(q: &[f32], keys: &[&[f32]], scale: f32) -> Vec<f64> {
    let scores: Vec<f64> = keys
        .iter()
        .map(|k| {
            f64::from(scale)
                * q.iter()
                    .zip(*k)
                    .map(|(&a, &b)| f64::from(a) * f64::from(b))
                    .sum::<f64>()
        })
        .collect();
    let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let w: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
    let total: f64 = w.iter().sum();
    w.into_iter().map(|x| x / total).collect()
}

/// Exact attention of one query row in f64.
fn exact_output(q: &[f32], keys: &[&[f32]], values: &[&[f32]], scale: f32) -> Vec<f64> {
    let p = exact_weights(q, keys, scale);
    (0..D)
        .map(|j| p.iter().zip(values).map(|(p, v)| p * f64::from(v[j])).sum())
        .collect()
}

/// The bound derived in the module docs: how far the outputs of one f32 kernel may move
/// between uncentered and centered storage (means `mu_k`, `mu_v`; zeros if not centered).
fn f32_bound(
    q: &[f32],
    keys: &[&[f32]],
    values: &[&[f32]],
    mu_k: &[f32],
    mu_v: &[f32],
    scale: f32,
) -> Vec<f64> {
    let n = keys.len();
    let scale64 = f64::from(scale);
    let terms = |k: &[f32]| -> f64 {
        scale64
            * q.iter()
                .zip(k)
                .zip(mu_k)
                .map(|((&a, &b), &m)| {
                    f64::from(a).abs() * (f64::from(b).abs() + (f64::from(b) - f64::from(m)).abs())
                })
                .sum::<f64>()
    };
    let e = gamma(D + 3) * keys.iter().map(|k| terms(k)).fold(0.0, f64::max);
    let scores: Vec<f64> = keys
        .iter()
        .map(|k| {
            scale64
                * q.iter()
                    .zip(*k)
                    .map(|(&a, &b)| f64::from(a) * f64::from(b))
                    .sum::<f64>()
        })
        .collect();
    let range = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max)
        - scores.iter().copied().fold(f64::INFINITY, f64::min);
    let e_total = e + 2.0 * U * (range + e);
    let rho = (2.0 * e_total).exp() * (1.0 + 4.0 * U).powi(2) * (1.0 + gamma(n)).powi(2) - 1.0;
    let p = exact_weights(q, keys, scale);
    (0..D)
        .map(|j| {
            let (mut plain, mut shifted) = (0.0, 0.0);
            for (p, v) in p.iter().zip(values) {
                let x = f64::from(v[j]);
                plain += p * x.abs();
                shifted += p * (x - f64::from(mu_v[j])).abs();
            }
            let o: f64 = p.iter().zip(values).map(|(p, v)| p * f64::from(v[j])).sum();
            2.0 * (rho * shifted
                + gamma(2 * n + 4) * (plain + shifted)
                + U * (o.abs() + f64::from(mu_v[j]).abs()))
        })
        .collect()
}

/// Rows of a `[n, KV, D]` tensor for KV head `g`.
fn head_rows(x: &[f32], g: usize) -> Vec<&[f32]> {
    x.chunks_exact(KV * D)
        .map(|row| &row[g * D..(g + 1) * D])
        .collect()
}

/// Checks `centered` against `plain` (outputs for the newest `m` queries of a cache of `len`
/// tokens whose true keys / values are `k` / `v`) within [`f32_bound`].
#[allow(clippy::too_many_arguments)]
fn assert_within_f32_bound(
    plain: &[f32],
    centered: &[f32],
    queries: &[f32],
    k: &[f32],
    v: &[f32],
    means: (&KvCache, usize),
    what: &str,
) {
    let (cache, len) = means;
    let m = queries.len() / (Q * D);
    let zeros = [0.0f32; D];
    for (row, q) in queries.chunks_exact(D).enumerate() {
        let (i, h) = (row / Q, row % Q);
        let g = h / (Q / KV);
        let visible = len - m + i + 1;
        let keys = &head_rows(k, g)[..visible];
        let values = &head_rows(v, g)[..visible];
        let mu_k = cache.keys(g).mean().unwrap_or(&zeros);
        let mu_v = cache.values(g).mean().unwrap_or(&zeros);
        let bound = f32_bound(q, keys, values, mu_k, mu_v, SHAPE.scale);
        for j in 0..D {
            let (a, b) = (plain[row * D + j], centered[row * D + j]);
            let diff = (f64::from(a) - f64::from(b)).abs();
            assert!(
                diff <= bound[j],
                "{what}: row {row} coordinate {j}: uncentered {a} vs centered {b}, \
                 |diff| {diff:e} > bound {:e}",
                bound[j]
            );
        }
    }
}

/// The f32 kernels: the reference, the fused kernel, and the fused kernel on every instruction
/// set this CPU has.
fn f32_kernels() -> Vec<AttentionKernel> {
    let mut kernels = vec![AttentionKernel::Reference, AttentionKernel::Fused];
    kernels.extend(Isa::available().into_iter().map(AttentionKernel::FusedOn));
    kernels
}

proptest! {
    #![proptest_config(config(24))]

    /// f32 caches, keys and values centered or not: every f32 kernel's outputs agree within
    /// the derived rounding bound, after a prefill chunk and after chunked appends that reuse
    /// its mean. 24 cases × 4–5 kernels × up to 60 tokens: each case runs in milliseconds.
    #[test]
    fn f32_centering_moves_outputs_only_by_rounding(
        first in MIN_CENTER_TOKENS..48,
        chunks in prop::collection::vec(1usize..5, 0..4),
        center_keys in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let f32 = CodecSpec::F32 { dim: D };
        let mut plain = cache(f32, f32, false, false);
        let mut cent = cache(f32, f32, center_keys, true);
        let (mut k, mut v) = (Vec::new(), Vec::new());
        for (step, n) in std::iter::once(first).chain(chunks).enumerate() {
            let s = seed.wrapping_add(step as u64 * 7919);
            let (kn, vn) = (with_mean(n, seed ^ 1, s), with_mean(n, seed ^ 2, s ^ 3));
            append(&mut plain, &kn, &vn);
            append(&mut cent, &kn, &vn);
            k.extend(kn);
            v.extend(vn);
            let queries = gaussians(n * Q * D, s ^ 5);
            for kernel in f32_kernels() {
                let a = attend_newest(&plain, &queries, kernel);
                let b = attend_newest(&cent, &queries, kernel);
                assert_within_f32_bound(&a, &b, &queries, &k, &v, (&cent, cent.len()), &format!("{kernel:?} step {step}"));
            }
        }
        for g in 0..KV {
            let mean = cent.values(g).mean().expect("values are centered");
            let expected = first_chunk_mean(&head_rows(&v, g)[..first].concat(), D).unwrap();
            prop_assert_eq!(mean, &expected[..], "later chunks reuse the first chunk's mean");
            prop_assert_eq!(cent.keys(g).mean().is_some(), center_keys);
        }
    }
}

/// Values on a grid of 1/4 in a few units: exact in f16 and f32, as are their differences, the
/// exact batch mean and every dot product with queries on a grid of 1/2 (sums of at most 64
/// multiples of 1/8 below 2¹⁰: exact in f32 in any order).
fn dyadic(n: usize, mean: &[f32], seed: u64) -> Vec<f32> {
    // Pairs `μ ± δ`: the batch mean is exactly μ.
    let deltas = gaussians(n.div_ceil(2) * KV * D, seed);
    let mut out = vec![0.0f32; n * KV * D];
    for t in 0..n {
        for i in 0..KV * D {
            let delta = (deltas[(t / 2) * KV * D + i] * 4.0)
                .round()
                .clamp(-8.0, 8.0)
                / 4.0;
            out[t * KV * D + i] = mean[i] + if t % 2 == 0 { delta } else { -delta };
        }
    }
    out
}

fn dyadic_mean(seed: u64) -> Vec<f32> {
    gaussians(KV * D, seed)
        .into_iter()
        .map(|g| (g * 12.0).round().clamp(-32.0, 32.0) / 4.0)
        .collect()
}

/// The llama.cpp-compatible kernel takes only f16 streams without sinks or recent copies.
///
/// Keys: on dyadic data every score is an exact dyadic rational in both runs and the centered
/// scores are the uncentered ones minus the same exact constant, so every `s − max`, weight,
/// comparison and rescale is bit-identical — and with uncentered values so is the output.
///
/// Values: the weights are again identical, and only the f16 accumulator rounds differently.
/// Each token rounds it at most twice (rescale, then add), each rounding at most
/// `2⁻¹¹·|x| + 2⁻²⁵` (f16 unit roundoff, half the subnormal spacing), and in the final frame
/// `|x| ≤ 1.01·S·Σ_t p_t|v_t|`; dividing by `S ≥ 1` gives `1.01·2n·2⁻¹¹·Σ p|v| + 2n·2⁻²⁵` per
/// run (with `|v − μ|` for the centered run). The f32 denominator `S` (one fused rounding per
/// token, `γ(2n)`) multiplies the mean the centered run adds back, and the final scaling and
/// the add round once each. Doubled for second-order terms. At n ≤ 24 this is ~0.1 of
/// `|μ| ≈ 4`: a missing or doubled mean is 20× over it.
#[test]
fn llamacpp_f16_keys_are_bit_identical_and_values_within_f16_rounding() {
    let f16 = CodecSpec::F16 { dim: D };
    for seed in 0..8u64 {
        let (mk, mv) = (dyadic_mean(seed), dyadic_mean(seed + 100));
        let k = dyadic(24, &mk, seed + 200);
        let v = dyadic(24, &mv, seed + 300);
        let queries: Vec<f32> = gaussians(24 * Q * D, seed + 400)
            .into_iter()
            .map(|g| (g * 2.0).round().clamp(-2.0, 2.0) / 2.0)
            .collect();
        let mut plain = cache(f16, f16, false, false);
        let mut keys_only = cache(f16, f16, true, false);
        let mut both = cache(f16, f16, true, true);
        for c in [&mut plain, &mut keys_only, &mut both] {
            // A prefill of 16 (the mean) and decode-sized chunks after it.
            append(c, &k[..16 * KV * D], &v[..16 * KV * D]);
            append(
                c,
                &k[16 * KV * D..20 * KV * D],
                &v[16 * KV * D..20 * KV * D],
            );
            append(c, &k[20 * KV * D..], &v[20 * KV * D..]);
        }
        for g in 0..KV {
            assert_eq!(keys_only.keys(g).mean().unwrap(), &mk[g * D..(g + 1) * D]);
            assert_eq!(both.values(g).mean().unwrap(), &mv[g * D..(g + 1) * D]);
        }
        let positions: Vec<u32> = (0..24).collect();
        let run = |c: &KvCache| {
            let mut out = vec![0.0; queries.len()];
            attend(
                c,
                &queries,
                &positions,
                SHAPE,
                AttentionKernel::LlamaCppF16,
                &mut out,
            )
            .unwrap();
            out
        };
        let (a, b, c) = (run(&plain), run(&keys_only), run(&both));
        assert_eq!(
            a.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            b.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            "seed {seed}: centered keys must not change a single bit"
        );
        for (row, q) in queries.chunks_exact(D).enumerate() {
            let (i, h) = (row / Q, row % Q);
            let g = h / (Q / KV);
            let n = i + 1;
            let p = exact_weights(q, &head_rows(&k, g)[..n], SHAPE.scale);
            let values = &head_rows(&v, g)[..n];
            for j in 0..D {
                let mu = f64::from(mv[g * D + j]);
                let (mut plain_abs, mut shifted_abs) = (0.0, 0.0);
                for (p, v) in p.iter().zip(values) {
                    plain_abs += p * f64::from(v[j]).abs();
                    shifted_abs += p * (f64::from(v[j]) - mu).abs();
                }
                let n = n as f64;
                let bound = 2.0
                    * (1.01 * 2.0 * n * 2f64.powi(-11) * (plain_abs + shifted_abs)
                        + 4.0 * n * 2f64.powi(-25)
                        + gamma(2 * i + 2) * mu.abs()
                        + 2.0 * U * (f64::from(a[row * D + j]).abs() + mu.abs()));
                let diff = (f64::from(a[row * D + j]) - f64::from(c[row * D + j])).abs();
                assert!(
                    diff <= bound,
                    "seed {seed} row {row} coord {j}: |diff| {diff} > {bound}"
                );
            }
        }
    }
}

/// Shift-free score error energy of one cache's stored keys: per query, the variance over
/// tokens of `q·k̃_t − q·k_t` (the stored domain's constant `−q·μ` drops out), summed.
fn score_error_energy(cache: &KvCache, keys: &[f32], queries: &[f32]) -> f64 {
    let n = cache.len();
    let mut scratch = CodecScratch::new(D);
    let mut stored = vec![0.0f32; D];
    let mut energy = 0.0;
    let decoded: Vec<Vec<f32>> = (0..n)
        .map(|t| {
            cache.keys(0).decode(t, &mut scratch, &mut stored).unwrap();
            stored.clone()
        })
        .collect();
    for q in queries.chunks_exact(D) {
        let dot = |a: &[f32]| -> f64 {
            q.iter()
                .zip(a)
                .map(|(&x, &y)| f64::from(x) * f64::from(y))
                .sum()
        };
        let errors: Vec<f64> = (0..n)
            .map(|t| dot(&decoded[t]) - dot(&keys[t * D..(t + 1) * D]))
            .collect();
        let mean = errors.iter().sum::<f64>() / n as f64;
        energy += errors.iter().map(|e| (e - mean).powi(2)).sum::<f64>();
    }
    energy
}

/// Keys with a large mean (norm 3× the spread: 90% of the energy) through 3-bit TQ_mse: the
/// shift-free score error is much smaller centered than uncentered.
///
/// Theory: TQ_mse's error energy is a fixed fraction of `‖x‖²`, so centering scales it by
/// `‖k − μ‖²/‖k‖² ≈ 0.1`. Each trial (fresh mean, keys, queries and rotation seed) sums 8
/// queries × 64 tokens of squared errors, so its ratio stays within a factor of two of 0.1
/// except with small probability; we assume only that a trial's ratio is below 0.5 with
/// probability p ≥ 0.9 (measured: all 32 trials, ratios 0.097–0.141, mean 0.116). The
/// test needs at least 16 of 32 independent trials below 0.5: by Chernoff,
/// P(Bin(32, 0.9) < 16) ≤ exp(−32·KL(0.5‖0.9)) = exp(−16.4) ≈ 8e-8 < 1e-6.
/// If centering were silently disabled both caches would store the same bits, every ratio
/// would be exactly 1 and no trial would count.
///
/// The same trials also compare attention outputs (Fused kernel, f32 values) with exact f64
/// attention, by the same rule: centering must cut the squared output error below half in
/// at least 16 of 32 trials (measured: all 32, ratios 0.064–0.291, mean 0.140; the softmax
/// makes this ratio less concentrated than the scores', still far below 0.5).
#[test]
fn centering_cuts_the_key_error_of_a_quantizing_codec() {
    const TRIALS: usize = 32;
    const N: usize = 64;
    const QUERIES: usize = 8;
    let layout = KvLayout {
        kv_heads: 1,
        ..growing(0)
    };
    let (mut score_wins, mut output_wins) = (0, 0);
    let (mut score_ratios, mut output_ratios) = (Vec::new(), Vec::new());
    for trial in 0..TRIALS as u64 {
        let mse = codec(2, D, 3, 0xC0DE + trial);
        let f32 = CodecSpec::F32 { dim: D };
        let build = |center| {
            KvCache::new(
                layout,
                &streams(&layout, mse, center, 0, 0),
                &streams(&layout, f32, CenterPolicy::None, 0, 0),
            )
            .unwrap()
        };
        let (mut plain, mut cent) = (build(CenterPolicy::None), build(CenterPolicy::FirstChunk));
        // A mean of norm 3·√D against noise of norm ≈ √D.
        let direction = gaussians(D, 1000 + trial);
        let norm = direction.iter().map(|x| x * x).sum::<f32>().sqrt();
        let noise = gaussians(N * D, 2000 + trial);
        let keys: Vec<f32> = noise
            .iter()
            .enumerate()
            .map(|(i, z)| 3.0 * (D as f32).sqrt() * direction[i % D] / norm + z)
            .collect();
        let values = gaussians(N * D, 3000 + trial);
        let positions: Vec<u32> = (0..N as u32).collect();
        for c in [&mut plain, &mut cent] {
            c.append(&keys, &values, &positions).unwrap();
        }
        let mean = cent.keys(0).mean().expect("the keys are centered");
        assert!(mean.iter().map(|m| m * m).sum::<f32>() > 8.0 * D as f32);
        let queries = gaussians(QUERIES * D, 4000 + trial);
        let ratio = score_error_energy(&cent, &keys, &queries)
            / score_error_energy(&plain, &keys, &queries);
        score_wins += usize::from(ratio < 0.5);
        score_ratios.push(ratio);

        // Output error against exact attention, the last QUERIES tokens as queries.
        let shape = AttentionShape {
            q_heads: 1,
            scale: 0.125,
        };
        let query_positions: Vec<u32> = (N - QUERIES..N).map(|p| p as u32).collect();
        let squared_error = |c: &KvCache| -> f64 {
            let mut out = vec![0.0; queries.len()];
            attend(
                c,
                &queries,
                &query_positions,
                shape,
                AttentionKernel::Fused,
                &mut out,
            )
            .unwrap();
            let mut total = 0.0;
            for (i, (q, o)) in queries.chunks_exact(D).zip(out.chunks_exact(D)).enumerate() {
                let visible = N - QUERIES + i + 1;
                let key_rows: Vec<&[f32]> = keys.chunks_exact(D).take(visible).collect();
                let value_rows: Vec<&[f32]> = values.chunks_exact(D).take(visible).collect();
                let exact = exact_output(q, &key_rows, &value_rows, 0.125);
                total += exact
                    .iter()
                    .zip(o)
                    .map(|(e, &o)| (e - f64::from(o)).powi(2))
                    .sum::<f64>();
            }
            total
        };
        let ratio = squared_error(&cent) / squared_error(&plain);
        output_wins += usize::from(ratio < 0.5);
        output_ratios.push(ratio);
    }
    let summary = |r: &[f64]| {
        let mean = r.iter().sum::<f64>() / r.len() as f64;
        let min = r.iter().copied().fold(f64::INFINITY, f64::min);
        let max = r.iter().copied().fold(0.0, f64::max);
        format!("mean {mean:.3} (min {min:.3}, max {max:.3})")
    };
    eprintln!(
        "centered / uncentered over {TRIALS} trials: score error energy {}, squared output \
         error {}",
        summary(&score_ratios),
        summary(&output_ratios)
    );
    assert!(
        score_wins >= TRIALS / 2,
        "score error: {score_wins} of {TRIALS} trials, ratios {score_ratios:?}"
    );
    assert!(
        output_wins >= TRIALS / 2,
        "output error: {output_wins} of {TRIALS} trials, ratios {output_ratios:?}"
    );
}

fn allocation(text: &str) -> Allocation {
    Allocation::from_toml_str(text).unwrap()
}

fn f32_allocation(center: &str, extra: &str) -> Allocation {
    allocation(&format!(
        "name = \"t\"\nfp_dtype = \"f32\"\n{extra}\nkey = {{ codec = \"f32\", center = \"{center}\" }}\n\
         value = {{ codec = \"f32\", center = \"{center}\" }}\n"
    ))
}

/// Layer 0 writes a cache, layer 1 shares it (KV sharing): both read through `attend`, so the
/// value means reach a sharer's outputs too, across GQA groups.
fn shared_specs() -> Vec<StateSpec> {
    vec![
        StateSpec {
            name: "blk.0.kv".into(),
            kind: StateKind::Kv {
                layer: 0,
                layout: growing(2),
            },
        },
        StateSpec {
            name: "blk.1.kv".into(),
            kind: StateKind::SharedKv {
                layer: 1,
                source_layer: 0,
            },
        },
        StateSpec {
            name: "blk.1.conv".into(),
            kind: StateKind::Fixed { shape: vec![3, 4] },
        },
    ]
}

/// Runs layers 0 and 1 over chunks of 20, 3, 1 and 1 tokens after what the cache holds;
/// returns each call's queries and outputs.
fn run_shared(cache: &mut ModelCache, kernel: AttentionKernel, seed: u64) -> Vec<Vec<f32>> {
    let mut outputs = Vec::new();
    let mut len = cache.len();
    for (step, n) in [20usize, 3, 1, 1].into_iter().enumerate() {
        let s = seed + step as u64;
        let (k, v) = (with_mean(n, seed, s), with_mean(n, seed + 1, s + 50));
        let positions: Vec<u32> = (0..(len + n) as u32).collect();
        for layer in 0..2 {
            let q = gaussians(n * Q * D, s * 3 + layer as u64);
            let mut out = vec![0.0; q.len()];
            let kv = (layer == 0).then_some((&k[..], &v[..]));
            cache
                .forward_layer(layer, &q, kv, &positions, SHAPE, kernel, &mut out)
                .unwrap();
            outputs.push(q);
            outputs.push(out);
        }
        len += n;
    }
    outputs
}

/// Value add-back across GQA groups and through a shared-KV layer, from an allocation file:
/// f32 caches with and without `center = "first-chunk"` agree within the f32 bound, for the
/// reference and the fused kernel.
#[test]
fn value_means_are_added_back_for_every_query_head_and_for_sharers() {
    for kernel in [AttentionKernel::Reference, AttentionKernel::Fused] {
        let mut plain =
            ModelCache::with_allocation(shared_specs(), &f32_allocation("none", "")).unwrap();
        let mut cent =
            ModelCache::with_allocation(shared_specs(), &f32_allocation("first-chunk", ""))
                .unwrap();
        let (a, b) = (
            run_shared(&mut plain, kernel, 9),
            run_shared(&mut cent, kernel, 9),
        );
        let kv = cent.kv(0).unwrap();
        for g in 0..KV {
            assert!(
                kv.values(g)
                    .mean()
                    .is_some_and(|m| m.iter().any(|&x| x != 0.0))
            );
        }
        // Rebuild the true keys and values each call saw (the same generator).
        let (mut k, mut v) = (Vec::new(), Vec::new());
        let mut call = 0;
        for (step, n) in [20usize, 3, 1, 1].into_iter().enumerate() {
            let s = 9 + step as u64;
            k.extend(with_mean(n, 9, s));
            v.extend(with_mean(n, 10, s + 50));
            for layer in 0..2 {
                let queries = &a[call];
                assert_eq!(queries, &b[call]);
                assert_within_f32_bound(
                    &a[call + 1],
                    &b[call + 1],
                    queries,
                    &k,
                    &v,
                    (kv, k.len() / (KV * D)),
                    &format!("{kernel:?} step {step} layer {layer}"),
                );
                call += 2;
            }
        }
    }
}

/// Centering is per stream, layer and head like every stream field: an override centers the
/// values of KV head 1 of layer 0 only, and a boundary rule the keys of the first and last
/// layers.
#[test]
fn center_resolves_per_layer_head_and_stream() {
    let a = allocation(
        "name = \"t\"\nkey = { codec = \"mse\", bits = 4 }\nvalue = { codec = \"mse\", bits = 4 }\n\
         [boundary]\nlayers = 1\nkey = { center = \"first-chunk\" }\n\
         [[override]]\nlayers = [0]\nheads = [1]\nvalue = { center = \"first-chunk\", codec = \"f16\" }\n",
    );
    for layer in 0..4 {
        for head in 0..2 {
            for stream in StreamKind::BOTH {
                let r = a.resolve_stream(layer, 4, head, D, stream).unwrap();
                let expected = match stream {
                    StreamKind::Key => layer == 0 || layer == 3,
                    StreamKind::Value => layer == 0 && head == 1,
                };
                assert_eq!(
                    r.center.is_centered(),
                    expected,
                    "layer {layer} head {head} {stream}"
                );
                assert_eq!(
                    r.metadata_bytes_per_head(),
                    if expected { 4 * D } else { 0 },
                    "the mean is per-head metadata"
                );
                assert_eq!(r.plan, a.resolve(layer, 4, head, D, stream).unwrap());
            }
        }
    }
    let layout = growing(0);
    let c = KvCache::with_allocation(layout, &a, 0, 4).unwrap();
    assert_eq!(c.values(0).center(), CenterPolicy::None);
    assert_eq!(c.values(1).center(), CenterPolicy::FirstChunk);
    assert_eq!(c.keys(1).center(), CenterPolicy::FirstChunk);
    // Writing the allocation back out keeps the field.
    assert_eq!(allocation(&a.to_toml_string().unwrap()), a);
}

fn f32_cache(center: bool, sinks: usize, recent: usize, max_rewind: usize) -> KvCache {
    let layout = growing(max_rewind);
    let f32 = CodecSpec::F32 { dim: D };
    KvCache::new(
        layout,
        &streams(&layout, f32, centered(center), sinks, recent),
        &streams(&layout, f32, centered(center), sinks, recent),
    )
    .unwrap()
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

/// Mean-centered storage of a head's tokens `t` as f32: `fl(x − μ)`, what `decode` returns.
fn stored(cache: &KvCache, g: usize, t: usize, value: bool) -> Vec<f32> {
    let stream = if value {
        cache.values(g)
    } else {
        cache.keys(g)
    };
    let mut out = vec![0.0; D];
    stream
        .decode(t, &mut CodecScratch::new(D), &mut out)
        .unwrap();
    out
}

/// First-chunk semantics: later chunks reuse μ; `clear()` and `truncate(0)` forget it (the
/// emptied cache is bit for bit a fresh one); `truncate(k > 0)` keeps it; a first batch below
/// `MIN_CENTER_TOKENS` gives μ = 0 and then exactly an uncentered cache's bits; a first append
/// that fails leaves no mean behind.
#[test]
fn the_mean_comes_from_the_first_chunk_and_is_forgotten_with_it() {
    let (k1, v1) = (with_mean(12, 1, 2), with_mean(12, 3, 4));
    let (k2, v2) = (with_mean(5, 1, 5), with_mean(5, 3, 6));
    let mut c = f32_cache(true, 0, 0, 0);
    append(&mut c, &k1, &v1);
    let mu: Vec<Vec<f32>> = (0..KV)
        .map(|g| c.keys(g).mean().unwrap().to_vec())
        .collect();
    for (g, m) in mu.iter().enumerate() {
        assert_eq!(
            m,
            &first_chunk_mean(&head_rows(&k1, g).concat(), D).unwrap()
        );
    }
    append(&mut c, &k2, &v2);
    for (g, mu) in mu.iter().enumerate() {
        assert_eq!(c.keys(g).mean().unwrap(), &mu[..], "a later chunk reuses μ");
        // A later token is stored as fl(x − μ) with the first chunk's μ, and reconstructs.
        let x = head_rows(&k2, g)[4];
        let expected: Vec<f32> = x.iter().zip(mu).map(|(a, m)| a - m).collect();
        assert_eq!(bits(&stored(&c, g, 16, false)), bits(&expected));
        let mut back = vec![0.0; D];
        c.keys(g)
            .reconstruct(16, &mut CodecScratch::new(D), &mut back)
            .unwrap();
        for ((b, a), m) in back.iter().zip(x).zip(mu) {
            // fl(fl(x − μ) + μ): one rounding of x − μ, one of x (ε = 2u covers both).
            assert!((b - a).abs() <= f32::EPSILON * ((a - m).abs() + a.abs()));
        }
    }
    let queries = gaussians(Q * D, 77);
    // truncate(k > 0) keeps μ; re-appending gives what never dropping would.
    let before = attend_newest(&c, &queries, AttentionKernel::Fused);
    c.truncate(14).unwrap();
    assert_eq!(c.keys(0).mean().unwrap(), &mu[0][..]);
    append(&mut c, &k2[2 * KV * D..], &v2[2 * KV * D..]);
    assert_eq!(
        bits(&attend_newest(&c, &queries, AttentionKernel::Fused)),
        bits(&before)
    );

    // clear() and truncate(0) forget μ: the next first batch chooses a new one, and the cache
    // is bit for bit a fresh cache fed that batch.
    let mut fresh = f32_cache(true, 0, 0, 0);
    append(&mut fresh, &k2, &v2);
    let expected = attend_newest(&fresh, &queries, AttentionKernel::Fused);
    for forget in [KvCache::clear as fn(&mut KvCache), |c: &mut KvCache| {
        c.truncate(0).unwrap()
    }] {
        let mut d = c.clone();
        forget(&mut d);
        assert!(d.keys(0).mean().is_none() && d.values(1).mean().is_none());
        append(&mut d, &k2, &v2);
        for g in 0..KV {
            assert_eq!(d.values(g).mean(), fresh.values(g).mean());
        }
        assert_eq!(
            bits(&attend_newest(&d, &queries, AttentionKernel::Fused)),
            bits(&expected)
        );
    }

    // A first batch of MIN_CENTER_TOKENS − 1 tokens: μ = 0, kept by later chunks, and every
    // output bit equals an uncentered cache's — f32 and 3-bit TQ_mse alike.
    for spec in [CodecSpec::F32 { dim: D }, codec(2, D, 3, 11)] {
        let mut short = cache(spec, spec, true, true);
        let mut plain = cache(spec, spec, false, false);
        let short_k = with_mean(MIN_CENTER_TOKENS - 1, 1, 8);
        let short_v = with_mean(MIN_CENTER_TOKENS - 1, 3, 9);
        for x in [&mut short, &mut plain] {
            append(x, &short_k, &short_v);
        }
        assert_eq!(
            short.keys(0).mean().unwrap(),
            &[0.0; D][..],
            "too few tokens: μ = 0"
        );
        for x in [&mut short, &mut plain] {
            append(x, &k1, &v1);
        }
        assert_eq!(
            short.values(1).mean().unwrap(),
            &[0.0; D][..],
            "μ = 0 is kept, not recomputed"
        );
        let queries = gaussians(3 * Q * D, 78);
        for kernel in [AttentionKernel::Reference, AttentionKernel::Fused] {
            assert_eq!(
                bits(&attend_newest(&short, &queries, kernel)),
                bits(&attend_newest(&plain, &queries, kernel))
            );
        }
    }

    // A first append that fails (a NaN value) leaves no mean: the next batch chooses it.
    let mut failed = f32_cache(true, 0, 0, 0);
    let mut bad = v2.clone();
    bad[KV * D + 3] = f32::NAN;
    let positions: Vec<u32> = (0..5).collect();
    assert!(matches!(
        failed.append(&k1[..5 * KV * D], &bad, &positions),
        Err(CacheError::Codec(_))
    ));
    assert!(
        failed.is_empty() && failed.keys(0).mean().is_none() && failed.values(1).mean().is_none()
    );
    append(&mut failed, &k2, &v2);
    assert_eq!(
        bits(&attend_newest(&failed, &queries, AttentionKernel::Fused)),
        bits(&expected)
    );
}

/// Sinks and recent-window copies are stored centered, like the body: with `sink_tokens = 2`,
/// `recent_fp_tokens = 4` and an f32 body, centering moves the outputs only within the f32
/// bound; with a 3-bit body the full-precision copies decode to exactly `fl(x − μ)`. A rewind
/// within `max_rewind` stays exact.
#[test]
fn sinks_and_recent_copies_are_stored_centered() {
    let extra = "sink_tokens = 2\nrecent_fp_tokens = 4";
    let layout = growing(3);
    let mut plain = KvCache::with_allocation(layout, &f32_allocation("none", extra), 0, 1).unwrap();
    let mut cent =
        KvCache::with_allocation(layout, &f32_allocation("first-chunk", extra), 0, 1).unwrap();
    let (mut k, mut v) = (Vec::new(), Vec::new());
    for (step, n) in [16usize, 1, 2, 1].into_iter().enumerate() {
        let (kn, vn) = (
            with_mean(n, 31, 40 + step as u64),
            with_mean(n, 32, 50 + step as u64),
        );
        append(&mut plain, &kn, &vn);
        append(&mut cent, &kn, &vn);
        k.extend(kn);
        v.extend(vn);
        let queries = gaussians(n * Q * D, 60 + step as u64);
        for kernel in f32_kernels() {
            let a = attend_newest(&plain, &queries, kernel);
            let b = attend_newest(&cent, &queries, kernel);
            assert_within_f32_bound(
                &a,
                &b,
                &queries,
                &k,
                &v,
                (&cent, cent.len()),
                &format!("{kernel:?}"),
            );
        }
    }
    assert_eq!(
        (cent.keys(0).sink_end(), cent.keys(0).recent_start()),
        (2, 16)
    );

    // A quantized body: sinks (tokens 0, 1) and the recent window (16..20) decode to fl(x − μ).
    let allocation = allocation(
        "name = \"t\"\nfp_dtype = \"f32\"\nsink_tokens = 2\nrecent_fp_tokens = 4\n\
         key = { codec = \"mse\", bits = 3, center = \"first-chunk\" }\n\
         value = { codec = \"mse\", bits = 3, center = \"first-chunk\" }\n",
    );
    let mut q3 = KvCache::with_allocation(layout, &allocation, 0, 1).unwrap();
    append(&mut q3, &k[..16 * KV * D], &v[..16 * KV * D]);
    append(&mut q3, &k[16 * KV * D..], &v[16 * KV * D..]);
    for g in 0..KV {
        for (value, x) in [(false, &k), (true, &v)] {
            let stream = if value { q3.values(g) } else { q3.keys(g) };
            let mu = stream.mean().unwrap();
            for t in [0, 1, 16, 17, 18, 19] {
                let expected: Vec<f32> = head_rows(x, g)[t]
                    .iter()
                    .zip(mu)
                    .map(|(a, m)| a - m)
                    .collect();
                assert_eq!(
                    bits(&stored(&q3, g, t, value)),
                    bits(&expected),
                    "head {g} token {t}"
                );
            }
        }
    }

    // Rewind 3 (= max_rewind) tokens and re-append different ones: the same bits as a cache
    // that never saw the dropped tokens.
    let queries = gaussians(3 * Q * D, 90);
    let (k_new, v_new) = (with_mean(3, 31, 91), with_mean(3, 32, 92));
    let mut never = KvCache::with_allocation(layout, &allocation, 0, 1).unwrap();
    append(&mut never, &k[..16 * KV * D], &v[..16 * KV * D]);
    append(
        &mut never,
        &k[16 * KV * D..17 * KV * D],
        &v[16 * KV * D..17 * KV * D],
    );
    append(&mut never, &k_new, &v_new);
    q3.truncate(17).unwrap();
    append(&mut q3, &k_new, &v_new);
    for kernel in [AttentionKernel::Reference, AttentionKernel::Fused] {
        assert_eq!(
            bits(&attend_newest(&q3, &queries, kernel)),
            bits(&attend_newest(&never, &queries, kernel))
        );
    }
}

/// `formula_bytes == allocated_bytes` with centering on, for every codec family and growth
/// policy, before the mean exists, after, and after `clear()`; the mean costs exactly
/// `4·D` bytes per centered stream.
#[test]
fn centered_bytes_match_the_formula() {
    let kinds = [
        KvKind::Growing {
            growth: Growth::Static { capacity: 40 },
        },
        KvKind::Growing {
            growth: Growth::Doubling { initial: 7 },
        },
        KvKind::Sliding { window: 9 },
    ];
    for kind in kinds {
        for codec_kind in 0..common::CODECS {
            let layout = KvLayout {
                kv_heads: KV,
                head_dim: D,
                kind,
                max_rewind: 2,
                rope_pairs: tq_cache::basis::RopePairs::Adjacent,
                rope_base: Default::default(),
            };
            let spec = codec(codec_kind, D, 4, 5);
            let build = |center| {
                KvCache::new(
                    layout,
                    &streams(&layout, spec, center, 1, 3),
                    &streams(&layout, spec, center, 1, 3),
                )
                .unwrap()
            };
            let (mut plain, mut cent) =
                (build(CenterPolicy::None), build(CenterPolicy::FirstChunk));
            assert_eq!(cent.formula_bytes(), cent.allocated_bytes());
            assert_eq!(
                cent.formula_bytes(),
                plain.formula_bytes(),
                "no mean before the first batch"
            );
            let (k, v) = (with_mean(30, 1, 2), with_mean(30, 3, 4));
            for c in [&mut plain, &mut cent] {
                append(c, &k[..10 * KV * D], &v[..10 * KV * D]);
                append(c, &k[10 * KV * D..], &v[10 * KV * D..]);
            }
            assert_eq!(
                cent.formula_bytes(),
                cent.allocated_bytes(),
                "{kind:?} codec {codec_kind}"
            );
            assert_eq!(cent.fixed_bytes(), plain.fixed_bytes() + 2 * KV * 4 * D);
            assert_eq!(cent.formula_bytes(), plain.formula_bytes() + 2 * KV * 4 * D);
            cent.clear();
            assert_eq!(cent.formula_bytes(), cent.allocated_bytes());
        }
    }
}

/// A saved centered cache reloads bit-identical: the same bytes, the same mean bits, the same
/// attention outputs now and after more tokens. Version-1 files (no centering fields) still
/// load; a centered stream whose header lost its mean, or a mean of the wrong length, is
/// refused.
#[test]
fn centered_caches_save_and_reload_bit_identical() {
    let extra = "sink_tokens = 1\nrecent_fp_tokens = 2";
    let allocation = allocation(&format!(
        "name = \"t\"\n{extra}\nkey = {{ codec = \"mse\", bits = 4, center = \"first-chunk\" }}\n\
         value = {{ codec = \"prod\", bits = 3, center = \"first-chunk\" }}\n"
    ));
    let mut cache = ModelCache::with_allocation(shared_specs(), &allocation).unwrap();
    run_shared(&mut cache, AttentionKernel::Fused, 5);
    let bytes = to_bytes(&cache).unwrap();
    assert_eq!(bytes[8..12], FORMAT_VERSION.to_le_bytes());
    let mut reloaded = from_bytes(&bytes).unwrap();
    assert_eq!(to_bytes(&reloaded).unwrap(), bytes);
    for g in 0..KV {
        for (a, b) in [
            (
                cache.kv(0).unwrap().keys(g),
                reloaded.kv(0).unwrap().keys(g),
            ),
            (
                cache.kv(0).unwrap().values(g),
                reloaded.kv(0).unwrap().values(g),
            ),
        ] {
            assert_eq!(bits(a.mean().unwrap()), bits(b.mean().unwrap()));
        }
    }
    assert_eq!(reloaded.memory(), cache.memory());
    let a = run_shared(&mut cache, AttentionKernel::Fused, 6);
    let b = run_shared(&mut reloaded, AttentionKernel::Fused, 6);
    assert_eq!(
        a.iter().map(|x| bits(x)).collect::<Vec<_>>(),
        b.iter().map(|x| bits(x)).collect::<Vec<_>>()
    );

    // Hostile headers: a lost mean, or a mean of the wrong length.
    let lost = with_header(&bytes, |h| {
        h["streams"][0][0][0]["mean_bits"] = serde_json::Value::Null;
    });
    assert!(matches!(
        from_bytes(&lost),
        Err(PersistError::Inconsistent(_))
    ));
    let short = with_header(&bytes, |h| {
        h["streams"][0][1][1]["mean_bits"] = serde_json::json!([0u32, 1u32]);
    });
    assert!(matches!(
        from_bytes(&short),
        Err(PersistError::Cache(CacheError::InvalidConfig(_)))
    ));

    // Version 1: the same file without the centering fields, from an uncentered cache.
    let mut plain =
        ModelCache::with_allocation(shared_specs(), &Allocation::preset("mse-k4v4").unwrap())
            .unwrap();
    run_shared(&mut plain, AttentionKernel::Fused, 5);
    let bytes = to_bytes(&plain).unwrap();
    let mut v1 = with_header(&bytes, |h| {
        for state in h["streams"].as_array_mut().unwrap() {
            for side in state.as_array_mut().into_iter().flatten() {
                for layout in side.as_array_mut().unwrap() {
                    let layout = layout.as_object_mut().unwrap();
                    assert!(
                        layout.remove("center").is_some() && layout.remove("mean_bits").is_some()
                    );
                }
            }
        }
    });
    v1[8..12].copy_from_slice(&1u32.to_le_bytes());
    let n = v1.len();
    let crc = crc32fast::hash(&v1[..n - 4]);
    v1[n - 4..].copy_from_slice(&crc.to_le_bytes());
    assert_eq!(to_bytes(&from_bytes(&v1).unwrap()).unwrap(), bytes);
}

/// Rewrites a saved cache's JSON header and fixes the checksum.
fn with_header(bytes: &[u8], edit: impl Fn(&mut serde_json::Value)) -> Vec<u8> {
    let header_len = u64::from_le_bytes(bytes[12..20].try_into().unwrap()) as usize;
    let mut header: serde_json::Value =
        serde_json::from_slice(&bytes[20..20 + header_len]).unwrap();
    edit(&mut header);
    let header = serde_json::to_vec(&header).unwrap();
    let mut out = bytes[..12].to_vec();
    out.extend_from_slice(&(header.len() as u64).to_le_bytes());
    out.extend_from_slice(&header);
    out.extend_from_slice(&bytes[20 + header_len..bytes.len() - 4]);
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// An unknown `center` value is a typed error naming the field, wherever it is written; so is
/// `center` in an `[outliers]` table (it is a setting of the whole stream); a stream layout
/// whose mean contradicts its policy is refused when the cache is built.
#[test]
fn bad_center_settings_are_typed_errors_naming_the_field() {
    let base = "name = \"bad\"\nkey = { codec = \"mse\", bits = 4 }\nvalue = { codec = \"mse\", bits = 4 }\n";
    let cases = [
        (
            base.replace("bits = 4 }\nvalue", "bits = 4, center = \"bogus\" }\nvalue"),
            "key.center",
        ),
        (
            format!("{base}[[override]]\nlayers = [0]\nvalue = {{ center = \"mean\" }}"),
            "override[0].value.center",
        ),
        (
            format!("{base}[boundary]\nlayers = 1\nkey = {{ center = 1 }}"),
            "boundary.key.center",
        ),
    ];
    for (text, path) in cases {
        match Allocation::from_toml_str(&text) {
            Err(AllocationError::Toml {
                path: Some(p),
                message,
            }) => {
                assert_eq!(p, path, "{message}");
                let shown = Allocation::from_toml_str(&text).unwrap_err().to_string();
                assert!(shown.starts_with(&format!("`{path}`: ")), "{shown}");
            }
            other => panic!("{path}: expected a TOML error naming the field, got {other:?}"),
        }
    }
    let m = Allocation::from_toml_str(
        &base.replace("bits = 4 }\nvalue", "bits = 4, center = \"bogus\" }\nvalue"),
    )
    .unwrap_err()
    .to_string();
    assert!(
        m.contains("unknown variant `bogus`") && m.contains("first-chunk"),
        "{m}"
    );

    let outliers = format!("{base}[outliers]\nchannels = 8\nkey = {{ center = \"first-chunk\" }}");
    match Allocation::from_toml_str(&outliers) {
        Err(AllocationError::Field { path, problem }) => {
            assert_eq!(path, "outliers.key.center");
            assert_eq!(problem, FieldProblem::WholeStreamOnly);
        }
        other => panic!("expected a field error, got {other:?}"),
    }

    let layout = growing(0);
    let f32 = CodecSpec::F32 { dim: D };
    let mut wrong = streams(&layout, f32, CenterPolicy::FirstChunk, 0, 0);
    wrong[1].mean = Some(vec![0.0; D - 1]);
    assert!(matches!(
        KvCache::new(
            layout,
            &wrong,
            &streams(&layout, f32, CenterPolicy::None, 0, 0)
        ),
        Err(CacheError::InvalidConfig(_))
    ));
    let mut orphan = streams(&layout, f32, CenterPolicy::None, 0, 0);
    orphan[0].mean = Some(vec![1.0; D]);
    assert!(matches!(
        KvCache::new(layout, &orphan, &orphan.clone()),
        Err(CacheError::InvalidConfig(_))
    ));
    assert!(matches!(
        first_chunk_mean(&[1.0, f32::INFINITY], 2),
        Err(CacheError::Codec(_))
    ));
}

/// A centered two-tier stream picks its outlier channels from the centered first batch, since
/// those are the vectors its tiers store: a channel with a large constant offset but no spread
/// is not an outlier once the mean is gone, a channel with a large spread still is.
#[test]
fn two_tier_streams_choose_outlier_channels_after_centering() {
    let text = |center: &str| {
        format!(
            "name = \"t\"\nkey = {{ codec = \"mse\", bits = 3, center = \"{center}\" }}\n\
             value = {{ codec = \"mse\", bits = 3 }}\n[outliers]\nchannels = 3\nkey = {{ bits = 4 }}\n"
        )
    };
    let n = 32;
    let mut k = gaussians(n * KV * D, 70);
    for (i, x) in k.iter_mut().enumerate() {
        match i % D {
            5..=7 => *x = 40.0 + 0.1 * *x,
            40..=42 => *x *= 10.0,
            _ => {}
        }
    }
    let v = gaussians(n * KV * D, 71);
    for (center, channels) in [("none", [5u16, 6, 7]), ("first-chunk", [40, 41, 42])] {
        let mut c = KvCache::with_allocation(growing(0), &allocation(&text(center)), 0, 1).unwrap();
        append(&mut c, &k[..16 * KV * D], &v[..16 * KV * D]);
        append(&mut c, &k[16 * KV * D..], &v[16 * KV * D..]);
        for g in 0..KV {
            assert_eq!(
                c.keys(g).layout().channels.as_deref(),
                Some(&channels[..]),
                "{center}"
            );
        }
        assert_eq!(c.formula_bytes(), c.allocated_bytes());
        let mut model =
            ModelCache::with_allocation(shared_specs(), &allocation(&text(center))).unwrap();
        run_shared(&mut model, AttentionKernel::Fused, 3);
        let bytes = to_bytes(&model).unwrap();
        assert_eq!(to_bytes(&from_bytes(&bytes).unwrap()).unwrap(), bytes);
        c.clear();
        assert!(c.keys(0).layout().channels.is_none() && c.keys(0).mean().is_none());
    }
}
