//! The fused kernel on bodies stored in the fast-scan order (a stream's `record_order =
//! "fast-scan"`), with 4-, 2- and 1-bit codes (one, two and four codes per nibble):
//!
//! - values alone in that order (keys f16) are summed in integers: with zero queries (every
//!   weight 1) they give the integer sums computed here token by token within f32 rounding
//!   (`2e-4·max|v| + 1e-5`, as `simd_fused.rs`), so any token read from the wrong slot, or
//!   weighted wrongly, shows; with any queries they stay within the derived bound of the
//!   integer sums of the rows order's output;
//! - keys alone in that order (values f16) give the softmax of the fast scores computed
//!   independently here, token by token, from each token's codes through the public
//!   [`ScoreTable`] and [`block_sums`] (f64 softmax, same tolerance);
//! - with both, windows, sinks and rings: bit-identical across thread counts, the same records
//!   as the rows order (decoded token by token), a saved cache reloads bit-identical, and the
//!   output stays within the derived bound of the rows order: each score moves by at most
//!   `ε = norm·L·δ/2` (the table's rounding over its `L` lanes), so each softmax weight by a factor within
//!   `e^{±2ε}` and each output coordinate by at most `(e^{2ε} − 1)·max_t |v_t|`.

mod common;

use common::{growing, sliding, vectors};
use tq_cache::TokenCodec;
use tq_cache::allocation::Allocation;
use tq_cache::attention::AttentionShape;
use tq_cache::attention::fast_scan::{BLOCK, FastScanBlocks, ScoreTable, block_sums};
use tq_cache::attention::simd::{Isa, fused_attention_on};
use tq_cache::codec::CodecScratch;
use tq_cache::kv_cache::{KvCache, KvLayout};
use tq_cache::record_order::RecordOrder;

const D: usize = 64;

/// `body` with every stream table's `ORDER` made `record_order = "fast-scan"` (or nothing).
fn allocation(body: &str, fast: bool) -> Allocation {
    let order = if fast {
        ", record_order = \"fast-scan\""
    } else {
        ""
    };
    let body = body.replace(", ORDER", order);
    Allocation::from_toml_str(&format!("name = \"t\"\n{body}")).unwrap()
}

/// `body` (written for 4-bit codes) with every stream at `bits` bits.
fn at_bits(body: &str, bits: u8) -> String {
    body.replace("bits = 4", &format!("bits = {bits}"))
}

fn cache(layout: KvLayout, body: &str, fast: bool, tokens: usize, seed: u64) -> KvCache {
    let mut cache = KvCache::with_allocation(layout, &allocation(body, fast), 0, 1).unwrap();
    common::fill(&mut cache, 0, tokens, seed);
    cache
}

fn shape(q_heads: usize) -> AttentionShape {
    AttentionShape {
        q_heads,
        scale: 1.0 / (D as f32).sqrt(),
    }
}

fn run(isa: Isa, cache: &KvCache, q_heads: usize, positions: &[u32], seed: u64) -> Vec<f32> {
    let queries = vectors(positions.len() * q_heads, D, seed);
    let mut out = vec![0.0f32; queries.len()];
    fused_attention_on(isa, cache, &queries, positions, shape(q_heads), &mut out).unwrap();
    out
}

fn in_pool<T: Send>(threads: usize, f: impl FnOnce() -> T + Send) -> T {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap()
        .install(f)
}

fn max_abs_value(cache: &KvCache) -> f32 {
    let mut scratch = CodecScratch::new(D);
    let mut v = vec![0.0f32; D];
    let mut max = 0.0f32;
    for g in 0..cache.layout().kv_heads {
        let values = cache.values(g);
        for t in values.first_stored()..values.len() {
            values.decode(t, &mut scratch, &mut v).unwrap();
            max = v.iter().fold(max, |m, x| m.max(x.abs()));
        }
    }
    max
}

fn close(what: &str, got: &[f32], expected: &[f32], tolerance: f32) {
    for (i, (a, b)) in got.iter().zip(expected).enumerate() {
        assert!(
            (a - b).abs() <= tolerance,
            "{what}: output {i}: {a} vs {b} (tolerance {tolerance})"
        );
    }
}

/// The first `tokens` values of KV head `g`, decoded.
fn decoded_values(cache: &KvCache, g: usize, tokens: usize) -> Vec<Vec<f32>> {
    let mut scratch = CodecScratch::new(D);
    let mut v = vec![0.0f32; D];
    (0..tokens)
        .map(|t| {
            cache.values(g).decode(t, &mut scratch, &mut v).unwrap();
            v.clone()
        })
        .collect()
}

/// The softmax of `scores` (f64) applied to `values`: what attention outputs for them.
fn softmax_mix(scores: &[f64], values: &[Vec<f32>]) -> Vec<f32> {
    let max = scores.iter().fold(f64::NEG_INFINITY, |m, &s| m.max(s));
    let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
    let total: f64 = weights.iter().sum();
    (0..D)
        .map(|j| {
            let sum: f64 = weights
                .iter()
                .zip(values)
                .map(|(w, v)| w * f64::from(v[j]))
                .sum();
            (sum / total) as f32
        })
        .collect()
}

const VALUES_ONLY: &str =
    "key = { codec = \"f16\", ORDER }\nvalue = { codec = \"mse\", bits = 4, ORDER }";
const KEYS_ONLY: &str =
    "key = { codec = \"mse\", bits = 4, ORDER }\nvalue = { codec = \"f16\", ORDER }";
const BOTH: &str =
    "key = { codec = \"mse\", bits = 4, ORDER }\nvalue = { codec = \"mse\", bits = 4, ORDER }";
const WINDOWS: &str = "sink_tokens = 2\nrecent_fp_tokens = 40\n\
    key = { codec = \"mse\", bits = 4, ORDER }\nvalue = { codec = \"mse\", bits = 4, ORDER }";
const WINDOWS_Q8: &str = "sink_tokens = 2\nrecent_fp_tokens = 50\nrecent_dtype = \"q8\"\n\
    key = { codec = \"mse\", bits = 4, center = \"first-chunk\", ORDER }\n\
    value = { codec = \"mse\", bits = 4, norm_correction = true, ORDER }";

/// Two tiers of TQ_mse (a quarter of the channels, the outliers, one bit wider), each tier's
/// codes a part with its own norm: 4/3-bit keys (nibbles, then 2 + 1 bit planes), 3/2-bit
/// values.
const TIERS: &str = "outliers = { fraction = 0.25, key = { bits = 4 }, value = { bits = 3 } }\n\
    key = { codec = \"mse\", bits = 3, ORDER }\nvalue = { codec = \"mse\", bits = 2, ORDER }";

/// TQ_prod keys (4-bit codes and Haar QJL signs, `γ` their own scale) and values (3-bit codes
/// as bit planes, Gaussian signs).
const PROD: &str = "key = { codec = \"prod\", bits = 5, qjl = \"haar\", ORDER }\n\
    value = { codec = \"prod\", bits = 4, qjl = \"gaussian\", ORDER }";

/// The widths whose codes fill whole nibbles (one, two or four codes each).
const NIBBLE_WIDTHS: [u8; 3] = [4, 2, 1];

