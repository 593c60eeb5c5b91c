//! 8-bit window copies (`recent_dtype = "q8"`): the codec's error bound, and a cache whose
//! window's tokens get their codes only when they leave it — the body holds `len − W` records,
//! the fixed bytes are the 8-bit ring — keeps every property of the f16 window: a prefill gives
//! every query what decoding gives it bit for bit, the fused kernel matches the reference, a
//! rewind gives the rows of a straight-line cache, and the rows read the 8-bit copies (close
//! to the f16 window's rows, far from a cache without a window).

mod common;

use common::{Tokens, bits, codec, forward_in_pieces, growing};
use proptest::prelude::*;
use tq_cache::attention::{AttentionKernel, AttentionShape, attend_in_step};
use tq_cache::center::CenterPolicy;
use tq_cache::codec::{CodecError, CodecScratch, Q8Window};
use tq_cache::kv_cache::{KvCache, KvLayout, uniform_streams};
use tq_cache::{CodecSpec, TokenCodec};

const D: usize = 64;
const KV: usize = 2;
const Q: usize = 6;
const SINKS: usize = 4;
const RECENT: usize = 8;

/// Gaussian vectors with one coordinate in eight scaled by up to 30 (peaky, like RoPE keys).
fn peaky(dim: usize) -> impl Strategy<Value = Vec<f32>> {
    (
        prop::collection::vec(-3.0f32..3.0, dim),
        prop::collection::vec(1.0f32..30.0, dim / 8),
    )
        .prop_map(move |(mut x, scales)| {
            for (i, s) in scales.iter().enumerate() {
                x[8 * i] *= s;
            }
            x
        })
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        rng_seed: prop::test_runner::RngSeed::Fixed(0x51_38),
        ..ProptestConfig::default()
    })]

    /// Deterministic bound, no statistics: every rotated coordinate is within `s/2` of `s·q`
    /// (the clamp adds at most the f16 rounding of `s`, relative 2⁻¹¹, times 127), so the
    /// decoded vector is within `√d·s·(1/2 + 127·2⁻¹¹)` of the input, plus f32 rounding of two
    /// rotations. A codec that drops the rotation's inverse or rounds `q` wrongly misses it by
    /// orders of magnitude.
    #[test]
    fn q8_copies_stay_within_half_a_step(x in peaky(D)) {
        let codec = TokenCodec::new(&CodecSpec::Q8 { dim: D }).unwrap();
        prop_assert_eq!(codec.record_words(), D / 4);
        prop_assert_eq!(codec.scales_per_token(), 1);
        let mut scratch = CodecScratch::new(D);
        let (mut record, mut scales, mut back) = (vec![0u32; D / 4], [half::f16::ZERO], vec![0.0f32; D]);
        codec.encode_into(&x, &mut scratch, &mut record, &mut scales).unwrap();
        codec.decode_into(&record, &scales, &mut scratch, &mut back).unwrap();
        let s = scales[0].to_f32();
        let norm = x.iter().map(|v| v * v).sum::<f32>().sqrt();
        let error = x.iter().zip(&back).map(|(a, b)| (a - b) * (a - b)).sum::<f32>().sqrt();
        let bound = (D as f32).sqrt() * s * (0.5 + 127.0 / 2048.0) + 1e-5 * norm;
        prop_assert!(error <= bound, "error {error} above {bound} (step {s})");
        // The step is the rotated vector's peak over 127: at most ‖x‖/127, at least ‖x‖/(127√d).
        prop_assert!(s <= norm / 127.0 * 1.001 && s >= norm / (127.0 * (D as f32).sqrt()) * 0.999);
    }
}

#[test]
fn q8_zero_and_bad_input() {
    let codec = Q8Window::new(D).unwrap();
    let (mut record, mut rotated, mut back) = (vec![7u32; D / 4], vec![0.0; D], vec![1.0; D]);
    let step = codec
        .encode_into(&vec![0.0; D], &mut rotated, &mut record)
        .unwrap();
    codec.decode_into(&record, step, &mut rotated, &mut back);
    assert!(back.iter().all(|v| *v == 0.0) && record.iter().all(|w| *w == 0));
    let token = TokenCodec::new(&CodecSpec::Q8 { dim: D }).unwrap();
    let mut scratch = CodecScratch::new(D);
    let mut nan = vec![0.5f32; D];
    nan[9] = f32::NAN;
    let mut scales = [half::f16::ZERO];
    assert!(matches!(
        token.encode_into(&nan, &mut scratch, &mut record, &mut scales),
        Err(CodecError::NonFinite { index: 9, .. })
    ));
    let huge = vec![1e30f32; D];
    assert!(matches!(
        token.encode_into(&huge, &mut scratch, &mut record, &mut scales),
        Err(CodecError::NormOutOfRange { .. })
    ));
}

