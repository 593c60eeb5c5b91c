//! Feeds arbitrary bytes to the GGUF parser. Any input must give `Ok` or a typed error: a
//! panic, an out-of-bounds read, a stack overflow or an allocation beyond the input's size
//! (libFuzzer's `-rss_limit_mb`/`-malloc_limit_mb`) is a bug.
//!
//! Whatever parses is also exercised: every typed accessor on every key and every tensor's
//! data, so the checks made at parse time are the ones the accessors rely on.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tq_models::gguf::Gguf;

fuzz_target!(|data: &[u8]| {
    let Ok(gguf) = Gguf::from_bytes(data.to_vec()) else {
        return;
    };
    let metadata = gguf.metadata();
    for (key, _) in metadata.iter() {
        let _ = metadata.u32(key);
        let _ = metadata.i64(key);
        let _ = metadata.f32(key);
        let _ = metadata.str(key);
        let _ = metadata.array_str(key);
    }
    for info in gguf.tensors() {
        if let Ok(view) = gguf.tensor_data(&info.name) {
            assert_eq!(Some(view.data.len() as u64), info.byte_size());
        }
    }
});