#[test]
fn mse_bodies_of_whole_words_take_the_fast_scan_order() {
    for bits in NIBBLE_WIDTHS {
        let fast = cache(growing(2, D), &at_bits(BOTH, bits), true, 40, 1);
        let rows = cache(growing(2, D), &at_bits(BOTH, bits), false, 40, 1);
        for g in 0..2 {
            for s in [fast.keys(g), fast.values(g)] {
                assert_eq!(s.body().order(), RecordOrder::FastScan, "{bits} bits");
            }
        }
        // The same bytes as rows.
        assert_eq!(fast.bytes_per_token(), rows.bytes_per_token());
    }
    // d·b not a multiple of 32: records that end inside a word keep rows.
    let narrow =
        KvCache::with_allocation(growing(1, 24), &allocation(&at_bits(BOTH, 2), true), 0, 1)
            .unwrap();
    assert_eq!(narrow.keys(0).body().order(), RecordOrder::Rows);
    let both = cache(growing(2, D), BOTH, true, 40, 1);
    let values_only = cache(growing(2, D), VALUES_ONLY, true, 40, 1);
    let rows = cache(growing(2, D), BOTH, false, 40, 1);
    let three_bits = cache(
        growing(2, D),
        "key = { codec = \"mse\", bits = 3, ORDER }\nvalue = { codec = \"mse\", bits = 5, ORDER }",
        true,
        40,
        1,
    );
    for g in 0..2 {
        let order = |c: &KvCache| [c.keys(g), c.values(g)].map(|s| s.body().order());
        assert_eq!(order(&both), [RecordOrder::FastScan; 2]);
        assert_eq!(
            order(&values_only),
            [RecordOrder::Rows, RecordOrder::FastScan]
        );
        assert_eq!(order(&rows), [RecordOrder::Rows; 2]);
        // 3- and 5-bit codes as bit planes (2 + 1 and 4 + 1 bits).
        assert_eq!(order(&three_bits), [RecordOrder::FastScan; 2]);
        assert!(three_bits.keys(g).body().planes().is_some());
        assert!(three_bits.values(g).body().planes().is_some());
        assert!(both.keys(g).body().planes().is_none());
    }
    // The same bytes as rows.
    assert_eq!(both.bytes_per_token(), rows.bytes_per_token());
    let three_rows = cache(
        growing(2, D),
        "key = { codec = \"mse\", bits = 3 }\nvalue = { codec = \"mse\", bits = 5 }",
        true,
        40,
        1,
    );
    assert_eq!(three_bits.bytes_per_token(), three_rows.bytes_per_token());
    assert_same_tokens("3-bit planes", three_bits.keys(1), three_rows.keys(1));
    assert_same_tokens("5-bit planes", three_bits.values(1), three_rows.values(1));
}

/// Values in the fast-scan order are summed in integers: with zero queries every visible token
/// weighs `e^0 = 1` (checked first, on every instruction set), so each block's weight bytes and
/// scale, the centroid bytes and the exact integer sums can be computed here from each token's
/// codes and norm, and the output must be their mean, turned back, within f32 rounding
/// (`2e-4·max|v| + 1e-5`). A token read from the wrong slot, a weight of the wrong token or a
/// block scaled by another block's scale moves a coordinate by more than that.
#[test]
fn fast_scan_values_sum_the_integer_weights() {
    for isa in Isa::available() {
        let mut ones = [0.0f32; 37];
        assert_eq!(
            tq_cache::attention::simd::exp_shifted_sum(isa, &mut ones, 0.0),
            37.0
        );
        assert!(ones.iter().all(|&p| p == 1.0), "{isa:?}: e^0 is not 1");
    }
    let (kv, q_heads) = (2usize, 6usize);
    for (bits, tokens) in NIBBLE_WIDTHS
        .into_iter()
        .flat_map(|b| [(b, 1300usize), (b, 9000)])
    {
        let fast = cache(growing(kv, D), &at_bits(VALUES_ONLY, bits), true, tokens, 3);
        let tolerance = 2e-4 * max_abs_value(&fast) + 1e-5;
        let last = tokens as u32 - 1;
        let positions = [0u32, 5, 31, 32, 700, 1299, last];
        let zeros = vec![0.0f32; positions.len() * q_heads * D];
        for g in 0..kv {
            let values = fast.values(g);
            let TokenCodec::Mse(codec) = values.codec() else {
                panic!("TQ_mse values")
            };
            let (gamma, e) = common::centroid_bytes(codec.codebook().centroids_f32());
            let mut codes = vec![0u8; D];
            let records: Vec<(Vec<u8>, f32)> = (0..tokens)
                .map(|t| {
                    let (words, scales) = values.body().record_copy(t).unwrap();
                    tq_cache::codec::packing::unpack(&words, bits, &mut codes).unwrap();
                    (codes.clone(), scales[0].to_f32())
                })
                .collect();
            for (i, &p) in positions.iter().enumerate() {
                let visible = &records[..=p as usize];
                let mut rotated = vec![0.0f64; D];
                for block in visible.chunks(BLOCK) {
                    common::add_block_sum(block, &e, &mut rotated);
                }
                let mean: Vec<f32> = rotated
                    .iter()
                    .map(|r| (r * f64::from(gamma) / visible.len() as f64) as f32)
                    .collect();
                let mut expected = vec![0.0f32; D];
                codec
                    .rotation()
                    .apply_inverse(&mean, &mut expected)
                    .unwrap();
                for isa in Isa::available() {
                    let mut got = vec![0.0f32; zeros.len()];
                    fused_attention_on(isa, &fast, &zeros, &positions, shape(q_heads), &mut got)
                        .unwrap();
                    for h in 0..q_heads / kv {
                        let row = (i * kv + g) * (q_heads / kv) + h;
                        close(
                            &format!(
                                "{bits} bits, {tokens} tokens, {isa:?}, head {g}/{h}, position {p}"
                            ),
                            &got[row * D..(row + 1) * D],
                            &expected,
                            tolerance,
                        );
                    }
                }
            }
        }
    }
}

/// Values in the fast-scan order against the rows order, any queries: within the derived
/// bound of the integer sums. Per block `b` and head the weights `w_t = p_t·‖v_t‖` round to
/// steps `s_b = max w / 127` (error ≤ `s_b/2` each) and the centroids to steps
/// `γ = max|c| / 127` (error ≤ `γ/2`), so rotated coordinate `j` moves by at most
/// `B_j = (Σ_b (s_b/2)·Σ_{t∈b} (|c_tj| + γ/2) + Σ_t w_t·γ/2) / Σ_t p_t`, and an output
/// coordinate (an orthogonal map back) by at most `‖B‖₂` — here computed from the exact
/// softmax of the f16 keys (1% slack for the kernel's f32 weights) plus f32 rounding.
///
/// Two tiers are two such sums, each with its own norms and codebook, mapped back onto
/// disjoint channels: the bound is the root of the sum of their squares.
#[test]
fn fast_scan_values_stay_within_the_integer_bound_of_rows() {
    for bits in NIBBLE_WIDTHS {
        values_within_the_integer_bound_of_rows(
            &at_bits(VALUES_ONLY, bits),
            &format!("{bits} bits"),
        );
    }
    // 4/3-bit tiers (a nibble part, then 2 + 1 bit planes) with f16 keys.
    let tiers = "outliers = { fraction = 0.25, value = { bits = 4 } }\n\
        key = { codec = \"f16\", ORDER }\nvalue = { codec = \"mse\", bits = 3, ORDER }";
    values_within_the_integer_bound_of_rows(tiers, "two tiers");
    // TQ_prod values: 3-bit codes (bit planes) and Haar QJL signs (their own scale, `γ`).
    let prod = "key = { codec = \"f16\", ORDER }\n\
        value = { codec = \"prod\", bits = 4, qjl = \"haar\", ORDER }";
    values_within_the_integer_bound_of_rows(prod, "prod");
}

