//! Heavy hitters: a token that drew `factor` times its uniform share of attention while in the
//! window keeps its window copy, and every kernel reads that copy instead of its codes.

mod common;

use common::{Tokens, assert_rows_match, bits, codec, growing};
use tq_cache::CodecSpec;
use tq_cache::attention::{
    AttentionKernel, AttentionShape, attend, attend_in_step, attend_in_step_gathering,
};
use tq_cache::codec::CodecScratch;
use tq_cache::heavy_hitters::ReceivedWeights;
use tq_cache::kv_cache::{KvCache, KvLayout, uniform_streams};
use tq_cache::record_order::RecordOrder;
use tq_cache::stream::StreamLayout;

const D: usize = 64;
const KV: usize = 2;
const Q: usize = 6;
const SINKS: usize = 2;
const RECENT: usize = 16;

const SHAPE: AttentionShape = AttentionShape {
    q_heads: Q,
    scale: 0.125,
};

/// 4-bit TQ_mse keys and 3-bit values (rows or the fast-scan order), 2 f16 sinks, 8-bit
/// windows of 16 tokens, heavy hitters at `factor` (`None`: none).
fn cache(factor: Option<f32>, order: RecordOrder) -> KvCache {
    cache_in(factor, order, 0)
}

/// [`cache`] in rows that may rewind `max_rewind` tokens.
fn cache_with_rewind(factor: Option<f32>, max_rewind: usize) -> KvCache {
    cache_in(factor, RecordOrder::Rows, max_rewind)
}

fn cache_in(factor: Option<f32>, order: RecordOrder, max_rewind: usize) -> KvCache {
    cache_of(factor, [order; 2], 3, max_rewind)
}

/// [`cache`] with keys and values in `orders` and `value_bits`-bit values.
fn cache_of(
    factor: Option<f32>,
    orders: [RecordOrder; 2],
    value_bits: u8,
    max_rewind: usize,
) -> KvCache {
    let layout = KvLayout {
        max_rewind,
        ..growing(KV, D)
    };
    let streams = |spec, order: RecordOrder| -> Vec<StreamLayout> {
        uniform_streams(&layout, spec)
            .into_iter()
            .map(|mut s| {
                s.sink_tokens = SINKS;
                s.recent_tokens = RECENT;
                s.recent = Some(CodecSpec::Q8 { dim: D });
                s.order = order;
                s.heavy_hitters = factor;
                s.max_rewind = max_rewind;
                s
            })
            .collect()
    };
    KvCache::new(
        layout,
        &streams(codec(2, D, 4, 3), orders[0]),
        &streams(codec(2, D, value_bits, 4), orders[1]),
    )
    .unwrap()
}

/// Tokens whose keys are mostly one shared direction plus noise, so that queries, which share
/// it too, give some tokens far more than their uniform share.
fn tokens(n: usize, seed: u64) -> Tokens {
    let mut t = Tokens::new(n, KV, Q, D, seed);
    for (i, k) in t.keys.chunks_exact_mut(D).enumerate() {
        // Every fifth token's key leans on coordinate 0, which every query favours.
        if (i / KV).is_multiple_of(5) {
            k[0] += 3.0;
        }
    }
    for q in t.queries.chunks_exact_mut(D) {
        q[0] += 2.0;
    }
    t
}

fn run(cache: &mut KvCache, t: &Tokens, from: usize, to: usize, piece: usize) -> Vec<f32> {
    common::forward_in_pieces(cache, t, from, to, piece, SHAPE)
}

/// Per token `0..end`, the softmax weight the query heads of KV head `g` at row `i` give it over
/// the records a row whose window starts at `window` reads (scores in f64, the codec's score
/// correction applied), the mean over the group's heads.
fn group_softmax(
    keys: &tq_cache::stream::Stream,
    queries: &[f32],
    (i, g): (usize, usize),
    (end, window): (usize, usize),
) -> Vec<f64> {
    let mut scratch = CodecScratch::new(D);
    let mut k = vec![0.0f32; D];
    let mut p = vec![0.0f64; end];
    for h in g * (Q / KV)..(g + 1) * (Q / KV) {
        let q = &queries[(i * Q + h) * D..][..D];
        let scores: Vec<f64> = (0..end)
            .map(|t| {
                let codec = keys.decode_read(t, window, &mut scratch, &mut k).unwrap();
                let correction = f64::from(codec.score_correction());
                0.125
                    * correction
                    * q.iter()
                        .zip(&k)
                        .map(|(a, b)| f64::from(*a) * f64::from(*b))
                        .sum::<f64>()
            })
            .collect();
        let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let total: f64 = scores.iter().map(|s| (s - max).exp()).sum();
        for (p, s) in p.iter_mut().zip(&scores) {
            *p += (s - max).exp() / total / (Q / KV) as f64;
        }
    }
    p
}

