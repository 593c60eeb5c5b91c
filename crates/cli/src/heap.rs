//! Live and peak heap bytes of this process, counted by a global allocator that wraps the
//! system one.
//!
//! `tq bench e2e` splits its peak resident memory into the model file's pages, the program,
//! and the heap at its peak; the heap part is measured here rather than inferred from RSS, so
//! the bench can say exactly how much of the peak is the cache, the per-chunk scratch, and
//! anything else. Two relaxed atomic operations per allocation: the decode step allocates
//! nothing (see `tq_models`' `llama_no_alloc` test) and prefill allocates per chunk, not per
//! token, so the counting does not move the speed figures.
//!
//! Hand-written rather than taken from a crate: `peak_alloc` (the small crate that does this)
//! implements `alloc_zeroed` as `alloc` plus a write of every byte and `realloc` as
//! allocate-copy-free, which would fault in pages the system's `calloc` leaves untouched and
//! move every growing buffer: it would change the resident memory this module helps explain.
//! This wrapper forwards every call unchanged to `System` and only counts sizes — the only
//! `unsafe` outside the SIMD kernels and GPU buffers, as a `GlobalAlloc` must be.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

/// The system allocator, counting live bytes and their high-water mark.
pub struct CountingAllocator;

// SAFETY: every call is forwarded unchanged to `System`, which upholds `GlobalAlloc`'s
// contract; the counters only observe sizes and never touch the memory.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's layout (see the impl's SAFETY note).
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            grow(layout.size());
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            grow(layout.size());
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator, i.e. from `System`, with this layout.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from `System` with `layout`; the caller guarantees `new_size`.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            // During a moving realloc both blocks exist: count the peak as if they did.
            grow(new_size);
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        }
        new
    }
}

fn grow(bytes: usize) {
    let live = LIVE.fetch_add(bytes, Ordering::Relaxed) + bytes;
    PEAK.fetch_max(live, Ordering::Relaxed);
}

/// Bytes currently allocated on the heap.
pub fn live_bytes() -> usize {
    LIVE.load(Ordering::Relaxed)
}

/// The most bytes that were allocated at once since the start (or the last
/// [`reset_peak`]).
pub fn peak_bytes() -> usize {
    PEAK.load(Ordering::Relaxed)
}

/// Restarts the high-water mark from the current live bytes.
pub fn reset_peak() {
    PEAK.store(live_bytes(), Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_live_and_peak_bytes() {
        // Other tests allocate and free concurrently, so only what this block guarantees is
        // checked: while it lives, live and peak bytes include it.
        let block = std::hint::black_box(vec![1u8; 1 << 20]);
        assert!(live_bytes() >= 1 << 20);
        assert!(peak_bytes() >= 1 << 20);
        drop(block);
    }
}
