//! libFuzzer entry point of [`tq_fuzz::cache_file`]: `cargo xtask fuzz cache_file`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tq_fuzz::cache_file(data));
