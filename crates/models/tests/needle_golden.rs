//! Golden snapshot of pass-key retrieval on the reference model: the built-in spec (a 5-digit
//! key in "the grass is green" filler) at 1K and 2K tokens, depths 10/50/90%, for `f16`,
//! `k5v4`, `tq3.5` and `mse-k4v4` — per cell the hit and the answer text. Greedy decoding,
//! fixed key seed and chunked prefill make it deterministic; a change in the forward pass or a
//! codec that flips a cell shows up as a diff to review (`golden/needle_model.snap`).
//!
//! The f16 pattern to expect (brief, llama.cpp with an f16 cache): hits at 50% and 90% of 1K
//! and 2K, misses at 10%. Needs the reference model (skipped with a message when absent,
//! failing instead when `TQ_REQUIRE_MODEL=1`). Runs 24 cells (six prompts × four caches).
//!
//! Why the fused kernel pinned to AVX2 (`AttentionKernel::FusedOn(Isa::Avx2)`): greedy answers
//! of a 135M model flip on one-ulp changes, and the fused kernel's summation order depends on
//! the instruction set (AVX2 and AVX-512 round differently, both within the tolerance the
//! kernel tests check against the exact reference). Pinning AVX2 — and the weight dot products,
//! which are the same AVX2 kernels on every x86-64 CPU that has it — makes the snapshot
//! bit-identical on every such CPU. Elsewhere (aarch64, CPUs without AVX2, or
//! `TQ_SIMD=scalar`) the test says so and skips. (The exact reference kernel would be
//! ISA-free too, but it decodes the whole cache per call: too slow for CI.)

mod gguf_common;
mod needle_common;

use gguf_common::reference_model_or_skip;
use needle_common::run_grid;
use tq_cache::attention::AttentionKernel;
use tq_cache::attention::simd::Isa;
use tq_models::chat::ChatTemplate;
use tq_models::llama::Llama;
use tq_models::needle::{NeedleOptions, NeedleSpec, PromptStyle};

const ALLOCS: [&str; 4] = ["f16", "k5v4", "tq3.5", "mse-k4v4"];
const CONTEXTS: [usize; 2] = [1024, 2048];
const DEPTHS: [f64; 3] = [0.1, 0.5, 0.9];

#[test]
fn needle_retrieval_on_the_reference_model() {
    let Some(path) = reference_model_or_skip() else {
        return;
    };
    if !matches!(Isa::detect(), Isa::Avx2 | Isa::Avx512) {
        eprintln!(
            "skipped: the needle golden was recorded with the x86-64 AVX2 weight kernels; this \
             machine runs {:?}, whose roundings flip greedy answers (TQ_SIMD unset on x86-64 \
             with AVX2 runs it)",
            Isa::detect()
        );
        return;
    }
    let model = Llama::load(&path).expect("the reference model loads");
    let style =
        PromptStyle::Chat(ChatTemplate::from_gguf(model.file()).expect("a ChatML template"));
    // A 5-digit key and a short sentence fit in 24 tokens; fewer decode steps keep CI short.
    let options = NeedleOptions {
        max_tokens: 24,
        kernel: AttentionKernel::FusedOn(Isa::Avx2),
        ..NeedleOptions::default()
    };
    let cells = run_grid(
        &model,
        &style,
        &NeedleSpec::builtin(),
        &ALLOCS,
        &CONTEXTS,
        &DEPTHS,
        &options,
    );
    insta::with_settings!({
        snapshot_path => concat!(env!("CARGO_MANIFEST_DIR"), "/../../golden"),
        prepend_module_to_snapshot => false,
        description => "pass-key retrieval, SmolLM2-135M-Instruct Q4_1, built-in spec, greedy, 24 new tokens",
    }, {
        insta::assert_json_snapshot!("needle_model", cells);
    });
}
