//! Golden snapshot of pass-key retrieval on Gemma 3 270M, a base model with sliding-window
//! layers: the built-in completion spec (the 5-digit key in "the grass is green" filler, asked
//! as `Question: … Answer: The secret pass key is`) at 4K tokens — past the 512-token window
//! of 15 of its 18 layers, so only the 3 global layers can see the needle — at depths
//! 10/50/90%, for `f16`, `rec4.25-global` (only the global layers compressed) and `rec4.25`
//! (every layer compressed). Per cell the hit and the answer text (`golden/needle_gemma3.snap`).
//! The 16K and 32K grid, too slow for CI, is in docs/results.md (`tq needle --model
//! gemma3-270m --contexts 16384,32768`).
//!
//! Pinned, as the SmolLM2 golden is, to the fused attention kernel's AVX2 order (the weight
//! products are the same bits on every x86-64 instruction set): skipped elsewhere. Needs the
//! model (skipped with a message when absent, failing when `TQ_REQUIRE_MODEL=1`). Nine cells,
//! about 30 s each on two cores.

mod gguf_common;
mod needle_common;

use gguf_common::gemma3_model_or_skip;
use needle_common::run_grid;
use tq_cache::attention::AttentionKernel;
use tq_cache::attention::simd::Isa;
use tq_models::causal_lm::CausalLm;
use tq_models::gemma3::Gemma3;
use tq_models::needle::{NeedleOptions, NeedleSpec, PromptStyle};

const ALLOCS: [&str; 3] = ["f16", "rec4.25-global", "rec4.25"];
const CONTEXTS: [usize; 1] = [4096];
const DEPTHS: [f64; 3] = [0.1, 0.5, 0.9];

#[test]
fn needle_retrieval_on_gemma3() {
    let Some(path) = gemma3_model_or_skip() else {
        return;
    };
    if !matches!(Isa::detect(), Isa::Avx2 | Isa::Avx512) {
        eprintln!(
            "skipped: the Gemma 3 needle golden was recorded with the AVX2 attention order; this \
             machine runs {:?}",
            Isa::detect()
        );
        return;
    }
    let model = Gemma3::load(&path).expect("Gemma 3 loads");
    let style = PromptStyle::for_model(model.file());
    assert_eq!(
        style,
        PromptStyle::Completion,
        "Gemma 3 270M has no chat template"
    );
    let spec = NeedleSpec::builtin_for(&style);
    // The key's five digits are five tokens; twelve leave room for the period and a word.
    let options = NeedleOptions {
        max_tokens: 12,
        prefill_chunk: 512,
        kernel: AttentionKernel::FusedOn(Isa::Avx2),
        ..NeedleOptions::default()
    };
    let cells = run_grid(&model, &style, &spec, &ALLOCS, &CONTEXTS, &DEPTHS, &options);
    insta::with_settings!({
        snapshot_path => concat!(env!("CARGO_MANIFEST_DIR"), "/../../golden"),
        prepend_module_to_snapshot => false,
        description => "pass-key retrieval, Gemma 3 270M Q4_K_M, built-in completion spec, greedy, 12 new tokens",
    }, {
        insta::assert_json_snapshot!("needle_gemma3", cells);
    });
}