fn values_within_the_integer_bound_of_rows(body: &str, name: &str) {
    let (kv, q_heads, tokens) = (2usize, 6usize, 1300usize);
    let group = q_heads / kv;
    let fast = cache(growing(kv, D), body, true, tokens, 3);
    let rows = cache(growing(kv, D), body, false, tokens, 3);
    let positions = [0u32, 40, 700, 1299];
    let queries = vectors(positions.len() * q_heads, D, 4);
    let scale = shape(q_heads).scale;
    let rounding = 2e-4 * max_abs_value(&rows) + 1e-5;
    let mut scratch = CodecScratch::new(D);
    let mut k = vec![0.0f32; D];
    for isa in Isa::available() {
        let got = run(isa, &fast, q_heads, &positions, 4);
        let expected = run(isa, &rows, q_heads, &positions, 4);
        for g in 0..kv {
            let values = fast.values(g);
            assert_eq!(values.body().order(), RecordOrder::FastScan, "{name}");
            for (i, &p) in positions.iter().enumerate() {
                for h in 0..group {
                    let row = (i * kv + g) * group + h;
                    let q = &queries[row * D..(row + 1) * D];
                    let visible = p as usize + 1;
                    let scores: Vec<f64> = (0..visible)
                        .map(|t| {
                            fast.keys(g).decode(t, &mut scratch, &mut k).unwrap();
                            q.iter().zip(&k).map(|(a, b)| f64::from(a * b)).sum::<f64>()
                                * f64::from(scale)
                        })
                        .collect();
                    let max = scores.iter().fold(f64::NEG_INFINITY, |m, &s| m.max(s));
                    let probabilities: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                    let total: f64 = probabilities.iter().sum();
                    // `Σ_j (B_j / Σp)²` of one part: `dim` codes of `bits` bits from word `word`
                    // (`words` of them) against `centroids`, weighted by scale `scale`.
                    let part_squares = |dim: usize,
                                        bits: u8,
                                        centroids: &[f32],
                                        (word, words): (usize, usize),
                                        scale: usize| {
                        let gamma =
                            f64::from(centroids.iter().fold(0.0f32, |m, c| m.max(c.abs())) / 127.0);
                        let mut codes = vec![0u8; dim];
                        let mut bound = vec![0.0f64; dim];
                        for (b, chunk) in probabilities.chunks(BLOCK).enumerate() {
                            let weights: Vec<(f64, Vec<u8>)> = chunk
                                .iter()
                                .enumerate()
                                .map(|(i, pr)| {
                                    let (record, scales) =
                                        values.body().record_copy(b * BLOCK + i).unwrap();
                                    let packed = &record[word..][..words];
                                    tq_cache::codec::packing::unpack(packed, bits, &mut codes)
                                        .unwrap();
                                    (pr * f64::from(scales[scale].to_f32()), codes.clone())
                                })
                                .collect();
                            let step = weights.iter().fold(0.0f64, |m, (w, _)| m.max(*w)) / 127.0;
                            for (w, codes) in &weights {
                                for (bj, &c) in bound.iter_mut().zip(codes) {
                                    let c = f64::from(centroids[usize::from(c)]).abs();
                                    *bj += step / 2.0 * (c + gamma / 2.0) + w * gamma / 2.0;
                                }
                            }
                        }
                        bound.iter().map(|b| (b / total).powi(2)).sum::<f64>()
                    };
                    let mut squares = 0.0f64;
                    for tier in tiers(values.codec()) {
                        squares += part_squares(
                            tier.codec.dim(),
                            tier.codec.spec().bits,
                            tier.codec.codebook().centroids_f32(),
                            (tier.word, tier.codec.words_per_vector()),
                            tier.scale,
                        );
                    }
                    // TQ_prod: its codes' error turned back by Πᵀ, its signs' by `α·s·Πᵀ·Sᵀ`
                    // (Haar: `‖Sᵀ‖ = 1`), so the two bounds add.
                    let mut signs = 0.0f64;
                    if let TokenCodec::Prod(c) = values.codec() {
                        let mse = c.mse();
                        squares += part_squares(
                            mse.dim(),
                            mse.spec().bits,
                            mse.codebook().centroids_f32(),
                            (0, mse.words_per_vector()),
                            0,
                        );
                        let sketch = c.sketch();
                        signs = sketch.gain()
                            * part_squares(
                                sketch.rows(),
                                1,
                                &[-1.0, 1.0],
                                (mse.words_per_vector(), sketch.words()),
                                1,
                            )
                            .sqrt();
                    }
                    let limit = 1.01 * (squares.sqrt() + signs);
                    close(
                        &format!("{name}, {isa:?}, head {g}/{h}, position {p} (bound {limit})"),
                        &got[row * D..(row + 1) * D],
                        &expected[row * D..(row + 1) * D],
                        limit as f32 + rounding,
                    );
                }
            }
        }
    }
}

/// Keys in the fast-scan order: the softmax of the fast scores, computed here from each
/// token's codes (gathered back from the store) with the public table and block sums.
#[test]
fn fast_scan_keys_score_with_the_byte_tables() {
    for bits in NIBBLE_WIDTHS {
        keys_score_with_the_byte_tables(bits);
    }
}

/// TQ_prod keys in the fast-scan order: each score is `norm·(its codes' table sum) + γ·(its
/// signs' table sum)`, the signs read as 1-bit codes (`+1` for a set bit) against the query
/// `α·s·S·Π·q` — computed here token by token from each token's codes and signs through two
/// public tables and [`block_sums`]; the softmax of those scores against the cache's output.
/// A sign read the wrong way round, the wrong scale or a lost sign term moves it (checked).
#[test]
fn prod_keys_score_with_a_table_for_codes_and_one_for_signs() {
    let (kv, q_heads, tokens) = (2usize, 6usize, 1300usize);
    let group = q_heads / kv;
    let body = "key = { codec = \"prod\", bits = 5, qjl = \"haar\", ORDER }\n\
        value = { codec = \"f16\" }";
    let cache = cache(growing(kv, D), body, true, tokens, 5);
    let positions = [0u32, 40, 700, 1299];
    let queries = vectors(positions.len() * q_heads, D, 6);
    let tolerance = 2e-4 * max_abs_value(&cache) + 1e-5;
    let scale = shape(q_heads).scale;
    for g in 0..kv {
        let keys = cache.keys(g);
        assert_eq!(keys.body().order(), RecordOrder::FastScan);
        let TokenCodec::Prod(codec) = keys.codec() else {
            panic!("TQ_prod keys")
        };
        let (mse, sketch) = (codec.mse(), codec.sketch());
        let (bits, m, code_words) = (mse.spec().bits, sketch.rows(), mse.words_per_vector());
        // Every token's codes and signs, into two standalone layouts.
        let mut code_blocks = FastScanBlocks::new(D, bits).unwrap();
        let mut sign_blocks = FastScanBlocks::new(m, 1).unwrap();
        let (mut codes, mut signs) = (vec![0u8; D], vec![0u8; m]);
        let mut gammas = Vec::with_capacity(tokens);
        for t in 0..tokens {
            let (words, scales) = keys.body().record_copy(t).unwrap();
            tq_cache::codec::packing::unpack(&words[..code_words], bits, &mut codes).unwrap();
            tq_cache::codec::packing::unpack(&words[code_words..], 1, &mut signs).unwrap();
            code_blocks.push(&codes, scales[0].to_f32()).unwrap();
            sign_blocks.push(&signs, scales[1].to_f32()).unwrap();
            gammas.push(scales[1].to_f32());
        }
        let values = decoded_values(&cache, g, tokens);
        for isa in Isa::available() {
            let got = run(isa, &cache, q_heads, &positions, 6);
            for (i, &p) in positions.iter().enumerate() {
                for h in 0..group {
                    let row = (i * kv + g) * group + h;
                    let q: Vec<f32> = queries[row * D..(row + 1) * D]
                        .iter()
                        .map(|x| x * scale)
                        .collect();
                    let mut rotated = vec![0.0f32; D];
                    mse.rotation().apply(&q, &mut rotated).unwrap();
                    let mut projected = vec![0.0f32; m];
                    sketch.project(&rotated, &mut projected).unwrap();
                    let gain = sketch.gain() as f32;
                    projected.iter_mut().for_each(|x| *x *= gain);
                    let code_table =
                        ScoreTable::new(&rotated, mse.codebook().centroids_f32(), bits).unwrap();
                    let sign_table = ScoreTable::new(&projected, &[-1.0, 1.0], 1).unwrap();
                    let visible = p as usize + 1;
                    let mut scores = Vec::with_capacity(visible);
                    let (mut code_sums, mut sign_sums) = ([0u32; BLOCK], [0u32; BLOCK]);
                    for (t, &gamma) in gammas.iter().enumerate().take(visible) {
                        if t % BLOCK == 0 {
                            let b = t / BLOCK;
                            block_sums(Isa::Scalar, &code_table, &code_blocks, b, &mut code_sums)
                                .unwrap();
                            block_sums(Isa::Scalar, &sign_table, &sign_blocks, b, &mut sign_sums)
                                .unwrap();
                        }
                        let norm = keys.body().record_copy(t).unwrap().1[0].to_f32();
                        let k = t % BLOCK;
                        scores.push(
                            f64::from(norm * code_table.dequantize(code_sums[k]))
                                + f64::from(gamma * sign_table.dequantize(sign_sums[k])),
                        );
                    }
                    let expected = softmax_mix(&scores, &values);
                    close(
                        &format!("prod, {isa:?}, head {g}/{h}, position {p}"),
                        &got[row * D..(row + 1) * D],
                        &expected,
                        tolerance,
                    );
                }
            }
        }
    }
}

