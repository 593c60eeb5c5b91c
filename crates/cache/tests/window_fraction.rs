//! `recent_fraction`: a recent window that grows with the context, `max(recent_fp_tokens,
//! round(fraction · n))` tokens with `n` held. Its start never moves back; a cache of fixed
//! capacity and one that grows in pages keep the same windows and give the same rows bit for
//! bit (the second grows its ring of copies); a prefill gives every query what decoding gives
//! it; an 8-bit window writes codes exactly as tokens leave it; a rewind gives the rows of a
//! straight-line cache; which table's window wins; and the typed errors for bad fractions.

mod common;

use common::{Tokens, bits, codec, forward_in_pieces};
use proptest::prelude::*;
use tq_cache::allocation::{Allocation, AllocationError, FieldProblem, RecentWindow, StreamKind};
use tq_cache::attention::{AttentionKernel, AttentionShape, attend_in_step};
use tq_cache::center::CenterPolicy;
use tq_cache::kv_cache::{KvCache, KvKind, KvLayout, uniform_streams};
use tq_cache::stream::window_tokens;
use tq_cache::token_store::Growth;
use tq_cache::{CodecSpec, TokenCodec};

const LAYERS: usize = 30;
const DIM: usize = 64;
const KV: usize = 2;
const Q: usize = 6;
const SINKS: usize = 2;
/// The window: at least 8 tokens, an eighth of the tokens held beyond 64.
const FLOOR: usize = 8;
const FRACTION: f64 = 0.125;

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 512,
        rng_seed: prop::test_runner::RngSeed::Fixed(0x71_4e),
        ..ProptestConfig::default()
    })]

    /// Deterministic, no statistics: for any floor and fraction in `[0, 1)` the window grows by
    /// at most one token a token (so its start `n − W(n)` never moves back and a token that
    /// left it never returns), is never below the floor, and is the fraction's share up to
    /// half a token once above it.
    #[test]
    fn the_window_start_never_moves_back(
        count in 0usize..300,
        fraction in 0.0f64..1.0,
        n in 0usize..100_000,
    ) {
        let (w, next) = (
            window_tokens(count, Some(fraction), n),
            window_tokens(count, Some(fraction), n + 1),
        );
        prop_assert!(next == w || next == w + 1, "{w} → {next}");
        prop_assert!((n + 1).saturating_sub(next) >= n.saturating_sub(w));
        prop_assert!(w >= count);
        if w > count {
            prop_assert!((w as f64 - fraction * n as f64).abs() <= 0.5);
        }
        prop_assert_eq!(window_tokens(count, None, n), count);
    }
}

fn layout(growth: Growth, max_rewind: usize) -> KvLayout {
    KvLayout {
        kind: KvKind::Growing { growth },
        max_rewind,
        ..common::growing(KV, DIM)
    }
}

/// 4-bit keys (TQ_prod) and 3-bit values (TQ_mse), centered, f16 sinks, a growing window whose
/// copies are `window` (`None`: f16).
fn cache(growth: Growth, max_rewind: usize, window: Option<CodecSpec>) -> KvCache {
    cache_with(
        growth,
        max_rewind,
        window,
        (FLOOR, Some(FRACTION)),
        CenterPolicy::FirstChunk,
    )
}

/// [`cache`] with another window (`(floor, fraction)`), centered or not.
fn cache_with(
    growth: Growth,
    max_rewind: usize,
    window: Option<CodecSpec>,
    (floor, fraction): (usize, Option<f64>),
    center: CenterPolicy,
) -> KvCache {
    let layout = layout(growth, max_rewind);
    let streams = |spec| -> Vec<_> {
        uniform_streams(&layout, spec)
            .into_iter()
            .map(|mut s| {
                s.sink_tokens = SINKS;
                s.recent_tokens = floor;
                s.recent_fraction = fraction;
                s.center = center;
                s.recent = window;
                s
            })
            .collect()
    };
    KvCache::new(
        layout,
        &streams(codec(5, DIM, 4, 3)),
        &streams(codec(2, DIM, 3, 4)),
    )
    .unwrap()
}