/// Tokens that left the window are kept and change what attention returns; the fused kernel
/// reads their copies as the reference does (rows: within f32 rounding of the reference; a
/// body run misaligned at a kept token reads other tokens' codes and moves a row by ~1e-2 of
/// max|v|). The fast-scan order walks the same runs (its byte tables are a different score,
/// tested against their own bound in fast_scan_cache.rs); the reference kernel, which decodes
/// the same codes in either order, keeps the same tokens in both.
#[test]
fn kept_tokens_are_read_from_their_copies_by_every_kernel() {
    let t = tokens(200, 5);
    let max_v = t.values.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let qw = Q * D;
    let positions: Vec<u32> = (0..200).collect();
    let queries = &t.queries[..200 * qw];
    let attend_all = |cache: &KvCache, kernel| {
        let mut out = vec![0.0f32; 200 * qw];
        attend(cache, queries, &positions, SHAPE, kernel, &mut out).unwrap();
        out
    };
    let mut with = cache(Some(2.0), RecordOrder::Rows);
    let mut without = cache(None, RecordOrder::Rows);
    run(&mut with, &t, 0, 200, 7);
    run(&mut without, &t, 0, 200, 7);
    for g in 0..KV {
        for stream in [with.keys(g), with.values(g)] {
            let kept = stream.heavy_hitters().unwrap().kept();
            // Some tokens are kept, not every one, none in the sinks or in the window of the
            // next decode step.
            assert!(!kept.is_empty() && kept.len() < 100, "{kept:?}");
            assert!(kept.iter().all(|&k| k as usize >= SINKS));
            assert!(kept.iter().all(|&k| (k as usize) <= stream.recent_start()));
            let k = kept[0] as usize;
            let (codec, ..) = stream.read(k, stream.recent_start()).unwrap();
            assert_eq!(codec.spec(), stream.recent_codec().spec());
        }
    }
    let fused = attend_all(&with, AttentionKernel::Fused);
    assert_rows_match(
        &fused,
        &attend_all(&with, AttentionKernel::Reference),
        max_v,
        D,
    );
    assert_ne!(
        bits(&fused),
        bits(&attend_all(&without, AttentionKernel::Fused))
    );
    // Both orders, decisions by the reference kernel.
    let decided = |order| {
        let mut c = cache(Some(2.0), order);
        common::forward_in_pieces_with(&mut c, &t, (0, 200), 7, SHAPE, AttentionKernel::Reference);
        c
    };
    let (rows, fast) = (decided(RecordOrder::Rows), decided(RecordOrder::FastScan));
    for g in 0..KV {
        assert_eq!(
            rows.keys(g).heavy_hitters().unwrap().kept(),
            fast.keys(g).heavy_hitters().unwrap().kept()
        );
    }
    // The fast-scan order reads the kept copies too: its rows move with them.
    let mut plain = cache(None, RecordOrder::FastScan);
    common::forward_in_pieces_with(
        &mut plain,
        &t,
        (0, 200),
        7,
        SHAPE,
        AttentionKernel::Reference,
    );
    assert_ne!(
        bits(&attend_all(&fast, AttentionKernel::Fused)),
        bits(&attend_all(&plain, AttentionKernel::Fused))
    );
}