fn keys_score_with_the_byte_tables(bits: u8) {
    let (kv, q_heads, tokens) = (2usize, 6usize, 1300usize);
    let group = q_heads / kv;
    let cache = cache(growing(kv, D), &at_bits(KEYS_ONLY, bits), true, tokens, 5);
    let positions = [0u32, 40, 700, 1299];
    let queries = vectors(positions.len() * q_heads, D, 6);
    let tolerance = 2e-4 * max_abs_value(&cache) + 1e-5;
    let scale = shape(q_heads).scale;
    for g in 0..kv {
        let keys = cache.keys(g);
        let TokenCodec::Mse(codec) = keys.codec() else {
            panic!("TQ_mse keys")
        };
        // Every token's codes and norm, into the standalone layout.
        let mut blocks = FastScanBlocks::new(D, bits).unwrap();
        let mut codes = vec![0u8; D];
        for t in 0..tokens {
            let (words, scales) = keys.body().record_copy(t).unwrap();
            tq_cache::codec::packing::unpack(&words, bits, &mut codes).unwrap();
            blocks.push(&codes, scales[0].to_f32()).unwrap();
        }
        let values = decoded_values(&cache, g, tokens);
        for isa in Isa::available() {
            let got = run(isa, &cache, q_heads, &positions, 6);
            for (i, &p) in positions.iter().enumerate() {
                for h in 0..group {
                    let row = (i * kv + g) * group + h;
                    let q: Vec<f32> = queries[row * D..(row + 1) * D]
                        .iter()
                        .map(|x| x * scale)
                        .collect();
                    let mut rotated = vec![0.0f32; D];
                    codec.rotation().apply(&q, &mut rotated).unwrap();
                    let table =
                        ScoreTable::new(&rotated, codec.codebook().centroids_f32(), bits).unwrap();
                    let visible = p as usize + 1;
                    let mut scores = Vec::with_capacity(visible);
                    let mut sums = [0u32; BLOCK];
                    for t in 0..visible {
                        if t % BLOCK == 0 {
                            block_sums(Isa::Scalar, &table, &blocks, t / BLOCK, &mut sums).unwrap();
                        }
                        let norm = keys.body().record_copy(t).unwrap().1[0].to_f32();
                        scores.push(f64::from(norm * table.dequantize(sums[t % BLOCK])));
                    }
                    let expected = softmax_mix(&scores, &values);
                    close(
                        &format!("{isa:?}, head {g}/{h}, position {p}"),
                        &got[row * D..(row + 1) * D],
                        &expected,
                        tolerance,
                    );
                }
            }
        }
    }
}

/// Caches with the keys (and, with `values`, the values) in the fast-scan order, and the same
/// in rows: plain, with sinks and an f16 window, with an 8-bit window and centering, and a
/// sliding-window ring; codes of 4, 2 and 1 bits in nibbles, of 3, 6 and 7 as bit planes.
fn fast_caches(values: bool) -> Vec<(&'static str, KvCache, KvCache)> {
    let mut out = Vec::new();
    let bodies = [
        ("plain", BOTH.to_string(), growing(2, D)),
        ("windows", WINDOWS.to_string(), growing(2, D)),
        ("q8 windows", WINDOWS_Q8.to_string(), growing(2, D)),
        ("ring", BOTH.to_string(), sliding(2, D, 200, 0)),
        ("2-bit", at_bits(BOTH, 2), growing(2, D)),
        ("2-bit q8 windows", at_bits(WINDOWS_Q8, 2), growing(2, D)),
        ("1-bit ring", at_bits(BOTH, 1), sliding(2, D, 200, 0)),
        // Bit planes: 3 = 2 + 1, 6 = 4 + 2, 7 = 4 + 2 + 1 bits.
        ("3-bit planes", at_bits(BOTH, 3), growing(2, D)),
        (
            "6-bit planes q8 windows",
            at_bits(WINDOWS_Q8, 6),
            growing(2, D),
        ),
        ("7-bit planes ring", at_bits(BOTH, 7), sliding(2, D, 200, 0)),
        ("two tiers", TIERS.to_string(), growing(2, D)),
        ("prod", PROD.to_string(), growing(2, D)),
        ("prod ring", PROD.to_string(), sliding(2, D, 200, 0)),
        (
            "two tiers ring, 6/5 and 5/4 bits",
            TIERS
                .replace("bits = 4", "bits = 6")
                .replace("bits = 3", "bits = 5")
                .replace("bits = 2", "bits = 4"),
            sliding(2, D, 200, 0),
        ),
    ];
    for (name, body, layout) in bodies {
        // The value table is the last line that names a codec.
        let body = if values {
            body
        } else {
            let (head, value) = body.rsplit_once("value = ").unwrap();
            format!("{head}value = {}", value.replace(", ORDER", ""))
        };
        let fast = cache(layout, &body, true, 1300, 7);
        assert_eq!(fast.keys(0).body().order(), RecordOrder::FastScan, "{name}");
        out.push((name, fast, cache(layout, &body, false, 1300, 7)));
    }
    out
}

/// The largest of scale `k` (a norm, or TQ_prod's `γ`) over a stream's stored records.
fn largest_scale(stream: &tq_cache::stream::Stream, k: usize) -> f32 {
    (0..stream.body().len()).fold(0.0f32, |m, t| {
        m.max(stream.body().record_copy(t).unwrap().1[k].to_f32())
    })
}

/// The score bound per unit scale (`ScoreTable::error_bound`) of the cache's table for one part:
/// `query` against `centroids`, `bits`-bit codes in `words` words (3 and 5–8 bits as planes).
fn part_error_bound(query: &[f32], centroids: &[f32], bits: u8, words: usize) -> f32 {
    let part = tq_cache::attention::fast_scan::TablePart {
        query,
        centroids,
        bits,
        lanes: 8 * words,
    };
    let mut table = ScoreTable::default();
    table
        .rebuild_parts(&[part], part.lanes.next_multiple_of(4))
        .unwrap();
    table.error_bound()
}

/// A TQ_prod key codec's score bound for the scaled query `q`, `largest` the largest norm and
/// `γ`: its codes' table's times the norm plus its signs' table's (query `α·s·S·Π·q`) times
/// `γ`.
fn prod_key_bound(c: &tq_cache::codec::TqProd, q: &[f32], largest: [f32; 2]) -> f32 {
    let mut rotated = vec![0.0f32; D];
    c.mse().rotation().apply(q, &mut rotated).unwrap();
    let mut sketch = vec![0.0f32; c.sketch().rows()];
    c.sketch().project(&rotated, &mut sketch).unwrap();
    let gain = c.sketch().gain() as f32;
    sketch.iter_mut().for_each(|s| *s *= gain);
    let codes = part_error_bound(
        &rotated,
        c.mse().codebook().centroids_f32(),
        c.mse().spec().bits,
        c.mse().words_per_vector(),
    );
    let signs = part_error_bound(&sketch, &[-1.0, 1.0], 1, c.sketch().words());
    largest[0] * codes + largest[1] * signs
}

/// One tier of a stream's codec: its TQ_mse codec, its channels (`None`: all), the index of
/// its norm among a record's scales and its first word in a record.
struct Tier<'a> {
    codec: &'a tq_cache::codec::TqMse,
    channels: Option<&'a [u16]>,
    scale: usize,
    word: usize,
}

/// The tiers of a TQ_mse codec (one) or of two tiers of TQ_mse.
fn tiers(codec: &TokenCodec) -> Vec<Tier<'_>> {
    match codec {
        TokenCodec::Mse(c) => vec![Tier {
            codec: c,
            channels: None,
            scale: 0,
            word: 0,
        }],
        TokenCodec::TwoTier(c) => {
            let (TokenCodec::Mse(outlier), TokenCodec::Mse(rest)) = (c.outlier(), c.rest()) else {
                panic!("TQ_mse tiers")
            };
            vec![
                Tier {
                    codec: outlier,
                    channels: Some(c.channels()),
                    scale: 0,
                    word: 0,
                },
                Tier {
                    codec: rest,
                    channels: Some(c.rest_channels()),
                    scale: 1,
                    word: c.outlier().record_words(),
                },
            ]
        }
        TokenCodec::Prod(_) => Vec::new(),
        _ => panic!("TQ_mse, two tiers of it, or TQ_prod"),
    }
}

