//! The full-precision window of a step: each query of a batch that was just written reads its
//! own newest `recent_tokens` tokens from full-precision copies, as a decode step at that query
//! does, so a prefill gives every query what decoding token by token gives it, bit for bit,
//! whatever the chunking — and attention over the stored cache (`attend`) keeps the stream-wide
//! recent window.

mod common;

use common::{Tokens, bits, codec, growing};
use tq_cache::attention::{AttentionKernel, AttentionShape, attend, attend_in_step};
use tq_cache::center::CenterPolicy;
use tq_cache::kv_cache::{KvCache, KvLayout, uniform_streams};
use tq_cache::stream::StreamLayout;

const D: usize = 64;
const KV: usize = 2;
const Q: usize = 6;
const SINKS: usize = 4;
const RECENT: usize = 8;

fn layout(max_rewind: usize) -> KvLayout {
    KvLayout {
        max_rewind,
        ..growing(KV, D)
    }
}

/// 4-bit keys (TQ_prod) and 3-bit values (TQ_mse), centered, with sinks and a recent window.
fn cache(recent: usize, max_rewind: usize) -> KvCache {
    cache_with([recent; KV], [recent; KV], max_rewind)
}

/// [`cache`] with a window of its own per KV head in the keys and in the values.
fn cache_with(keys: [usize; KV], values: [usize; KV], max_rewind: usize) -> KvCache {
    let layout = layout(max_rewind);
    let extras = |spec, recent: [usize; KV]| -> Vec<StreamLayout> {
        uniform_streams(&layout, spec)
            .into_iter()
            .zip(recent)
            .map(|(mut s, recent)| {
                s.sink_tokens = SINKS;
                s.recent_tokens = recent;
                s.max_rewind = max_rewind;
                s.center = CenterPolicy::FirstChunk;
                s
            })
            .collect()
    };
    KvCache::new(
        layout,
        &extras(codec(5, D, 4, 3), keys),
        &extras(codec(2, D, 3, 4), values),
    )
    .unwrap()
}

const SHAPE: AttentionShape = AttentionShape {
    q_heads: Q,
    scale: 0.125,
};

fn tokens(n: usize) -> Tokens {
    Tokens::new(n, KV, Q, D, 11)
}

/// Forwards tokens `from..to` in one call; returns the output rows.
fn forward(cache: &mut KvCache, t: &Tokens, from: usize, to: usize) -> Vec<f32> {
    common::forward_in_pieces(cache, t, from, to, to - from, SHAPE)
}

/// Forwards `from..to` in pieces of `piece` tokens.
fn forward_in_pieces(
    cache: &mut KvCache,
    t: &Tokens,
    from: usize,
    to: usize,
    piece: usize,
) -> Vec<f32> {
    common::forward_in_pieces(cache, t, from, to, piece, SHAPE)
}

#[test]
fn a_prefill_gives_every_query_what_decoding_gives_it_bit_for_bit() {
    let t = tokens(300);
    // The first batch (64 tokens) calibrates the means; the rest goes in as one batch, in
    // pieces of 37, and one token at a time.
    let mut one = cache(RECENT, 0);
    forward(&mut one, &t, 0, 64);
    let mut pieces = one.clone();
    let mut decode = one.clone();
    let whole = forward(&mut one, &t, 64, 300);
    assert_eq!(
        bits(&whole),
        bits(&forward_in_pieces(&mut pieces, &t, 64, 300, 37))
    );
    assert_eq!(
        bits(&whole),
        bits(&forward_in_pieces(&mut decode, &t, 64, 300, 1))
    );
}