/// A fast-scan run goes on through the kept tokens in it (a block cut there would be summed
/// twice): their codes must weigh nothing in its integer value sums and their copies what
/// the codes would have. With zero queries every token the row sees weighs `e^0 = 1` (rows
/// keys: every score exactly 0), so the output is the mean of the copies the row reads
/// (sinks, window, kept tokens: decoded here) and of the body's integer sums, computed here as
/// the kernel sums them: per block of 32 slots the weights `w = norm` of its tokens outside
/// the kept ones round to `round(w / s)`, `s` their largest over 127, times the centroids'
/// bytes (`fast_scan_values_sum_the_integer_weights` in fast_scan_cache.rs). A kept token's
/// codes weighed in, its copy left out, or a block scaled with a kept token's weight moves a
/// coordinate by more than the f32 rounding allowed (checked by breaking each).
#[test]
fn fast_scan_runs_weigh_kept_tokens_by_their_copies_alone() {
    use tq_cache::TokenCodec;
    use tq_cache::attention::simd::Isa;
    const BLOCK: usize = 32;
    let n = 200;
    let t = tokens(n, 5);
    let mut c = cache_of(Some(2.0), [RecordOrder::Rows, RecordOrder::FastScan], 4, 0);
    run(&mut c, &t, 0, n, 7);
    let zeros = vec![0.0f32; Q * D];
    let mut got = vec![0.0f32; Q * D];
    let max_v = t.values.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let mut kept_in_blocks = 0;
    for g in 0..KV {
        let values = c.values(g);
        let kept = values.heavy_hitters().unwrap().kept();
        let window = values.window_start(n, false);
        kept_in_blocks += kept.len();
        let TokenCodec::Mse(codec) = values.codec() else {
            panic!("TQ_mse values")
        };
        let (gamma, e) = common::centroid_bytes(codec.codebook().centroids_f32());
        let mut codes = vec![0u8; D];
        let mut rotated = vec![0.0f64; D];
        for block in (SINKS..window)
            .collect::<Vec<_>>()
            .chunk_by(|a, b| a / BLOCK == b / BLOCK)
        {
            let records: Vec<(Vec<u8>, f32)> = block
                .iter()
                .filter(|&&t| !kept.contains(&(t as u32)))
                .map(|&t| {
                    let (words, scales) = values.body().record_copy(t).unwrap();
                    tq_cache::codec::packing::unpack(&words, 4, &mut codes).unwrap();
                    (codes.clone(), scales[0].to_f32())
                })
                .collect();
            common::add_block_sum(&records, &e, &mut rotated);
        }
        let body: Vec<f32> = rotated
            .iter()
            .map(|r| (r * f64::from(gamma)) as f32)
            .collect();
        let mut sum: Vec<f64> = vec![0.0; D];
        let mut back = vec![0.0f32; D];
        codec.rotation().apply_inverse(&body, &mut back).unwrap();
        for (s, b) in sum.iter_mut().zip(&back) {
            *s += f64::from(*b);
        }
        let mut scratch = CodecScratch::new(D);
        // A token kept as it leaves the window is read from the window until it has.
        let kept_before = kept.iter().map(|&k| k as usize).filter(|&k| k < window);
        let copies = (0..SINKS).chain(kept_before).chain(window..n);
        for t in copies {
            values
                .decode_read(t, window, &mut scratch, &mut back)
                .unwrap();
            for (s, b) in sum.iter_mut().zip(&back) {
                *s += f64::from(*b);
            }
        }
        let expected: Vec<f32> = sum.iter().map(|s| (s / n as f64) as f32).collect();
        for isa in Isa::available() {
            tq_cache::attention::simd::fused_attention_on(
                isa,
                &c,
                &zeros,
                &[n as u32 - 1],
                SHAPE,
                &mut got,
            )
            .unwrap();
            for h in 0..Q / KV {
                let row = &got[(g * (Q / KV) + h) * D..][..D];
                for (j, (&x, &y)) in row.iter().zip(&expected).enumerate() {
                    assert!(
                        (x - y).abs() <= 2e-5 * max_v,
                        "{isa:?} head {g}/{h} coordinate {j}: {x} vs {y}"
                    );
                }
            }
        }
    }
    assert!(kept_in_blocks >= 4, "{kept_in_blocks}");
}