#[test]
fn fast_scan_caches_are_bit_identical_across_thread_counts() {
    for (name, cache, _) in fast_caches(true) {
        let positions = [0u32, 255, 256, 700, 1299];
        for isa in Isa::available() {
            let one = in_pool(1, || run(isa, &cache, 6, &positions, 8));
            for threads in [2, 3] {
                let many = in_pool(threads, || run(isa, &cache, 6, &positions, 8));
                assert!(
                    one.iter()
                        .zip(&many)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{name} on {isa:?}: 1 vs {threads} threads differ"
                );
            }
        }
    }
}

/// Fast-scan bodies attend to the same bits on every instruction set: integer scores with the
/// same float steps, the same `exp` (`exp_poly` on every path, summed in the same lanes),
/// integer value sums with the same float steps. Windows and sinks are read by the plain f32
/// kernels, whose vector paths use fused multiply-adds: caches with them are outside this.
#[test]
fn fast_scan_caches_are_bit_identical_across_instruction_sets() {
    for (name, cache, _) in fast_caches(true) {
        if name.contains("windows") {
            continue;
        }
        let positions = [0u32, 255, 256, 700, 1299];
        let scalar = run(Isa::Scalar, &cache, 6, &positions, 8);
        for isa in Isa::available() {
            let got = run(isa, &cache, 6, &positions, 8);
            assert!(
                got.iter()
                    .zip(&scalar)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{name}: {isa:?} differs from the scalar path"
            );
        }
    }
}

#[test]
fn fast_scan_caches_hold_the_rows_records() {
    for (name, fast, rows) in fast_caches(true) {
        for g in 0..2 {
            for (x, y) in [
                (fast.keys(g), rows.keys(g)),
                (fast.values(g), rows.values(g)),
            ] {
                assert_same_tokens(name, x, y);
            }
        }
    }
}

/// Keys in the fast-scan order (values in rows), with windows, sinks and rings: within the
/// derived bound of the rows order (the module docs).
#[test]
fn fast_scan_keys_stay_within_the_score_bound() {
    for (name, fast, rows) in fast_caches(false) {
        // ε over every query head and stored key: norm · L · δ / 2 (`error_bound`).
        let positions = [3u32, 640, 1299];
        let queries = vectors(positions.len() * 6, D, 9);
        let scale = shape(6).scale;
        let mut epsilon = 0.0f32;
        for g in 0..2 {
            let keys = fast.keys(g);
            let largest: Vec<f32> = (0..keys.codec().scales_per_token())
                .map(|k| largest_scale(keys, k))
                .collect();
            for q in queries.chunks_exact(D) {
                let q: Vec<f32> = q.iter().map(|x| x * scale).collect();
                // Two tiers are scored by a table each, so their bounds add; so are TQ_prod's
                // codes (times the norm) and signs (times `γ`).
                let mut bound = match keys.codec() {
                    TokenCodec::Prod(c) => prod_key_bound(c, &q, [largest[0], largest[1]]),
                    _ => 0.0,
                };
                for Tier {
                    codec,
                    channels,
                    scale: scale_index,
                    ..
                } in tiers(keys.codec())
                {
                    let gathered: Vec<f32> = match channels {
                        Some(c) => c.iter().map(|&i| q[usize::from(i)]).collect(),
                        None => q.clone(),
                    };
                    let mut rotated = vec![0.0f32; codec.dim()];
                    codec.rotation().apply(&gathered, &mut rotated).unwrap();
                    bound += largest[scale_index]
                        * part_error_bound(
                            &rotated,
                            codec.codebook().centroids_f32(),
                            codec.spec().bits,
                            codec.words_per_vector(),
                        );
                }
                epsilon = epsilon.max(bound);
            }
        }
        let bound = ((2.0 * epsilon).exp() - 1.0) * max_abs_value(&rows)
            + 2e-4 * max_abs_value(&rows)
            + 1e-5;
        for isa in Isa::available() {
            let got = run(isa, &fast, 6, &positions, 9);
            let expected = run(isa, &rows, 6, &positions, 9);
            close(
                &format!("{name} {isa:?} (ε = {epsilon})"),
                &got,
                &expected,
                bound,
            );
        }
    }
}

#[test]
fn a_saved_fast_scan_cache_reloads_bit_identical() {
    use tq_cache::persist::{from_bytes, to_bytes};
    use tq_cache::states::{ModelCache, StateKind, StateSpec};
    let two_bits = at_bits(WINDOWS_Q8, 2);
    for (layout, body) in [
        (growing(2, D), WINDOWS_Q8),
        (sliding(2, D, 200, 0), BOTH),
        (growing(2, D), two_bits.as_str()),
        (growing(2, D), TIERS),
    ] {
        let specs = vec![StateSpec {
            name: "l0".into(),
            kind: StateKind::Kv { layer: 0, layout },
        }];
        let mut model = ModelCache::with_allocation(specs, &allocation(body, true)).unwrap();
        let width = 2 * D;
        let (keys, values) = (vectors(700, width, 11), vectors(700, width, 12));
        let positions: Vec<u32> = (0..700).collect();
        model.append_layer(0, &keys, &values, &positions).unwrap();
        let bytes = to_bytes(&model).unwrap();
        let loaded = from_bytes(&bytes).unwrap();
        assert_eq!(to_bytes(&loaded).unwrap(), bytes);
        let (before, after) = (model.kv(0).unwrap(), loaded.kv(0).unwrap());
        for g in 0..2 {
            assert_eq!(after.keys(g).body().order(), RecordOrder::FastScan);
            assert_eq!(after.values(g).body(), before.values(g).body());
        }
        for isa in Isa::available() {
            let a = run(isa, before, 6, &[0, 300, 699], 10);
            let b = run(isa, after, 6, &[0, 300, 699], 10);
            assert_eq!(common::bits(&a), common::bits(&b), "{isa:?}");
        }
    }
}

#[test]
fn record_order_is_a_whole_stream_setting_with_known_values() {
    use tq_cache::allocation::{AllocationError, FieldProblem};
    let base = "name = \"t\"\nkey = { codec = \"mse\", bits = 4 }\nvalue = { codec = \"mse\", bits = 4 }\n";
    let outliers =
        format!("{base}[outliers]\nchannels = 8\nkey = {{ record_order = \"fast-scan\" }}");
    match Allocation::from_toml_str(&outliers) {
        Err(AllocationError::Field { path, problem }) => {
            assert_eq!(path, "outliers.key.record_order");
            assert_eq!(problem, FieldProblem::WholeStreamOnly);
        }
        other => panic!("expected a field error, got {other:?}"),
    }
    let unknown = base.replace(
        "bits = 4 }\nvalue",
        "bits = 4, record_order = \"columns\" }\nvalue",
    );
    let m = Allocation::from_toml_str(&unknown).unwrap_err().to_string();
    assert!(m.contains("columns") && m.contains("fast-scan"), "{m}");
}

