//! Prefill in any chunking equals one pass and token-by-token decode, for the Gemma-like
//! (sliding + full + shared KV) and Qwen-like (DeltaNet + full attention) models, and the ring
//! caveat of the stateful-decode design, shown at the model level.
//!
//! Why the match is exact, not merely close, and for which caches:
//! - every projection is a per-token dot product summed in index order, RMSNorm is per token,
//!   and the DeltaNet conv and recurrence advance token by token in sequence order — so a
//!   token's activations do not depend on the chunk it came in, as long as its inputs do not;
//! - the cache stores each key and value as a function of that vector alone for the f32, f16,
//!   TQ_mse and TQ_prod codecs (their rotations and sketches are fixed by the allocation's
//!   seeds), and a query's attention depends only on the tokens its position sees (the fused
//!   kernel splits work into fixed token blocks);
//! - a ring of `window + prefill_chunk − 1` slots still holds every key a chunk of at most
//!   `prefill_chunk` tokens needs.
//!
//! So the codec error is the same in every chunking and the derived bound on the difference is
//! zero: the quantized allocations (`k5v4`) are tested for equality like the f32 one. The
//! exception is a two-tier allocation (`tq3.5`): it chooses its outlier channels from the first
//! batch a stream sees, so it is chunking-invariant exactly when the first chunk is the same;
//! tested as such, and the dependence on the first chunk is shown.

use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};
use tq_cache::allocation::Allocation;
use tq_cache::attention::AttentionKernel;
use tq_models::hybrid::{
    AttentionSpan, GemmaLayer, GemmaLike, GemmaLikeConfig, QwenLike, QwenLikeConfig, StatefulModel,
    feed_in_chunks,
};

fn config(cases: u32) -> Config {
    Config {
        cases,
        rng_seed: RngSeed::Fixed(0x4879_6272),
        failure_persistence: None,
        ..Config::default()
    }
}

const F32: &str = "name = \"f32\"\nkey = { codec = \"f32\" }\nvalue = { codec = \"f32\" }\n";

/// f32, f16 and k5v4: the allocations whose stored code is a function of the vector alone.
fn per_vector_allocation(index: usize) -> Allocation {
    match index % 3 {
        0 => Allocation::from_toml_str(F32).unwrap(),
        1 => Allocation::preset("f16").unwrap(),
        _ => Allocation::preset("k5v4").unwrap(),
    }
}

fn run<M: StatefulModel>(
    model: &M,
    allocation: &Allocation,
    tokens: &[u32],
    chunks: &[usize],
) -> Vec<f32> {
    let mut cache = model.new_cache(allocation, 64).unwrap();
    let mut scratch = M::Scratch::default();
    feed_in_chunks(
        model,
        &mut cache,
        tokens,
        chunks,
        AttentionKernel::Fused,
        &mut scratch,
    )
    .unwrap()
}

fn gemma() -> GemmaLike {
    GemmaLike::new(GemmaLikeConfig::tiny(11)).unwrap()
}

fn qwen() -> QwenLike {
    QwenLike::new(QwenLikeConfig::tiny(12)).unwrap()
}

proptest! {
    #![proptest_config(config(48))]

    /// Gemma-like: chunks ≤ W (= prefill_chunk) reproduce decode bit for bit over sequences
    /// that wrap the rings several times, and one pass when the prompt fits in one chunk.
    #[test]
    fn gemma_chunks_up_to_w_equal_decode_and_one_pass(
        tokens in prop::collection::vec(0u32..48, 1..48),
        chunks in prop::collection::vec(1usize..=8, 1..6),
        allocation in 0usize..3,
    ) {
        let model = gemma();
        let allocation = per_vector_allocation(allocation);
        let decode = run(&model, &allocation, &tokens, &[1]);
        prop_assert!(decode.iter().all(|v| v.is_finite()));
        prop_assert_eq!(&run(&model, &allocation, &tokens, &chunks), &decode);
        if tokens.len() <= model.config.prefill_chunk {
            prop_assert_eq!(&run(&model, &allocation, &tokens, &[tokens.len()]), &decode);
        }
    }

    /// Qwen-like: the recurrent states and the growing caches make any chunking, one pass
    /// included, equal decode bit for bit.
    #[test]
    fn qwen_any_chunking_equals_decode_and_one_pass(
        tokens in prop::collection::vec(0u32..48, 1..48),
        chunks in prop::collection::vec(1usize..48, 1..6),
        allocation in 0usize..3,
    ) {
        let model = qwen();
        let allocation = per_vector_allocation(allocation);
        let decode = run(&model, &allocation, &tokens, &[1]);
        prop_assert!(decode.iter().all(|v| v.is_finite()));
        prop_assert_eq!(&run(&model, &allocation, &tokens, &chunks), &decode);
        prop_assert_eq!(&run(&model, &allocation, &tokens, &[tokens.len()]), &decode);
    }

    /// tq3.5 (two tiers, outlier channels chosen from a stream's first batch): chunkings that
    /// share their first chunk agree bit for bit, on both models.
    #[test]
    fn two_tier_chunkings_with_the_same_first_chunk_agree(
        tokens in prop::collection::vec(0u32..48, 2..30),
        first in 1usize..=8,
        rest_a in prop::collection::vec(1usize..=8, 1..4),
        rest_b in prop::collection::vec(1usize..=8, 1..4),
    ) {
        let allocation = Allocation::preset("tq3.5").unwrap();
        let plan = |rest: &[usize]| [&[first][..], rest].concat();
        let g = gemma();
        prop_assert_eq!(
            run(&g, &allocation, &tokens, &plan(&rest_a)),
            run(&g, &allocation, &tokens, &plan(&rest_b))
        );
        let q = qwen();
        prop_assert_eq!(
            run(&q, &allocation, &tokens, &plan(&rest_a)),
            run(&q, &allocation, &tokens, &plan(&rest_b))
        );
    }
}