fn layout(max_rewind: usize) -> KvLayout {
    KvLayout {
        max_rewind,
        ..growing(KV, D)
    }
}

/// 4-bit keys (TQ_prod) and 3-bit values (TQ_mse), centered, f16 sinks, and a window whose
/// copies are `window` (`None`: f16, codes written on arrival).
fn cache(recent: usize, max_rewind: usize, window: Option<CodecSpec>) -> KvCache {
    let layout = layout(max_rewind);
    let streams = |spec| -> Vec<_> {
        uniform_streams(&layout, spec)
            .into_iter()
            .map(|mut s| {
                s.sink_tokens = SINKS;
                s.recent_tokens = recent;
                s.max_rewind = max_rewind;
                s.center = CenterPolicy::FirstChunk;
                s.recent = window;
                s
            })
            .collect()
    };
    KvCache::new(
        layout,
        &streams(codec(5, D, 4, 3)),
        &streams(codec(2, D, 3, 4)),
    )
    .unwrap()
}

fn q8(recent: usize, max_rewind: usize) -> KvCache {
    cache(recent, max_rewind, Some(CodecSpec::Q8 { dim: D }))
}

const SHAPE: AttentionShape = AttentionShape {
    q_heads: Q,
    scale: 0.125,
};

fn tokens(n: usize) -> Tokens {
    Tokens::new(n, KV, Q, D, 21)
}

fn forward(cache: &mut KvCache, t: &Tokens, from: usize, to: usize, piece: usize) -> Vec<f32> {
    forward_in_pieces(cache, t, from, to, piece, SHAPE)
}

#[test]
fn the_window_holds_the_only_copy_and_its_bytes_are_the_8_bit_ring() {
    let t = tokens(100);
    let mut c = q8(RECENT, 5);
    forward(&mut c, &t, 0, 100, 100);
    for stream in (0..KV).flat_map(|h| [c.keys(h), c.values(h)]) {
        assert!(stream.defers_codes());
        assert_eq!(stream.body().len(), 100 - RECENT);
        // Sinks in f16 (2 bytes a value), the ring of RECENT + max_rewind copies in 8 bits
        // plus an f16 step, and the mean.
        let ring = (RECENT + 5) * (D + 2);
        assert_eq!(stream.fixed_bytes(), SINKS * 2 * D + ring + 4 * D);
    }
    let f16 = {
        let mut f = cache(RECENT, 5, None);
        forward(&mut f, &t, 0, 100, 100);
        f
    };
    assert!(!f16.keys(0).defers_codes());
    assert_eq!(f16.keys(0).body().len(), 100);
    // Fewer than RECENT tokens: no codes at all yet.
    let mut short = q8(RECENT, 0);
    forward(&mut short, &t, 0, RECENT - 1, RECENT);
    assert_eq!(short.keys(1).body().len(), 0);
}

/// `recent_copies` hands the window to the kernels in runs: every run is what `recent_copy`
/// gives token by token, runs stop at the ring's wrap and at the limit, and they cover the
/// window with no gap, whatever the limit.
#[test]
fn window_runs_are_the_copies_token_by_token() {
    let t = tokens(100);
    let mut c = q8(RECENT, 5);
    forward(&mut c, &t, 0, 100, 100);
    let slots = RECENT + 5;
    for stream in (0..KV).flat_map(|h| [c.keys(h), c.values(h)]) {
        let start = stream.recent_start();
        assert_eq!(start, 100 - RECENT);
        for limit in [1, 2, 3, RECENT, 1000] {
            let mut t = start;
            while t < 100 {
                let (codec, words, scales, n) = stream.recent_copies(t, limit).unwrap();
                assert!(n >= 1 && n <= limit && n <= 100 - t, "{t} {limit} {n}");
                // One store: never across the ring's last slot.
                assert!(t % slots + n <= slots, "{t} {n}");
                let (w, s) = (words.len() / n, scales.len() / n);
                for i in 0..n {
                    let (one_codec, one_words, one_scales) = stream.recent_copy(t + i).unwrap();
                    assert!(std::ptr::eq(codec, one_codec));
                    assert_eq!(&words[i * w..(i + 1) * w], one_words, "{}", t + i);
                    assert_eq!(&scales[i * s..(i + 1) * s], one_scales, "{}", t + i);
                }
                t += n;
            }
        }
        assert!(stream.recent_copies(100, 5).is_none());
    }
}