/// Keys in the fast-scan order: a run's kept tokens are scored from their copies, the rest
/// from the byte tables. The softmax of scores computed here token by token — `q·k` of the
/// decoded copy for sinks, kept tokens and the window, the public [`ScoreTable`] and
/// [`block_sums`] over each token's codes elsewhere (`keys_score_with_the_byte_tables` in
/// fast_scan_cache.rs) — applied to the values the row reads (rows, decoded), against the
/// fused output within f32 rounding. A kept token scored from its codes moves it by more
/// (checked by breaking it).
#[test]
fn fast_scan_runs_score_kept_tokens_from_their_copies() {
    use tq_cache::TokenCodec;
    use tq_cache::attention::fast_scan::{BLOCK, FastScanBlocks, ScoreTable, block_sums};
    use tq_cache::attention::simd::Isa;
    let n = 200;
    let t = tokens(n, 5);
    let mut c = cache_of(Some(2.0), [RecordOrder::FastScan, RecordOrder::Rows], 4, 0);
    run(&mut c, &t, 0, n, 7);
    let query = &t.queries[(n - 1) * Q * D..n * Q * D];
    let mut got = vec![0.0f32; Q * D];
    let max_v = t.values.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let mut scratch = CodecScratch::new(D);
    let mut x = vec![0.0f32; D];
    let mut kept_scored = 0;
    for g in 0..KV {
        let (keys, values) = (c.keys(g), c.values(g));
        let TokenCodec::Mse(codec) = keys.codec() else {
            panic!("TQ_mse keys")
        };
        let window = keys.window_start(n, false);
        let kept = keys.heavy_hitters().unwrap().kept();
        let copied = |t: usize| t < SINKS || t >= window || kept.contains(&(t as u32));
        kept_scored += kept.iter().filter(|&&k| (k as usize) < window).count();
        let mut blocks = FastScanBlocks::new(D, 4).unwrap();
        let mut codes = vec![0u8; D];
        for t in 0..window {
            let (words, scales) = keys.body().record_copy(t).unwrap();
            tq_cache::codec::packing::unpack(&words, 4, &mut codes).unwrap();
            blocks.push(&codes, scales[0].to_f32()).unwrap();
        }
        let value_window = values.window_start(n, false);
        let read: Vec<Vec<f32>> = (0..n)
            .map(|t| {
                values
                    .decode_read(t, value_window, &mut scratch, &mut x)
                    .unwrap();
                x.clone()
            })
            .collect();
        for isa in Isa::available() {
            tq_cache::attention::simd::fused_attention_on(
                isa,
                &c,
                query,
                &[n as u32 - 1],
                SHAPE,
                &mut got,
            )
            .unwrap();
            for h in g * (Q / KV)..(g + 1) * (Q / KV) {
                let q: Vec<f32> = query[h * D..(h + 1) * D]
                    .iter()
                    .map(|x| x * SHAPE.scale)
                    .collect();
                let mut rotated = vec![0.0f32; D];
                codec.rotation().apply(&q, &mut rotated).unwrap();
                let table = ScoreTable::new(&rotated, codec.codebook().centroids_f32(), 4).unwrap();
                let mut sums = [0u32; BLOCK];
                let scores: Vec<f64> = (0..n)
                    .map(|t| {
                        if copied(t) {
                            keys.decode_read(t, window, &mut scratch, &mut x).unwrap();
                            return q.iter().zip(&x).map(|(a, b)| f64::from(a * b)).sum();
                        }
                        block_sums(Isa::Scalar, &table, &blocks, t / BLOCK, &mut sums).unwrap();
                        let norm = keys.body().record_copy(t).unwrap().1[0].to_f32();
                        f64::from(norm * table.dequantize(sums[t % BLOCK]))
                    })
                    .collect();
                let top = scores.iter().fold(f64::NEG_INFINITY, |m, &s| m.max(s));
                let weights: Vec<f64> = scores.iter().map(|s| (s - top).exp()).collect();
                let total: f64 = weights.iter().sum();
                for j in 0..D {
                    let expected: f64 = weights
                        .iter()
                        .zip(&read)
                        .map(|(w, v)| w * f64::from(v[j]))
                        .sum();
                    let expected = (expected / total) as f32;
                    let x = got[h * D + j];
                    assert!(
                        (x - expected).abs() <= 2e-4 * max_v + 1e-5,
                        "{isa:?} head {h} coordinate {j}: {x} vs {expected}"
                    );
                }
            }
        }
    }
    assert!(kept_scored >= 4, "{kept_scored}");
}

