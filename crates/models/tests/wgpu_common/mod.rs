//! The GPU adapter for the wgpu backend tests: required when `CI=true`, else a missing adapter
//! skips the test with a printed reason.

use std::sync::{Arc, OnceLock};

use tq_attention_wgpu::{ContextOptions, GpuContext};

/// The first adapter wgpu finds (`WGPU_BACKEND` picks the API), or `None` after printing why
/// the test is skipped. One context per test binary: its specialized pipelines are compiled
/// once (seconds on lavapipe) and shared by the tests.
pub fn context_or_skip() -> Option<Arc<GpuContext>> {
    static CONTEXT: OnceLock<Option<Arc<GpuContext>>> = OnceLock::new();
    CONTEXT.get_or_init(open).clone()
}

fn open() -> Option<Arc<GpuContext>> {
    match GpuContext::new(&ContextOptions::default()) {
        Ok(ctx) => {
            let info = ctx.adapter_info();
            eprintln!(
                "GPU tests on {} ({:?}, {:?})",
                info.name, info.backend, info.device_type
            );
            Some(Arc::new(ctx))
        }
        Err(e) if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("CI=true requires a GPU adapter (lavapipe will do): {e}")
        }
        Err(e) => {
            eprintln!("skipped: no GPU adapter: {e}");
            None
        }
    }
}