/// `basis_bits` is a whole-stream `mse` setting of widths 1 to 8: an empty list, a width
/// out of range, the `[outliers]` table or another codec is an error naming the field; it
/// survives a round trip through TOML; and a basis fitted under it uses only those widths.
#[test]
fn basis_bits_is_a_checked_list_of_widths() {
    use tq_cache::allocation::{AllocationError, FieldProblem};
    let with = |key: &str| {
        format!("name = \"t\"\nkey = {{ {key} }}\nvalue = {{ codec = \"mse\", bits = 4 }}\n")
    };
    for (key, says) in [
        (
            "codec = \"mse\", bits = 3, basis = \"pca\", basis_bits = []",
            "at least one width",
        ),
        (
            "codec = \"mse\", bits = 3, basis = \"pca\", basis_bits = [4, 9]",
            "not 9",
        ),
    ] {
        let m = Allocation::from_toml_str(&with(key))
            .unwrap_err()
            .to_string();
        assert!(m.contains("basis_bits") && m.contains(says), "{m}");
    }
    match Allocation::from_toml_str(&with("codec = \"f16\", basis_bits = [4, 2, 1]")) {
        Err(AllocationError::Field { path, problem }) => {
            assert_eq!(path, "key.basis_bits");
            assert!(
                matches!(problem, FieldProblem::NotApplicable { .. }),
                "{problem:?}"
            );
        }
        other => panic!("expected a field error, got {other:?}"),
    }
    let outliers = format!(
        "{}[outliers]\nchannels = 8\nkey = {{ basis_bits = [4] }}",
        with("codec = \"mse\", bits = 4")
    );
    match Allocation::from_toml_str(&outliers) {
        Err(AllocationError::Field { path, problem }) => {
            assert_eq!(path, "outliers.key.basis_bits");
            assert_eq!(problem, FieldProblem::WholeStreamOnly);
        }
        other => panic!("expected a field error, got {other:?}"),
    }
    let lever = allocation(NIBBLE_BASIS, true);
    let text = lever.to_toml_string().unwrap();
    assert!(text.contains("basis_bits = [4, 2, 1]"), "{text}");
    assert_eq!(Allocation::from_toml_str(&text).unwrap(), lever);
    // Without the list the same data fits groups of other widths (3 bits among them), which
    // take the order as bit planes.
    let free = cache(
        growing(2, D),
        &NIBBLE_BASIS.replace(", basis_bits = [4, 2, 1]", ""),
        true,
        700,
        21,
    );
    let TokenCodec::Basis(codec) = free.keys(0).codec() else {
        panic!("a fitted basis")
    };
    assert!(codec.groups().iter().any(|g| !matches!(g.bits, 1 | 2 | 4)));
    assert_eq!(free.keys(0).body().order(), RecordOrder::FastScan);
    assert!(free.keys(0).body().planes().is_some());
}

/// The shipped lever files and the two lower recommended presets put the streams they name in
/// the fast-scan order, the same bytes as the allocation they reorder (a preset, or a lever
/// in rows), and the setting survives a round trip through TOML (what a saved cache's
/// allocation records).
#[test]
fn the_fast_scan_lever_files_order_what_they_say() {
    let lever = |file: &str| {
        let path = format!("{}/presets/levers/{file}", env!("CARGO_MANIFEST_DIR"));
        Allocation::from_toml_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    };
    let (fast, rows) = (RecordOrder::FastScan, RecordOrder::Rows);
    for (file, reference, keys, values) in [
        (
            "mse-k4v4-fast-scan.toml",
            Allocation::preset("mse-k4v4").unwrap(),
            fast,
            fast,
        ),
        (
            "mse-k4v4-fast-scan-keys.toml",
            Allocation::preset("mse-k4v4").unwrap(),
            fast,
            rows,
        ),
        (
            "mse-k2v2-fast-scan.toml",
            lever("mse-k2v2.toml"),
            fast,
            fast,
        ),
        (
            "rec3.25-fast-scan-values.toml",
            lever("rec3.25-rows.toml"),
            rows,
            fast,
        ),
        (
            "rec2.5-fast-scan-values.toml",
            lever("rec2.5-rows.toml"),
            rows,
            fast,
        ),
        // The presets' recipes (their uniform bits; the presets' layer trades for SmolLM2
        // change some layers' widths), before their key basis is fitted: plain 3-bit keys
        // take the order as bit planes, plain 2-bit keys as nibbles (fitted, both hold 4-,
        // 2- and 1-bit groups in it: `a_nibble_basis_keeps_the_fast_scan_order`).
        (
            "rec3.25-uniform.toml",
            lever("rec3.25-rows.toml"),
            fast,
            fast,
        ),
        ("rec2.5-uniform.toml", lever("rec2.5-rows.toml"), fast, fast),
        (
            "tq3.5-fast-scan.toml",
            Allocation::preset("tq3.5").unwrap(),
            fast,
            fast,
        ),
        (
            "k5v4-fast-scan.toml",
            Allocation::preset("k5v4").unwrap(),
            fast,
            fast,
        ),
    ] {
        let lever = lever(file);
        let text = lever.to_toml_string().unwrap();
        assert!(text.contains("record_order = \"fast-scan\""), "{text}");
        assert_eq!(Allocation::from_toml_str(&text).unwrap(), lever);
        let plain = KvCache::with_allocation(growing(3, D), &reference, 0, 30).unwrap();
        let cache = KvCache::with_allocation(growing(3, D), &lever, 0, 30).unwrap();
        assert_eq!(cache.bytes_per_token(), plain.bytes_per_token(), "{file}");
        for g in 0..3 {
            assert_eq!(cache.keys(g).body().order(), keys, "{file}");
            assert_eq!(cache.values(g).body().order(), values, "{file}");
        }
    }
}

/// A basis stream asks for the fast-scan order before its first batch, when its codec is the
/// plain one (4-bit codes, their own nibbles); once the basis is fitted its records are parts
/// of several widths, some stored as bit planes — the same records, bit for bit, as one that
/// never asked. Cleared, it returns to the plain codec's nibbles keeping its pages, and
/// refilled it gives what a fresh cache gives.
#[test]
fn a_basis_stream_takes_bit_planes_when_fitted_and_leaves_them_when_cleared() {
    let body = "key = { codec = \"mse\", bits = 4, basis = \"pca\", ORDER }\n\
                value = { codec = \"mse\", bits = 4, ORDER }";
    let fresh = || KvCache::with_allocation(growing(2, D), &allocation(body, true), 0, 1).unwrap();
    let mut fast = fresh();
    assert_eq!(fast.keys(0).body().order(), RecordOrder::FastScan);
    assert!(fast.keys(0).body().planes().is_none());
    common::fill(&mut fast, 0, 700, 13);
    let rows = cache(growing(2, D), body, false, 700, 13);
    for g in 0..2 {
        fitted_basis(fast.keys(g), Widths::SomeWide);
        assert_eq!(fast.keys(g).body().order(), RecordOrder::FastScan);
        assert!(fast.keys(g).body().planes().is_some());
        assert_eq!(fast.values(g).body().order(), RecordOrder::FastScan);
        assert_eq!(stored_records(fast.keys(g)), stored_records(rows.keys(g)));
    }
    let grown = fast.keys(0).body().capacity();
    let bytes = fast.keys(0).body().allocated_bytes();
    fast.clear();
    assert_eq!(fast.keys(0).body().order(), RecordOrder::FastScan);
    assert!(fast.keys(0).body().planes().is_none());
    // Cleared, it keeps the pages it grew.
    assert_eq!(fast.keys(0).body().capacity(), grown);
    assert_eq!(fast.keys(0).body().allocated_bytes(), bytes);
    common::fill(&mut fast, 0, 700, 14);
    let mut again = fresh();
    common::fill(&mut again, 0, 700, 14);
    for isa in Isa::available() {
        let a = run(isa, &fast, 6, &[0, 350, 699], 15);
        let b = run(isa, &again, 6, &[0, 350, 699], 15);
        assert_eq!(common::bits(&a), common::bits(&b), "{isa:?}");
    }
}

/// A basis of whole nibbles: 3-bit streams with a principal-component basis whose groups
/// may only have 4, 2 or 1 bits (`basis_bits`), so the fitted records (several groups, one
/// after another) stay in the fast-scan order.
const NIBBLE_BASIS: &str = "key = { codec = \"mse\", bits = 3, basis = \"pca\", basis_bits = [4, 2, 1], ORDER }\n\
    value = { codec = \"mse\", bits = 3, basis = \"pca\", basis_bits = [4, 2, 1], ORDER }";

/// A basis of free widths: 4-bit streams with a principal-component basis whose groups take
/// any width (5 to 8 and 3 bits among them, on this data), stored as bit planes.
const FREE_BASIS: &str = "key = { codec = \"mse\", bits = 4, basis = \"pca\", ORDER }\n\
    value = { codec = \"mse\", bits = 4, basis = \"pca\", ORDER }";

/// The widths a fitted basis must have.
#[derive(Clone, Copy, Debug)]
enum Widths {
    /// Every group 1, 2 or 4 bits.
    Nibbles,
    /// At least one group of another width (bit planes).
    SomeWide,
}