#[test]
fn a_prefill_gives_every_query_what_decoding_gives_it_bit_for_bit() {
    let t = tokens(300);
    let mut one = q8(RECENT, 0);
    forward(&mut one, &t, 0, 64, 64);
    let (mut pieces, mut decode) = (one.clone(), one.clone());
    let whole = forward(&mut one, &t, 64, 300, 300);
    assert_eq!(bits(&whole), bits(&forward(&mut pieces, &t, 64, 300, 37)));
    assert_eq!(bits(&whole), bits(&forward(&mut decode, &t, 64, 300, 1)));
}

#[test]
fn the_fused_kernel_matches_the_reference_on_8_bit_windows() {
    let t = tokens(300);
    let mut c = q8(RECENT, 0);
    forward(&mut c, &t, 0, 64, 64);
    forward(&mut c, &t, 64, 300, 300);
    let qw = Q * D;
    let positions: Vec<u32> = (64..300).collect();
    let queries = &t.queries[64 * qw..300 * qw];
    let (mut fused, mut exact) = (vec![0.0f32; queries.len()], vec![0.0f32; queries.len()]);
    for (kernel, out) in [
        (AttentionKernel::Fused, &mut fused),
        (AttentionKernel::Reference, &mut exact),
    ] {
        attend_in_step(&c, queries, &positions, SHAPE, kernel, out).unwrap();
    }
    let max_v = t.values.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    common::assert_rows_match(&fused, &exact, max_v, D);
}

/// The window's tokens are read from their 8-bit copies: a stored key of the window comes back
/// within the copies' bound (below 1% of its norm on these vectors), which no 4-bit code meets
/// (the body's tokens, encoded from their copies as they left the window, come back 3–30% off
/// — their own codes, not another token's); the fused kernel reads what the reference kernel
/// reads (above), so both attend to these copies.
#[test]
fn the_window_reads_the_8_bit_copies() {
    let t = tokens(100);
    let mut c = q8(RECENT, 0);
    forward(&mut c, &t, 0, 100, 100);
    let mut scratch = CodecScratch::new(D);
    let mut back = vec![0.0f32; D];
    for h in 0..KV {
        let keys = c.keys(h);
        for tok in [0, 50, 100 - RECENT - 1, 100 - RECENT, 99] {
            keys.reconstruct(tok, &mut scratch, &mut back).unwrap();
            let x = &t.keys[(tok * KV + h) * D..(tok * KV + h + 1) * D];
            let norm = x.iter().map(|v| v * v).sum::<f32>().sqrt();
            let error = x
                .iter()
                .zip(&back)
                .map(|(a, b)| (a - b) * (a - b))
                .sum::<f32>()
                .sqrt();
            let (codec, _, _) = keys.token(tok).unwrap();
            let in_window = tok >= 100 - RECENT;
            assert_eq!(matches!(codec, TokenCodec::Q8(_)), in_window, "token {tok}");
            if in_window {
                assert!(error < 0.01 * norm, "token {tok}: {error} of {norm}");
            } else if tok >= SINKS {
                // Codes of this token (not of another one: that would be ~1.4·‖x‖ off).
                assert!(
                    error > 0.03 * norm && error < 0.3 * norm,
                    "token {tok}: {error} of {norm}"
                );
            }
        }
    }
}

/// A rewind drops the codes of the tokens that become recent again; they are written again,
/// from the same copies, when they leave the window: the rows after it are those of a cache
/// that never held the dropped tokens.
#[test]
fn a_rewind_gives_the_rows_of_a_straight_line_cache() {
    let t = tokens(300);
    let mut straight = q8(RECENT, 16);
    forward(&mut straight, &t, 0, 64, 64);
    let expected = forward(&mut straight, &t, 64, 200, 200);
    let mut detour = q8(RECENT, 16);
    forward(&mut detour, &t, 0, 64, 64);
    forward(&mut detour, &t, 64, 206, 206);
    detour.truncate(190).unwrap();
    assert_eq!(detour.keys(0).body().len(), 190 - RECENT);
    let rows = forward(&mut detour, &t, 190, 200, 3);
    let qw = Q * D;
    assert_eq!(
        bits(&rows),
        bits(&expected[(190 - 64) * qw..(200 - 64) * qw])
    );
    // Past the ring's margin the rewind is refused, as with f16 copies.
    let mut far = q8(RECENT, 2);
    forward(&mut far, &t, 0, 100, 100);
    assert!(far.truncate(90).is_err());
}