const GROWING: Growth = Growth::Doubling { initial: 7 };
const STATIC: Growth = Growth::Static { capacity: 400 };
const Q8: Option<CodecSpec> = Some(CodecSpec::Q8 { dim: DIM });

const SHAPE: AttentionShape = AttentionShape {
    q_heads: Q,
    scale: 0.125,
};

fn tokens(n: usize) -> Tokens {
    Tokens::new(n, KV, Q, DIM, 31)
}

/// Runs tokens `from..to` through `cache.forward` in pieces of `piece`; the rows.
fn forward(cache: &mut KvCache, t: &Tokens, from: usize, to: usize, piece: usize) -> Vec<f32> {
    forward_in_pieces(cache, t, from, to, piece, SHAPE)
}

/// The window the streams hold follows the tokens held (the floor to 64 tokens, then an
/// eighth), in a cache of fixed capacity and in one that grows in pages alike, and the two
/// give the same rows bit for bit, f16 or 8-bit copies. The fixed cache's ring is allocated
/// for its capacity once; the growing cache's ring grows with its window.
#[test]
fn fixed_and_growing_caches_keep_the_same_window_and_rows() {
    let t = tokens(300);
    for window in [None, Q8] {
        let (mut fixed, mut growing) = (cache(STATIC, 3, window), cache(GROWING, 3, window));
        let built = growing.keys(0).recent_slots();
        assert_eq!(built, FLOOR + 3);
        assert_eq!(
            fixed.keys(0).recent_slots(),
            50 + 3,
            "an eighth of 400, and the margin"
        );
        let mut n = 0;
        for piece in [40, 1, 23, 64, 1, 1, 100, 70] {
            let a = forward(&mut fixed, &t, n, n + piece, piece);
            let b = forward(&mut growing, &t, n, n + piece, piece);
            assert_eq!(bits(&a), bits(&b), "{window:?} to {}", n + piece);
            n += piece;
            let w = FLOOR.max((FRACTION * n as f64).round() as usize);
            for stream in (0..KV).flat_map(|h| [fixed.keys(h), growing.values(h)]) {
                assert_eq!(stream.window(n), w);
                assert_eq!(stream.recent_start(), n - w, "{n}");
                let body = if window.is_some() { n - w } else { n };
                assert_eq!(stream.body().len(), body, "{window:?} {n}");
            }
            // The tokens just before the window are read from their codes, the window's from
            // their copies.
            let keys = growing.keys(1);
            let (inside, _, _) = keys.token(n - w).unwrap();
            let (before, _, _) = keys.token(n - w - 1).unwrap();
            assert!(!matches!(inside, TokenCodec::Prod(_)), "{n}");
            assert!(matches!(before, TokenCodec::Prod(_)), "{n}");
        }
        assert_eq!(n, 300);
        assert_eq!(
            fixed.keys(0).recent_slots(),
            53,
            "a fixed capacity never grows"
        );
        assert!(growing.keys(0).recent_slots() >= 38 + 3);
        assert!(growing.keys(0).recent_slots() > built);
    }
}