/// The weights the kernels hand back are each window token's share of the softmax over all
/// the tokens a row sees (the mean over the KV head's query heads), computed here from the
/// records the row reads; the fused kernel's agree with the reference's to f32 rounding (in
/// rows: the fast-scan order scores with byte tables, a different score by design).
#[test]
fn the_weights_handed_back_are_each_window_tokens_softmax_share() {
    let t = tokens(120, 8);
    let mut c = cache(Some(2.0), RecordOrder::Rows);
    run(&mut c, &t, 0, 100, 9);
    // A batch of 20 more tokens, then its rows' weights from both kernels.
    let (kw, qw) = (KV * D, Q * D);
    c.append(
        &t.keys[100 * kw..120 * kw],
        &t.values[100 * kw..120 * kw],
        &(100..120).collect::<Vec<u32>>(),
    )
    .unwrap();
    let positions: Vec<u32> = (100..120).collect();
    let queries = &t.queries[100 * qw..120 * qw];
    let mut out = vec![0.0f32; 20 * qw];
    let mut by_kernel = Vec::new();
    for kernel in [AttentionKernel::Reference, AttentionKernel::Fused] {
        let mut received = ReceivedWeights::default();
        attend_in_step_gathering(
            &c,
            queries,
            &positions,
            SHAPE,
            kernel,
            (&mut out, &mut received),
        )
        .unwrap();
        by_kernel.push(received);
    }
    let (reference, fused) = (&by_kernel[0], &by_kernel[1]);
    assert_eq!(reference.items, fused.items);
    for (item, row) in reference.items.iter().enumerate() {
        let (i, g) = (item / KV, item % KV);
        let keys = c.keys(g);
        let end = 101 + i;
        assert_eq!((row.end, row.visible), (end, end));
        let window = keys.window_start(end, true);
        assert_eq!(
            row.first,
            window.min(c.values(g).window_start(end, true)).max(SINKS)
        );
        // Softmax of each query head of the group over the records the row reads.
        let expected = &group_softmax(keys, queries, (i, g), (end, window))[row.first..];
        let (_, got) = reference.item(item);
        let (_, fast) = fused.item(item);
        for ((&e, &r), &f) in expected.iter().zip(got).zip(fast) {
            assert!((e - f64::from(r)).abs() <= 1e-6, "item {item}: {e} vs {r}");
            // f32 scores and sums over ~100 tokens: a few ulp of the weight.
            assert!(
                (e - f64::from(f)).abs() <= 1e-5 * e + 1e-9,
                "item {item}: {e} vs {f}"
            );
        }
    }
}

/// A token is kept exactly when the attention the rows gave it in its window reaches the factor
/// times their uniform shares: tallied here from the softmax over the records each decode row
/// read, tokens within 0.1% of the threshold left out.
#[test]
fn a_token_is_kept_exactly_when_it_drew_the_factor_times_its_uniform_share() {
    const FACTOR: f64 = 2.0;
    let n = 160;
    let t = tokens(n, 21);
    let mut c = cache(Some(FACTOR as f32), RecordOrder::Rows);
    let (kw, qw) = (KV * D, Q * D);
    // A prefill no longer than the window (nothing leaves it), then decode steps.
    let mut tally = vec![vec![[0.0f64; 2]; n]; KV];
    for step in 0..=(n - RECENT) {
        let (from, to) = if step == 0 {
            (0, RECENT)
        } else {
            (RECENT + step - 1, RECENT + step)
        };
        let positions: Vec<u32> = (0..to as u32).collect();
        let mut out = vec![0.0f32; (to - from) * qw];
        c.forward(
            &t.queries[from * qw..to * qw],
            &t.keys[from * kw..to * kw],
            &t.values[from * kw..to * kw],
            &positions,
            SHAPE,
            AttentionKernel::Reference,
            &mut out,
        )
        .unwrap();
        for end in from + 1..=to {
            let i = end - 1;
            for (g, tally) in tally.iter_mut().enumerate() {
                let keys = c.keys(g);
                let window = keys.window_start(end, true);
                let p = group_softmax(keys, &t.queries, (i, g), (end, window));
                for (t, p) in p.iter().enumerate().skip(window.max(SINKS)) {
                    tally[t][0] += p;
                    tally[t][1] += 1.0 / end as f64;
                }
            }
        }
    }
    let mut checked = 0;
    for (g, tally) in tally.iter().enumerate() {
        let left = c.keys(g).recent_start();
        for stream in [c.keys(g), c.values(g)] {
            let kept = stream.heavy_hitters().unwrap().kept();
            for (t, &[received, uniform]) in tally.iter().enumerate().take(left).skip(SINKS) {
                let ratio = received / (FACTOR * uniform);
                if (ratio - 1.0).abs() < 1e-3 {
                    continue;
                }
                assert_eq!(
                    kept.contains(&(t as u32)),
                    ratio > 1.0,
                    "head {g} token {t}: {ratio}"
                );
                checked += 1;
            }
        }
    }
    assert!(checked > 400, "{checked}");
}

