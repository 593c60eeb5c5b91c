//! libFuzzer entry point of [`tq_fuzz::gguf`]: `cargo xtask fuzz gguf`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tq_fuzz::gguf(data));