/// The two bases the basis tests run on, with the widths each must fit.
const BASES: [(&str, Widths); 2] = [
    (NIBBLE_BASIS, Widths::Nibbles),
    (FREE_BASIS, Widths::SomeWide),
];

/// `x` and `y` hold the same tokens from the same first one, decoded bit for bit.
fn assert_same_tokens(what: &str, x: &tq_cache::stream::Stream, y: &tq_cache::stream::Stream) {
    let mut scratch = CodecScratch::new(D);
    let (mut a, mut b) = (vec![0.0f32; D], vec![0.0f32; D]);
    assert_eq!(x.first_stored(), y.first_stored(), "{what}");
    assert_eq!(x.len(), y.len(), "{what}");
    for t in x.first_stored()..x.len() {
        x.decode(t, &mut scratch, &mut a).unwrap();
        y.decode(t, &mut scratch, &mut b).unwrap();
        assert_eq!(common::bits(&a), common::bits(&b), "{what}: token {t}");
    }
}

/// Every token's stored record and norm, gathered back from the body's blocks.
fn stored_records(stream: &tq_cache::stream::Stream) -> Vec<(Vec<u32>, f32)> {
    (0..stream.body().len())
        .map(|t| {
            let (words, scales) = stream.body().record_copy(t).unwrap();
            (words.into_owned(), scales[0].to_f32())
        })
        .collect()
}

/// The fitted basis of `stream`, with at least two groups, of the widths `widths` asks for.
fn fitted_basis(stream: &tq_cache::stream::Stream, widths: Widths) -> &tq_cache::basis::BasisCodec {
    let TokenCodec::Basis(codec) = stream.codec() else {
        panic!("a fitted basis")
    };
    let bits: Vec<u8> = codec.groups().iter().map(|g| g.bits).collect();
    let nibbles = bits.iter().filter(|b| matches!(b, 1 | 2 | 4)).count();
    let fits = match widths {
        Widths::Nibbles => nibbles == bits.len(),
        Widths::SomeWide => nibbles < bits.len(),
    };
    assert!(bits.len() >= 2 && fits, "{widths:?}: {bits:?}");
    codec
}

/// A fitted basis keeps the fast-scan order, its groups of 1, 2 or 4 bits as nibbles and
/// the others as bit planes; the same records as in rows, the same bits at any thread count,
/// and a saved cache reloads bit-identical.
#[test]
fn a_nibble_basis_keeps_the_fast_scan_order() {
    for (body, widths) in BASES {
        a_basis_keeps_the_fast_scan_order(body, widths);
    }
}

fn a_basis_keeps_the_fast_scan_order(basis: &str, widths: Widths) {
    let fast = cache(growing(2, D), basis, true, 1300, 21);
    let rows = cache(growing(2, D), basis, false, 1300, 21);
    for g in 0..2 {
        for (x, y) in [
            (fast.keys(g), rows.keys(g)),
            (fast.values(g), rows.values(g)),
        ] {
            fitted_basis(x, widths);
            assert_eq!(x.body().order(), RecordOrder::FastScan);
            assert_eq!(y.body().order(), RecordOrder::Rows);
            assert_same_tokens("nibble basis", x, y);
        }
    }
    let positions = [0u32, 255, 700, 1299];
    for isa in Isa::available() {
        let one = in_pool(1, || run(isa, &fast, 6, &positions, 22));
        let three = in_pool(3, || run(isa, &fast, 6, &positions, 22));
        assert_eq!(common::bits(&one), common::bits(&three), "{isa:?}");
    }
    use tq_cache::persist::{from_bytes, to_bytes};
    use tq_cache::states::{ModelCache, StateKind, StateSpec};
    let specs = vec![StateSpec {
        name: "l0".into(),
        kind: StateKind::Kv {
            layer: 0,
            layout: growing(2, D),
        },
    }];
    let mut model = ModelCache::with_allocation(specs, &allocation(basis, true)).unwrap();
    let (keys, values) = (vectors(700, 2 * D, 23), vectors(700, 2 * D, 24));
    let all: Vec<u32> = (0..700).collect();
    model.append_layer(0, &keys, &values, &all).unwrap();
    let bytes = to_bytes(&model).unwrap();
    let loaded = from_bytes(&bytes).unwrap();
    assert_eq!(to_bytes(&loaded).unwrap(), bytes);
    let (before, after) = (model.kv(0).unwrap(), loaded.kv(0).unwrap());
    assert_eq!(after.keys(0).body().order(), RecordOrder::FastScan);
    for isa in Isa::available() {
        let x = run(isa, before, 6, &[0, 300, 699], 25);
        let y = run(isa, after, 6, &[0, 300, 699], 25);
        assert_eq!(common::bits(&x), common::bits(&y), "{isa:?}");
    }
}

/// Nibble-basis keys in the fast-scan order (values f16): the softmax of the fast scores
/// computed here token by token — each query head's table over all groups built from the
/// public codec (each group's slice of the projected query, rotated and scaled by `a_G`,
/// against its own codebook, lanes one after another), each token's integer sum read from its
/// record's nibbles — within f32 rounding (`2e-4·max|v| + 1e-5`, f64 softmax). A group read
/// from the wrong lanes, or scored against another group's or head's query or codebook, moves
/// the output far past it.
///
/// Groups stored as bit planes (the free basis) add, per coordinate, the product of two
/// integers computed here from the table's public unit: `Q_j · E_k`, `E_k = round(2048·c_k /
/// max|c|)`, `Q_j = round(q'_j · (max|c| / 2048 / sum_step))` (their nibble lanes have zero
/// entries), the nibble lanes' bytes then counting `lane_unit` units each.
#[test]
fn nibble_basis_keys_score_with_one_table_over_the_groups() {
    for (body, widths) in BASES {
        basis_keys_score_with_one_table_over_the_groups(body, widths);
    }
}

fn basis_keys_score_with_one_table_over_the_groups(basis: &str, widths: Widths) {
    use tq_cache::attention::fast_scan::TablePart;
    let body = format!(
        "{}\nvalue = {{ codec = \"f16\" }}",
        basis.lines().next().unwrap().trim_end_matches('\\')
    );
    let (kv, q_heads, tokens) = (2usize, 6usize, 1300usize);
    let group_size = q_heads / kv;
    let cache = cache(growing(kv, D), &body, true, tokens, 26);
    let positions = [3u32, 640, 1299];
    let queries = vectors(positions.len() * q_heads, D, 27);
    let tolerance = 2e-4 * max_abs_value(&cache) + 1e-5;
    let scale = shape(q_heads).scale;
    let outputs: Vec<(Isa, Vec<f32>)> = Isa::available()
        .into_iter()
        .map(|isa| (isa, run(isa, &cache, q_heads, &positions, 27)))
        .collect();
    for g in 0..kv {
        let keys = cache.keys(g);
        let codec = fitted_basis(keys, widths);
        let records = stored_records(keys);
        let planes_expected = matches!(widths, Widths::SomeWide);
        let values = decoded_values(&cache, g, tokens);
        for (i, &p) in positions.iter().enumerate() {
            for h in 0..group_size {
                let row = (i * kv + g) * group_size + h;
                let q: Vec<f32> = queries[row * D..(row + 1) * D]
                    .iter()
                    .map(|x| x * scale)
                    .collect();
                let mut projected = vec![0.0f32; codec.rank()];
                codec.project(&q, &mut projected);
                let slices: Vec<Vec<f32>> = codec
                    .groups()
                    .iter()
                    .map(|group| {
                        let gathered: Vec<f32> = group
                            .components
                            .iter()
                            .map(|&c| projected[usize::from(c)])
                            .collect();
                        let mut rotated = vec![0.0f32; group.len()];
                        group.rotation.apply(&gathered, &mut rotated).unwrap();
                        rotated.iter().map(|v| v * group.scale).collect()
                    })
                    .collect();
                let parts: Vec<TablePart<'_>> = codec
                    .groups()
                    .iter()
                    .zip(&slices)
                    .map(|(group, query)| TablePart {
                        query,
                        centroids: group.codebook.centroids_f32(),
                        bits: group.bits,
                        lanes: 8 * group.words(),
                    })
                    .collect();
                let mut table = ScoreTable::default();
                table
                    .rebuild_parts(&parts, 8 * codec.record_words())
                    .unwrap();
                let scores: Vec<f64> = records[..=p as usize]
                    .iter()
                    .map(|(words, norm)| {
                        let nibbles: u32 = (0..table.lanes())
                            .map(|l| {
                                let nibble = (words[l / 8] >> (4 * (l % 8))) & 0x0F;
                                u32::from(table.entry(l, nibble as u8).unwrap())
                            })
                            .sum();
                        let planes: i64 = codec
                            .groups()
                            .iter()
                            .zip(&slices)
                            .filter(|(group, _)| !matches!(group.bits, 1 | 2 | 4))
                            .map(|(group, query)| {
                                plane_entries(group, query, words, table.sum_step())
                            })
                            .sum();
                        let unit = table.lane_unit();
                        assert_eq!(unit > 1, planes_expected);
                        assert_eq!(table.sum_step(), table.step() / unit as f32);
                        let sum = i64::from(unit * nibbles) + planes;
                        let sum = i32::try_from(sum).expect("a sum within 31 bits") as u32;
                        f64::from(norm * table.dequantize(sum))
                    })
                    .collect();
                let expected = softmax_mix(&scores, &values);
                for (isa, got) in &outputs {
                    close(
                        &format!("{isa:?}, head {g}/{h}, position {p}"),
                        &got[row * D..(row + 1) * D],
                        &expected,
                        tolerance,
                    );
                }
            }
        }
    }
}

