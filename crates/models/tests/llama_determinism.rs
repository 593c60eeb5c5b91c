//! The forward pass gives the same logits, bit for bit, whatever the number of threads: the
//! same prefill (uneven chunks, logits of every token) and greedy decode steps run on a
//! one-thread and a two-thread rayon pool, with an f16 and a TurboQuant cache, and every logit
//! is compared by its bits.
//!
//! Catches any reduction whose order follows the work split (a parallel sum, a block
//! combine in completion order, a per-thread partial): on two threads such a sum rounds
//! differently from one thread on at least some of the ~10⁶ logits compared.
//!
//! Needs the reference model (skipped with a message when absent, failing instead when
//! `TQ_REQUIRE_MODEL=1`).

mod gguf_common;

use gguf_common::reference_model_or_skip;
use tq_cache::allocation::Allocation;
use tq_cache::attention::AttentionKernel;
use tq_models::llama::ops::argmax;
use tq_models::llama::{ForwardScratch, Llama, Logits};

/// Prompt tokens, prefilled in chunks of [`CHUNK`] (the last one shorter).
const PROMPT: usize = 96;
const CHUNK: usize = 40;
/// Greedy decode steps after the prompt.
const DECODE: usize = 4;

/// Every logit of the prefill chunks and the decode steps, as bits.
fn run(model: &Llama, allocation: &Allocation) -> Vec<u32> {
    let vocab = model.config.vocab as u32;
    // Spread over the vocabulary without a generator: any fixed ids will do.
    let prompt: Vec<u32> = (0..PROMPT as u32)
        .map(|i| (i * 7919 + 13) % vocab)
        .collect();
    let positions: Vec<u32> = (0..(PROMPT + DECODE) as u32).collect();
    let mut cache = model.new_cache(allocation, PROMPT + DECODE).unwrap();
    let mut scratch = ForwardScratch::default();
    let mut bits = Vec::new();
    let mut done = 0;
    let mut next = 0;
    for chunk in prompt.chunks(CHUNK) {
        done += chunk.len();
        let logits = model
            .forward(
                chunk,
                &positions[..done],
                &mut cache,
                AttentionKernel::Fused,
                Logits::All,
                &mut scratch,
            )
            .unwrap();
        bits.extend(logits.iter().map(|v| v.to_bits()));
        next = argmax(&logits[logits.len() - model.config.vocab..]).unwrap() as u32;
    }
    for _ in 0..DECODE {
        done += 1;
        let logits = model
            .forward(
                &[next],
                &positions[..done],
                &mut cache,
                AttentionKernel::Fused,
                Logits::Last,
                &mut scratch,
            )
            .unwrap();
        bits.extend(logits.iter().map(|v| v.to_bits()));
        next = argmax(logits).unwrap() as u32;
    }
    bits
}

#[test]
fn logits_do_not_depend_on_the_thread_count() {
    let Some(path) = reference_model_or_skip() else {
        return;
    };
    let model = Llama::load(&path).expect("the reference model loads");
    let pools: Vec<rayon::ThreadPool> = [1, 2]
        .iter()
        .map(|&threads| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap()
        })
        .collect();
    for name in ["f16", "tq3.5"] {
        let allocation = Allocation::preset(name).unwrap();
        let one = pools[0].install(|| run(&model, &allocation));
        let two = pools[1].install(|| run(&model, &allocation));
        assert_eq!(
            one.len(),
            (PROMPT + DECODE) * model.config.vocab,
            "{name}: every logit collected"
        );
        let differing = one.iter().zip(&two).filter(|(a, b)| a != b).count();
        assert_eq!(
            differing,
            0,
            "{name}: {differing} of {} logits differ between 1 and 2 threads",
            one.len()
        );
    }
}