/// Every query of a prefill reads its own window at its own length — what a decode step at it
/// reads — so a prefill in one batch, in pieces or token by token gives the same rows bit for
/// bit, and the fused kernel reads what the reference kernel reads.
#[test]
fn a_prefill_gives_every_query_what_decoding_gives_it_bit_for_bit() {
    let t = tokens(300);
    for window in [None, Q8] {
        let mut one = cache(GROWING, 0, window);
        forward(&mut one, &t, 0, 64, 64);
        let (mut pieces, mut decode) = (one.clone(), one.clone());
        let whole = forward(&mut one, &t, 64, 300, 300);
        assert_eq!(bits(&whole), bits(&forward(&mut pieces, &t, 64, 300, 37)));
        assert_eq!(bits(&whole), bits(&forward(&mut decode, &t, 64, 300, 1)));

        let qw = Q * DIM;
        let positions: Vec<u32> = (64..300).collect();
        let queries = &t.queries[64 * qw..300 * qw];
        let mut c = cache(GROWING, 0, window);
        forward(&mut c, &t, 0, 64, 64);
        forward(&mut c, &t, 64, 300, 300);
        let (mut fused, mut exact) = (vec![0.0f32; queries.len()], vec![0.0f32; queries.len()]);
        for (kernel, out) in [
            (AttentionKernel::Fused, &mut fused),
            (AttentionKernel::Reference, &mut exact),
        ] {
            attend_in_step(&c, queries, &positions, SHAPE, kernel, out).unwrap();
        }
        let max_v = t.values.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        common::assert_rows_match(&fused, &exact, max_v, DIM);
    }
}

/// A fraction with no floor keeps no window while it rounds to zero (the first 4 tokens at an
/// eighth): an 8-bit window's tokens then leave it as they arrive, their codes written from
/// the copy just made — in one batch, in pieces or token by token alike, in a fixed or a
/// growing cache — and the body holds `n − W(n)` records all along. (Not centered: a centered
/// stream's mean comes from its first batch, which differs between these runs.)
#[test]
fn a_window_of_no_tokens_yet_writes_codes_as_tokens_arrive() {
    let t = tokens(120);
    let mut rows = Vec::new();
    for (growth, piece) in [(GROWING, 120), (GROWING, 1), (STATIC, 7)] {
        let mut c = cache_with(growth, 0, Q8, (0, Some(FRACTION)), CenterPolicy::None);
        let mut out = Vec::new();
        let mut n = 0;
        while n < 120 {
            let end = (n + piece).min(120);
            out.extend(forward(&mut c, &t, n, end, piece));
            n = end;
            let w = (FRACTION * n as f64).round() as usize;
            assert_eq!(c.keys(0).window(n), w);
            assert_eq!(c.values(1).body().len(), n - w, "{growth:?} {n}");
        }
        rows.push(bits(&out));
    }
    assert_eq!(rows[0], rows[1]);
    assert_eq!(rows[0], rows[2]);
}

/// A cache of fixed capacity refuses the token past it with `ContextOverflow` and stays as it
/// was, though its 8-bit window grows on that token (so its body, holding `n − W(n)` records,
/// would still have room).
#[test]
fn a_full_cache_refuses_the_next_token_though_its_window_grows() {
    let t = tokens(120);
    // A capacity where the next token grows the window.
    let w = |n| window_tokens(FLOOR, Some(FRACTION), n);
    let capacity = (64..119).find(|&n| w(n + 1) > w(n)).unwrap();
    let mut c = cache(Growth::Static { capacity }, 0, Q8);
    forward(&mut c, &t, 0, capacity, 64);
    let (kw, qw) = (KV * DIM, Q * DIM);
    let positions: Vec<u32> = (0..=capacity as u32).collect();
    let mut rows = vec![0.0f32; qw];
    let result = c.forward(
        &t.queries[capacity * qw..(capacity + 1) * qw],
        &t.keys[capacity * kw..(capacity + 1) * kw],
        &t.values[capacity * kw..(capacity + 1) * kw],
        &positions,
        SHAPE,
        AttentionKernel::Fused,
        &mut rows,
    );
    assert!(
        matches!(result, Err(tq_cache::CacheError::ContextOverflow { capacity: c }) if c == capacity),
        "{result:?}"
    );
    assert_eq!(c.len(), capacity);
    for stream in (0..KV).flat_map(|h| [c.keys(h), c.values(h)]) {
        assert_eq!(stream.len(), capacity);
        assert_eq!(stream.body().len(), capacity - stream.window(capacity));
    }
}