/// The same tokens are kept, and the same rows come out, whatever the number of threads.
#[test]
fn decisions_do_not_depend_on_the_thread_count() {
    let t = tokens(220, 3);
    let outs: Vec<(Vec<u32>, Vec<Vec<u32>>)> = [1, 2]
        .iter()
        .map(|&threads| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| {
                let mut c = cache(Some(2.0), RecordOrder::FastScan);
                let rows = run(&mut c, &t, 0, 220, 13);
                let kept = (0..KV)
                    .flat_map(|g| [c.keys(g), c.values(g)])
                    .map(|s| s.heavy_hitters().unwrap().kept().to_vec())
                    .collect();
                (bits(&rows), kept)
            })
        })
        .collect();
    assert_eq!(outs[0], outs[1]);
}

/// A rewind drops the kept tokens from the new length on and the cache goes on from there; a
/// clear forgets them all; the kept copies are counted in the cache's bytes.
#[test]
fn a_rewind_drops_the_kept_tokens_past_it_and_bytes_count_them() {
    let t = tokens(200, 5);
    let mut c = cache_with_rewind(Some(2.0), 64);
    run(&mut c, &t, 0, 200, 11);
    let kept = c.keys(0).heavy_hitters().unwrap().kept().to_vec();
    let cut = 140;
    assert!(kept.iter().any(|&k| k as usize >= cut), "{kept:?}");
    assert!(c.kept_bytes() >= kept.len() * (D + 2));
    let mut rewound = c.clone();
    rewound.truncate(cut).unwrap();
    let after = rewound.keys(0).heavy_hitters().unwrap().kept();
    assert_eq!(
        after,
        &kept[..kept.partition_point(|&k| (k as usize) < cut)]
    );
    run(&mut rewound, &t, cut, 200, 11);
    let mut cleared = c.clone();
    cleared.clear();
    assert!(cleared.keys(0).heavy_hitters().unwrap().kept().is_empty());
    assert_eq!(cleared.kept_bytes(), 0);
    // A cleared cache decides afresh, as a new one does.
    let mut fresh = cache_with_rewind(Some(2.0), 64);
    assert_eq!(
        bits(&run(&mut cleared, &t, 0, 120, 11)),
        bits(&run(&mut fresh, &t, 0, 120, 11))
    );
}

/// Without queries (`append` alone) nothing is counted, so nothing is kept; `attend_in_step`
/// over such a cache is the plain kernel's.
#[test]
fn a_cache_filled_without_attention_keeps_nothing() {
    let t = tokens(100, 2);
    let mut c = cache(Some(2.0), RecordOrder::Rows);
    let kw = KV * D;
    c.append(
        &t.keys[..100 * kw],
        &t.values[..100 * kw],
        &(0..100).collect::<Vec<u32>>(),
    )
    .unwrap();
    c.append(&t.keys[..kw], &t.values[..kw], &[100]).unwrap();
    assert!(c.keys(0).heavy_hitters().unwrap().kept().is_empty());
    let positions = [100u32];
    let mut out = vec![0.0f32; Q * D];
    attend_in_step(
        &c,
        &t.queries[..Q * D],
        &positions,
        SHAPE,
        AttentionKernel::Fused,
        &mut out,
    )
    .unwrap();
}

/// The preset `rec4.25` is its recipe without heavy hitters (`levers/rec4.25-no-hh.toml`) plus
/// heavy hitters at 32× on both streams of its global layers; sliding-window layers, which keep
/// no window, keep none.
#[test]
fn rec4_25_is_its_recipe_plus_heavy_hitters() {
    use tq_cache::allocation::{Allocation, LayerKind, StreamKind};
    let path = format!(
        "{}/presets/levers/rec4.25-no-hh.toml",
        env!("CARGO_MANIFEST_DIR")
    );
    let without_lever = Allocation::load(&path).unwrap();
    let preset = Allocation::preset("rec4.25").unwrap();
    for (layers, layer) in [(30, 7), (30, 12), (18, 5)] {
        for stream in StreamKind::BOTH {
            for kind in [LayerKind::Global, LayerKind::Sliding] {
                let at = |a: &Allocation| {
                    a.resolve_stream_in(layer, kind, layers, 0, D, stream)
                        .unwrap()
                };
                let (mut with, without) = (at(&preset), at(&without_lever));
                let expected = (kind == LayerKind::Global).then_some(32.0);
                assert_eq!(
                    with.heavy_hitters, expected,
                    "{layers} {layer} {stream:?} {kind:?}"
                );
                assert_eq!(without.heavy_hitters, None);
                with.heavy_hitters = None;
                assert_eq!(with, without, "{layers} {layer} {stream:?} {kind:?}");
            }
        }
    }
}
