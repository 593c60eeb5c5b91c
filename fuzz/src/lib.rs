//! Coverage-guided fuzz targets for every loader of untrusted bytes: GGUF model files, text
//! through the tokenizers, allocation TOML files and saved caches.
//!
//! Each target is a plain function of `&[u8]` that returns normally for every input and panics
//! only when a property of the loader breaks: a panic inside a loader, an accepted file that
//! does not round-trip, a tensor view outside its file, text that does not survive
//! tokenize → decode. The same functions run in three places:
//!
//! - under libFuzzer (`fuzz_targets/*.rs`, built by `cargo xtask fuzz <target>` with the
//!   `libfuzzer` feature and LLVM's sanitizer-coverage instrumentation), which mutates the
//!   seed corpus in `fuzz/seeds/<target>/` toward new code paths;
//! - in `tests/replay.rs`, an ordinary test of the workspace, over every seed and every input
//!   that once crashed a target (`fuzz/regressions/<target>/`), so a fixed crash stays fixed
//!   without a fuzzer in CI;
//! - in a debugger, by calling the function on the file libFuzzer wrote.
//!
//! # Why libFuzzer through `libfuzzer-sys`
//!
//! It is coverage-guided and runs on the stable toolchain: the crate compiles libFuzzer's C++
//! and links it as the binary's `main`, and the only compiler support needed is the
//! `-Cpasses=sancov-module` instrumentation, a stable codegen option (what `cargo fuzz`
//! passes; installing `cargo fuzz` itself is not needed). See `docs/fuzzing.md` for the
//! commands, the executions run and what they found.
//!
//! ```
//! // Any bytes: a typed error inside, never a panic.
//! tq_fuzz::gguf(b"GGUF\x03\x00\x00\x00garbage");
//! tq_fuzz::allocation(b"[key]\nbits = 99\n");
//! tq_fuzz::cache_file(b"not a cache");
//! ```

mod allocation;
mod cache_file;
mod gguf;
pub mod sample;
mod tokenizer;

pub use allocation::allocation;
pub use cache_file::{cache_file, with_crc};
pub use gguf::gguf;
pub use tokenizer::{TokenizerPair, tokenizer};

/// Runs `work` inside a one-thread rayon pool of this thread's own. The cache and the model
/// run their attention and weight products as rayon parallel iterators; called from outside a
/// pool, each of those hands its work to a pool thread and sleeps until it is done, which cost
/// the allocation target nine tenths of its time (a microsecond's work behind a futex wait).
fn on_one_thread<R: Send>(work: impl FnOnce() -> R + Send) -> R {
    thread_local! {
        static POOL: rayon::ThreadPool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .expect("a one-thread pool");
    }
    POOL.with(|pool| pool.install(work))
}

/// The targets, by the name `cargo xtask fuzz` and the seed folders use.
pub const TARGETS: [&str; 4] = ["gguf", "tokenizer", "allocation", "cache_file"];