/// The window is the fraction of the tokens held, not a fixed count: the rows differ from a
/// cache keeping the floor alone once the window outgrows it, and a second run of the same
/// cache gives them again bit for bit.
#[test]
fn the_fraction_changes_what_attention_reads() {
    let t = tokens(300);
    let mut grows = cache(GROWING, 0, None);
    let mut again = grows.clone();
    let mut counted = cache_with(GROWING, 0, None, (FLOOR, None), CenterPolicy::FirstChunk);
    let short = forward(&mut grows, &t, 0, 64, 64);
    assert_eq!(bits(&short), bits(&forward(&mut counted, &t, 0, 64, 64)));
    let long = forward(&mut grows, &t, 64, 300, 300);
    assert_ne!(bits(&long), bits(&forward(&mut counted, &t, 64, 300, 300)));
    forward(&mut again, &t, 0, 64, 64);
    assert_eq!(bits(&long), bits(&forward(&mut again, &t, 64, 300, 300)));
}

/// A rewind within the margin gives the rows of a cache that never held the dropped tokens,
/// with a ring that grew in between (growing cache) and with 8-bit copies whose codes are
/// dropped and written again; past what the ring holds it is refused.
#[test]
fn a_rewind_gives_the_rows_of_a_straight_line_cache() {
    let t = tokens(300);
    for (growth, window) in [(GROWING, None), (GROWING, Q8), (STATIC, Q8)] {
        let mut straight = cache(growth, 16, window);
        forward(&mut straight, &t, 0, 64, 64);
        let expected = forward(&mut straight, &t, 64, 200, 200);
        let mut detour = cache(growth, 16, window);
        forward(&mut detour, &t, 0, 64, 64);
        forward(&mut detour, &t, 64, 206, 206);
        detour.truncate(190).unwrap();
        let w = window_tokens(FLOOR, Some(FRACTION), 190);
        if window.is_some() {
            assert_eq!(detour.keys(0).body().len(), 190 - w);
        }
        let rows = forward(&mut detour, &t, 190, 200, 3);
        let qw = Q * DIM;
        assert_eq!(
            bits(&rows),
            bits(&expected[(190 - 64) * qw..(200 - 64) * qw]),
            "{growth:?} {window:?}"
        );
        let mut far = cache(growth, 2, window);
        forward(&mut far, &t, 0, 100, 100);
        assert!(far.truncate(40).is_err(), "{growth:?} {window:?}");
    }
}

fn static_layout(capacity: usize) -> KvLayout {
    layout(Growth::Static { capacity }, 0)
}

fn field_error(result: Result<impl std::fmt::Debug, AllocationError>) -> (String, FieldProblem) {
    match result {
        Err(AllocationError::Field { path, problem }) => (path, problem),
        other => panic!("expected a field error, got {other:?}"),
    }
}

const FRACTIONS: &str = r#"
name = "fractions"
sink_tokens = 2
recent_fp_tokens = 40
recent_fraction = 0.25
key = { codec = "mse", bits = 4, recent_fraction = 0.125, recent_fp_tokens = 24 }
value = { codec = "mse", bits = 3 }

[[override]]
layers = [10]
key = { recent_fp_tokens = 7 }
"#;