/// The products of a group stored as bit planes for one record: per coordinate `j` of its
/// query slice, `Q_j · E_k` at the token's code `k`, `E_k = round(2048·c_k / max|c|)` and
/// `Q_j = round(q'_j · (max|c| / 2048 / sum_step))` (half away from zero).
fn plane_entries(
    group: &tq_cache::basis::GroupCodec,
    query: &[f32],
    words: &[u32],
    sum_step: f32,
) -> i64 {
    let centroids = group.codebook.centroids_f32();
    let c_abs = centroids.iter().fold(0.0f32, |m, c| m.max(c.abs()));
    let mut codes = vec![0u8; group.len()];
    let own = &words[group.word_offset..group.word_offset + group.words()];
    tq_cache::codec::packing::unpack(own, group.bits, &mut codes).unwrap();
    let scale = c_abs / 2048.0 / sum_step;
    query
        .iter()
        .zip(&codes)
        .map(|(&q, &k)| {
            let e = (centroids[usize::from(k)] * 2048.0 / c_abs).round() as i64;
            (q * scale).round() as i64 * e
        })
        .sum()
}

/// Nibble-basis values in the fast-scan order (keys f16), zero queries (every weight 1): the
/// output is the integer sums computed here group by group from each token's codes — per
/// block the weight bytes of the norms, each group's centroids as bytes — turned back through
/// the group's rotation and scale and the basis rows, within f32 rounding. A group summed
/// from another group's lanes or with another group's codebook moves it far past that.
/// The free basis's groups stored as bit planes are summed the same way.
#[test]
fn nibble_basis_values_sum_the_integer_weights() {
    for (body, widths) in BASES {
        basis_values_sum_the_integer_weights(body, widths);
    }
}

fn basis_values_sum_the_integer_weights(basis: &str, widths: Widths) {
    let body = format!(
        "key = {{ codec = \"f16\" }}\n{}",
        basis.lines().nth(1).unwrap().trim()
    );
    let (kv, q_heads, tokens) = (2usize, 6usize, 1300usize);
    let fast = cache(growing(kv, D), &body, true, tokens, 28);
    let tolerance = 2e-4 * max_abs_value(&fast) + 1e-5;
    let positions = [0u32, 31, 32, 700, 1299];
    let zeros = vec![0.0f32; positions.len() * q_heads * D];
    let outputs: Vec<(Isa, Vec<f32>)> = Isa::available()
        .into_iter()
        .map(|isa| {
            let mut got = vec![0.0f32; zeros.len()];
            fused_attention_on(isa, &fast, &zeros, &positions, shape(q_heads), &mut got).unwrap();
            (isa, got)
        })
        .collect();
    for g in 0..kv {
        let values = fast.values(g);
        let codec = fitted_basis(values, widths);
        let records = stored_records(values);
        for (i, &p) in positions.iter().enumerate() {
            let visible = &records[..=p as usize];
            let mut components = vec![0.0f32; codec.rank()];
            for group in codec.groups() {
                let (gamma, e) = common::centroid_bytes(group.codebook.centroids_f32());
                let mut codes = vec![0u8; group.len()];
                let mut rotated = vec![0.0f64; group.len()];
                for block in visible.chunks(BLOCK) {
                    let block: Vec<(Vec<u8>, f32)> = block
                        .iter()
                        .map(|(words, w)| {
                            let own = &words[group.word_offset..group.word_offset + group.words()];
                            tq_cache::codec::packing::unpack(own, group.bits, &mut codes).unwrap();
                            (codes.clone(), *w)
                        })
                        .collect();
                    common::add_block_sum(&block, &e, &mut rotated);
                }
                let mean: Vec<f32> = rotated
                    .iter()
                    .map(|r| (r * f64::from(gamma) / visible.len() as f64) as f32)
                    .collect();
                let mut back = vec![0.0f32; group.len()];
                group.rotation.apply_inverse(&mean, &mut back).unwrap();
                for (&c, v) in group.components.iter().zip(&back) {
                    components[usize::from(c)] = v * group.scale;
                }
            }
            let mut expected = vec![0.0f32; D];
            codec.add_back(&components, &mut expected);
            for (isa, got) in &outputs {
                for h in 0..q_heads / kv {
                    let row = (i * kv + g) * (q_heads / kv) + h;
                    close(
                        &format!("{isa:?}, head {g}/{h}, position {p}"),
                        &got[row * D..(row + 1) * D],
                        &expected,
                        tolerance,
                    );
                }
            }
        }
    }
}

/// The recommended presets `rec3.25` and `rec2.5` fitted as on a model (the first batch with
/// queries whose energy falls over the RoPE planes, so the plane basis gets groups of several
/// widths): their keys hold 4-, 2- and 1-bit groups in the fast-scan order, the same records
/// as their rows twins (`levers/*-nibbles.toml`), which hold them in rows.
#[test]
fn the_lower_recommended_presets_fit_nibble_bases_in_the_fast_scan_order() {
    let (kv, q_heads, n) = (2usize, 6usize, 700usize);
    let layout = growing(kv, D);
    let keys = vectors(n, kv * D, 31);
    let values = vectors(n, kv * D, 32);
    let queries: Vec<f32> = vectors(64, q_heads * D, 33)
        .iter()
        .enumerate()
        .map(|(i, q)| q * 16f32.powf(-(((i % D) / 2) as f32) / (D / 2) as f32))
        .collect();
    let positions: Vec<u32> = (0..n as u32).collect();
    for name in ["rec3.25", "rec2.5"] {
        let path = format!(
            "{}/presets/levers/{name}-nibbles.toml",
            env!("CARGO_MANIFEST_DIR")
        );
        let twin = Allocation::from_toml_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        // The presets' uniform recipes (their SmolLM2 layer trades change layer 0's widths).
        let uniform = format!(
            "{}/presets/levers/{name}-uniform.toml",
            env!("CARGO_MANIFEST_DIR")
        );
        let recipe = Allocation::load(&uniform).unwrap();
        let [mut fast, mut rows] =
            [recipe, twin].map(|alloc| KvCache::with_allocation(layout, &alloc, 0, 30).unwrap());
        for cache in [&mut fast, &mut rows] {
            cache
                .append_with_queries(&keys, &values, &positions, &queries, q_heads)
                .unwrap();
        }
        for g in 0..kv {
            fitted_basis(fast.keys(g), Widths::Nibbles);
            for (x, y) in [
                (fast.keys(g), rows.keys(g)),
                (fast.values(g), rows.values(g)),
            ] {
                assert_eq!(x.body().order(), RecordOrder::FastScan, "{name}");
                assert_eq!(y.body().order(), RecordOrder::Rows, "{name}");
                assert_eq!(x.len(), n, "{name}");
                assert_same_tokens(name, x, y);
            }
        }
    }
}
