//! libFuzzer entry point of [`tq_fuzz::tokenizer`]: `cargo xtask fuzz tokenizer` (needs both
//! models: `cargo xtask fetch-model`).
#![no_main]

use std::sync::LazyLock;
use tq_fuzz::TokenizerPair;

/// Read once: loading the vocabularies takes far longer than one iteration.
static PAIR: LazyLock<TokenizerPair> =
    LazyLock::new(|| TokenizerPair::load().unwrap_or_else(|reason| panic!("{reason}")));

libfuzzer_sys::fuzz_target!(|data: &[u8]| tq_fuzz::tokenizer(data, &PAIR));
