//! libFuzzer entry point of [`tq_fuzz::allocation`]: `cargo xtask fuzz allocation`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tq_fuzz::allocation(data));