/// The two-tier exception made visible: a different first chunk calibrates different outlier
/// channels, so one pass and decode differ under tq3.5 (while they agree under k5v4).
#[test]
fn two_tier_calibration_depends_on_the_first_chunk() {
    let tokens: Vec<u32> = (0..16).map(|i| (i * 7 + 3) % 48).collect();
    let model = qwen();
    let tq35 = Allocation::preset("tq3.5").unwrap();
    assert_ne!(
        run(&model, &tq35, &tokens, &[16]),
        run(&model, &tq35, &tokens, &[1])
    );
    let k5v4 = Allocation::preset("k5v4").unwrap();
    assert_eq!(
        run(&model, &k5v4, &tokens, &[16]),
        run(&model, &k5v4, &tokens, &[1])
    );
}

fn row(logits: &[f32], vocab: usize, t: usize) -> &[f32] {
    &logits[t * vocab..(t + 1) * vocab]
}

/// The seed's caveat with the seed's layout (a ring of exactly W slots, `prefill_chunk = 1`):
/// a chunk that wraps the ring writes its keys before attending and overwrites the oldest
/// in-window keys of its own non-final tokens.
///
/// In a one-layer model only those tokens are wrong and the chunk's final token is exact. In
/// a deep model the damage spreads: the non-final tokens' wrong outputs become the next
/// layer's keys and values, so the final token is wrong too, and the wrong keys stay in the
/// deeper caches — decoding after the chunk stays wrong until they leave the window.
#[test]
fn a_chunk_that_wraps_the_ring_loses_keys_for_non_final_tokens() {
    let window = 8;
    let (f32_alloc, vocab) = (Allocation::from_toml_str(F32).unwrap(), 48);
    // Tokens 0..8 fill the ring; the chunk 8..14 overwrites the slots of positions 0..5, which
    // tokens 8..12 still need.
    let tokens: Vec<u32> = (0..15).map(|i| (i * 5 + 1) % 48).collect();
    let chunks = [window, 6, 1];

    let one_layer = GemmaLike::new(GemmaLikeConfig {
        prefill_chunk: 1,
        layers: vec![GemmaLayer {
            span: AttentionSpan::Sliding,
            shares: None,
            rope: None,
        }],
        ..GemmaLikeConfig::tiny(5)
    })
    .unwrap();
    let exact = run(&one_layer, &f32_alloc, &tokens, &[1]);
    let chunked = run(&one_layer, &f32_alloc, &tokens, &chunks);
    for t in 0..window {
        assert_eq!(row(&chunked, vocab, t), row(&exact, vocab, t), "token {t}");
    }
    for t in window..13 {
        assert_ne!(
            row(&chunked, vocab, t),
            row(&exact, vocab, t),
            "token {t} should have lost keys"
        );
    }
    assert_eq!(
        row(&chunked, vocab, 13),
        row(&exact, vocab, 13),
        "the chunk's final token is exact"
    );
    assert_eq!(
        row(&chunked, vocab, 14),
        row(&exact, vocab, 14),
        "one layer: the next decode step is exact again"
    );

    let deep = GemmaLike::new(GemmaLikeConfig {
        prefill_chunk: 1,
        ..GemmaLikeConfig::tiny(5)
    })
    .unwrap();
    let exact = run(&deep, &f32_alloc, &tokens, &[1]);
    let chunked = run(&deep, &f32_alloc, &tokens, &chunks);
    assert_eq!(
        &chunked[..window * vocab],
        &exact[..window * vocab],
        "a first chunk of W tokens is exact"
    );
    for t in window..15 {
        assert_ne!(
            row(&chunked, vocab, t),
            row(&exact, vocab, t),
            "deep model: token {t} inherits the lost keys"
        );
    }

    // The same chunking with rings of W + 6 − 1 slots is exact throughout.
    let roomy = GemmaLike::new(GemmaLikeConfig {
        prefill_chunk: 6,
        ..GemmaLikeConfig::tiny(5)
    })
    .unwrap();
    let with_room = [window.min(6), 6, 6, 1];
    assert_eq!(
        run(&roomy, &f32_alloc, &tokens, &with_room),
        run(&roomy, &f32_alloc, &tokens, &[1])
    );
}