#[test]
fn the_window_changes_what_a_batch_reads_and_attend_keeps_the_stream_wide_window() {
    let t = tokens(300);
    let mut with = cache(RECENT, 0);
    forward(&mut with, &t, 0, 64);
    let rows = forward(&mut with, &t, 64, 300);
    // The same rows through plain `attend` over the stored cache: only the stream's newest
    // RECENT tokens are full precision, so an early row of the batch reads codes where its
    // step window read copies and differs; the last row reads the same window either way.
    let qw = Q * D;
    let positions: Vec<u32> = (64..300).collect();
    let mut stored = vec![0.0f32; rows.len()];
    attend(
        &with,
        &t.queries[64 * qw..300 * qw],
        &positions,
        SHAPE,
        AttentionKernel::Fused,
        &mut stored,
    )
    .unwrap();
    assert_ne!(bits(&rows[..qw]), bits(&stored[..qw]));
    assert_eq!(
        bits(&rows[rows.len() - qw..]),
        bits(&stored[stored.len() - qw..])
    );
    // `attend_in_step` reproduces the step's rows from the cache alone.
    let mut again = vec![0.0f32; rows.len()];
    attend_in_step(
        &with,
        &t.queries[64 * qw..300 * qw],
        &positions,
        SHAPE,
        AttentionKernel::Fused,
        &mut again,
    )
    .unwrap();
    assert_eq!(bits(&rows), bits(&again));
    // Without a window, both are the same.
    let mut without = cache(0, 0);
    forward(&mut without, &t, 0, 64);
    let rows = forward(&mut without, &t, 64, 300);
    attend(
        &without,
        &t.queries[64 * qw..300 * qw],
        &positions,
        SHAPE,
        AttentionKernel::Fused,
        &mut stored,
    )
    .unwrap();
    assert_eq!(bits(&rows), bits(&stored));
}

#[test]
fn the_fused_kernel_matches_the_reference_on_step_windows() {
    fused_matches_reference(cache(RECENT, 0));
}

/// Windows of their own per stream and KV head (an allocation's per-stream
/// `recent_fp_tokens`): keys of head 0 read 8 copies and of head 1 none, values 3 and 12. Each
/// stream reads its own window: the fused kernel matches the reference (a value read from the
/// keys' window, code for copy, would move a row by ~1e-2), a prefill gives every query what
/// decoding gives it, and a rewind keeps the rows of a straight-line cache.
#[test]
fn streams_with_windows_of_their_own_keep_every_property() {
    let windows = || cache_with([RECENT, 0], [3, 12], 16);
    fused_matches_reference(windows());

    let t = tokens(300);
    let mut one = windows();
    forward(&mut one, &t, 0, 64);
    let (mut decode, mut detour) = (one.clone(), one.clone());
    let whole = forward(&mut one, &t, 64, 300);
    assert_eq!(
        bits(&whole),
        bits(&forward_in_pieces(&mut decode, &t, 64, 300, 1))
    );
    // The windows matter: the same cache with the stream-wide window reads other copies.
    let mut uniform = cache(RECENT, 16);
    forward(&mut uniform, &t, 0, 64);
    assert_ne!(bits(&whole), bits(&forward(&mut uniform, &t, 64, 300)));

    forward(&mut detour, &t, 64, 206);
    detour.truncate(190).unwrap();
    let rows = forward(&mut detour, &t, 190, 200);
    let qw = Q * D;
    assert_eq!(bits(&rows), bits(&whole[(190 - 64) * qw..(200 - 64) * qw]));
}

fn fused_matches_reference(mut c: KvCache) {
    let t = tokens(300);
    forward(&mut c, &t, 0, 64);
    forward(&mut c, &t, 64, 300);
    let qw = Q * D;
    let positions: Vec<u32> = (64..300).collect();
    let queries = &t.queries[64 * qw..300 * qw];
    let mut fused = vec![0.0f32; queries.len()];
    let mut exact = vec![0.0f32; queries.len()];
    attend_in_step(
        &c,
        queries,
        &positions,
        SHAPE,
        AttentionKernel::Fused,
        &mut fused,
    )
    .unwrap();
    attend_in_step(
        &c,
        queries,
        &positions,
        SHAPE,
        AttentionKernel::Reference,
        &mut exact,
    )
    .unwrap();
    let max_v = t.values.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    common::assert_rows_match(&fused, &exact, max_v, D);
}

/// A rewind keeps the copies the next step's first queries need (the ring holds
/// `recent + max_rewind` of them): the rows after a rewind are those of a cache that never held
/// the dropped tokens. (Save and reload between steps: the stateful test's `local-recent`
/// sessions.)
#[test]
fn a_rewind_keeps_the_windows_a_straight_line_cache_gives() {
    let t = tokens(300);
    let mut straight = cache(RECENT, 16);
    forward(&mut straight, &t, 0, 64);
    let expected = forward(&mut straight, &t, 64, 200);
    let mut detour = cache(RECENT, 16);
    forward(&mut detour, &t, 0, 64);
    forward(&mut detour, &t, 64, 206);
    detour.truncate(190).unwrap();
    let rows = forward(&mut detour, &t, 190, 200);
    let qw = Q * D;
    assert_eq!(
        bits(&rows),
        bits(&expected[(190 - 64) * qw..(200 - 64) * qw])
    );
}