/// `recent_dtype` in an allocation file: `q8` resolves to 8-bit window copies in the stream
/// layouts (and writes back out), `f16` or no entry leaves the layouts as they were (saved
/// caches unchanged), and an unknown storage is a typed error naming the field and the value.
#[test]
fn recent_dtype_is_read_written_and_refused_by_name() {
    use tq_cache::allocation::{Allocation, StreamKind};
    let text = |dtype: &str| {
        format!(
            "name = \"w\"\nrecent_fp_tokens = 8\n{dtype}\n\
             key = {{ codec = \"mse\", bits = 4 }}\nvalue = {{ codec = \"mse\", bits = 3 }}\n"
        )
    };
    let q8 = Allocation::from_toml_str(&text("recent_dtype = \"q8\"")).unwrap();
    assert!(q8.window_defers_codes());
    assert_eq!(
        Allocation::from_toml_str(&q8.to_toml_string().unwrap()).unwrap(),
        q8
    );
    let layouts = |a: &Allocation| a.stream_layouts(0, 1, &growing(KV, D), StreamKind::Value);
    assert!(
        layouts(&q8)
            .unwrap()
            .iter()
            .all(|l| l.recent == Some(CodecSpec::Q8 { dim: D }))
    );
    for plain in ["", "recent_dtype = \"f16\""] {
        let a = Allocation::from_toml_str(&text(plain)).unwrap();
        assert!(!a.window_defers_codes());
        assert!(layouts(&a).unwrap().iter().all(|l| l.recent.is_none()));
    }
    let err = Allocation::from_toml_str(&text("recent_dtype = \"q4\""))
        .unwrap_err()
        .to_string();
    assert!(err.contains("q4") && err.contains("recent_dtype"), "{err}");
}

/// A batch that fails part-way (a NaN in one head's keys, after other heads and tokens went in)
/// leaves the cache as it was: the copies the batch overwrote in the ring come back from the
/// step's copies of the window before it, and the codes the rollback dropped are written again
/// from them, so the next steps give the rows of a cache that never saw the batch. With
/// `max_rewind = 0` the ring has no spare slot, so every token of the batch overwrote one.
#[test]
fn a_failed_batch_leaves_the_window_whole() {
    for max_rewind in [0, 3] {
        let t = tokens(120);
        let mut straight = q8(RECENT, max_rewind);
        forward(&mut straight, &t, 0, 64, 64);
        let expected = forward(&mut straight, &t, 64, 120, 1);
        let mut failed = q8(RECENT, max_rewind);
        forward(&mut failed, &t, 0, 64, 64);
        let (kw, qw) = (KV * D, Q * D);
        let mut keys = t.keys[64 * kw..84 * kw].to_vec();
        keys[(15 * KV + 1) * D + 5] = f32::NAN;
        let positions: Vec<u32> = (0..84).collect();
        let mut rows = vec![0.0f32; 20 * qw];
        let result = failed.forward(
            &t.queries[64 * qw..84 * qw],
            &keys,
            &t.values[64 * kw..84 * kw],
            &positions,
            SHAPE,
            AttentionKernel::Fused,
            &mut rows,
        );
        assert!(result.is_err());
        assert_eq!(failed.len(), 64);
        assert_eq!(failed.keys(1).body().len(), 64 - RECENT);
        let rows = forward(&mut failed, &t, 64, 120, 1);
        assert!(
            bits(&rows) == bits(&expected),
            "max_rewind {max_rewind}: the rows differ from a cache that never saw the batch"
        );
    }
}

/// A copy is the only one of its token, so a vector the body codec would refuse when the token
/// leaves the window (a norm past the f16 range, with the copy's error margin) is refused on
/// arrival, not W tokens later; and q8 is not a body codec.
#[test]
fn what_the_body_would_refuse_is_refused_on_arrival() {
    let mut c = q8(RECENT, 0);
    let t = tokens(20);
    forward(&mut c, &t, 0, 10, 10);
    let mut keys = t.keys[10 * KV * D..11 * KV * D].to_vec();
    keys[..D].fill(8000.0); // norm 64000 (< 65504), decoded up to 3.6% more
    let positions = [10u32];
    let err = c
        .append(&keys, &t.values[10 * KV * D..11 * KV * D], &positions)
        .unwrap_err();
    assert!(err.to_string().contains("65504"), "{err}");
    assert_eq!(c.len(), 10);
    let mut ok = keys.clone();
    ok[..D].fill(7000.0); // norm 56000: stored
    c.append(&ok, &t.values[10 * KV * D..11 * KV * D], &positions)
        .unwrap();
    let body = uniform_streams(&layout(0), CodecSpec::Q8 { dim: D });
    assert!(KvCache::new(layout(0), &body, &body).is_err());
}