/// An allocation's window reaches the built streams whole (floor and fraction), whatever the
/// cache's capacity or growth; a stream table's window replaces the top-level one whole
/// (layer 10's keys: a count only, so no fraction); `longest_recent_window` is the longest
/// window at a length.
#[test]
fn allocation_windows_reach_every_cache() {
    let a = Allocation::from_toml_str(FRACTIONS).unwrap();
    let layouts = [static_layout(100), static_layout(4096), layout(GROWING, 0)];
    for layout in layouts {
        let cache = KvCache::with_allocation(layout, &a, 3, LAYERS).unwrap();
        let fixed = KvCache::with_allocation(layout, &a, 10, LAYERS).unwrap();
        for (held, key, value) in [(100, 24, 40), (1000, 125, 250), (4096, 512, 1024)] {
            for head in 0..KV {
                assert_eq!(cache.keys(head).window(held), key, "{held}");
                assert_eq!(cache.values(head).window(held), value, "{held}");
            }
            assert_eq!(fixed.keys(0).window(held), 7, "{held}");
            assert_eq!(fixed.values(0).window(held), value, "{held}");
            assert_eq!(a.longest_recent_window(held), value);
        }
    }
    let resolved = a
        .resolve_stream(3, LAYERS, 0, DIM, StreamKind::Key)
        .unwrap();
    assert_eq!(
        resolved.recent,
        RecentWindow {
            tokens: Some(24),
            fraction: Some(0.125)
        }
    );
    // A fraction alone (no floor), top level: 0.1 · 300 = 30, 0.1 · 4 rounds to 0.
    let top = "name = \"t\"\nrecent_fraction = 0.1\nkey = { codec = \"mse\", bits = 4 }\n\
               value = { codec = \"mse\", bits = 3 }";
    let t = Allocation::from_toml_str(top).unwrap();
    let cache = KvCache::with_allocation(layout(GROWING, 0), &t, 0, LAYERS).unwrap();
    assert_eq!(cache.keys(0).window(300), 30);
    assert_eq!(cache.keys(0).window(4), 0);
}

/// Fractions outside `[0, 1)`, or not numbers, are refused at load time with the field's path;
/// a window in `[outliers]` is refused as for `recent_fp_tokens`; a stream layout carrying a
/// bad fraction (a damaged saved cache) is refused when the stream is built.
#[test]
fn bad_fractions_are_refused_with_the_field() {
    let base = "name = \"b\"\nkey = { codec = \"mse\", bits = 4 }\nvalue = { codec = \"mse\", bits = 3 }\n";
    for bad in ["1.0", "-0.1", "1.5", "nan", "inf"] {
        let top = format!("recent_fraction = {bad}\n{base}");
        let (path, problem) = field_error(Allocation::from_toml_str(&top));
        assert_eq!(path, "recent_fraction", "{bad}");
        assert!(
            matches!(problem, FieldProblem::BadWindowFraction { .. }),
            "{bad}"
        );
        let rule =
            format!("{base}[[override]]\nlayers = [1]\nvalue = {{ recent_fraction = {bad} }}");
        let (path, _) = field_error(Allocation::from_toml_str(&rule));
        assert_eq!(path, "override[0].value.recent_fraction", "{bad}");
    }
    assert!(Allocation::from_toml_str(&format!("recent_fraction = 0.0\n{base}")).is_ok());
    let outliers = format!("{base}[outliers]\nchannels = 8\nkey = {{ recent_fraction = 0.1 }}");
    let (path, problem) = field_error(Allocation::from_toml_str(&outliers));
    assert_eq!(path, "outliers.key.recent_fraction");
    assert_eq!(problem, FieldProblem::WholeStreamOnly);

    let layout = layout(GROWING, 0);
    for bad in [1.0, -0.5, f64::NAN] {
        let mut streams = uniform_streams(&layout, codec(2, DIM, 3, 4));
        streams[0].recent_fraction = Some(bad);
        let good = uniform_streams(&layout, codec(2, DIM, 3, 4));
        let built = KvCache::new(layout, &streams, &good);
        assert!(
            matches!(&built, Err(e) if e.to_string().contains("fraction")),
            "{bad}"
        );
    }
}

/// A fraction survives the round trip through TOML (a saved allocation reloads equal), the
/// recommended presets' windows among them.
#[test]
fn fractions_round_trip_through_toml() {
    let a = Allocation::from_toml_str(FRACTIONS).unwrap();
    let back = Allocation::from_toml_str(&a.to_toml_string().unwrap()).unwrap();
    assert_eq!(a, back);
    for name in ["rec4.25", "rec3.25", "rec2.5"] {
        let p = Allocation::preset(name).unwrap();
        assert!(p.key.recent_fraction.is_some(), "{name}");
        let back = Allocation::from_toml_str(&p.to_toml_string().unwrap()).unwrap();
        assert_eq!(back, p);
    }
}
