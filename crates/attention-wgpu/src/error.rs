//! The crate's error type: every failure is a value, with the driver's own message where one
//! exists (adapter and device requests, shader and pipeline validation, out-of-memory).

use tq_cache::CacheError;
use tq_cache::codec::CodecError;

/// Why a GPU operation failed.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// No adapter matched the request (no GPU and no software driver such as lavapipe).
    #[error("no GPU adapter available: {0}")]
    NoAdapter(String),
    /// The adapter refused to create a device.
    #[error("device request failed: {0}")]
    RequestDevice(String),
    /// The driver rejected a shader module or pipeline (its message, naga's included).
    #[error("pipeline `{kernel}` failed validation: {message}")]
    Pipeline {
        /// The kernel (file stem of its `.wgsl`).
        kernel: &'static str,
        /// The driver's message.
        message: String,
    },
    /// A command failed validation or ran out of memory on the device.
    #[error("GPU operation `{operation}` failed: {message}")]
    Device {
        /// What the crate was doing.
        operation: &'static str,
        /// The driver's message.
        message: String,
    },
    /// Mapping a buffer for readback failed or the device was lost while waiting.
    #[error("readback failed: {0}")]
    Readback(String),
    /// A cache configuration the GPU kernels do not implement.
    #[error("unsupported on the GPU: {0}")]
    Unsupported(String),
    /// A tensor has the wrong shape or the call is inconsistent with the cache.
    #[error("shape mismatch for {what}: expected {expected}, got {actual}")]
    Shape {
        /// Which tensor or quantity.
        what: &'static str,
        /// Expected value.
        expected: usize,
        /// Actual value.
        actual: usize,
    },
    /// A buffer would exceed what one binding (or the device) allows even after splitting.
    #[error("{what} needs {needed} bytes in one binding, above the limit of {limit} bytes")]
    TooLarge {
        /// Which buffer.
        what: &'static str,
        /// Bytes required.
        needed: u64,
        /// The binding limit in force.
        limit: u64,
    },
    /// A vector could not be encoded (non-finite, or a norm beyond f16).
    #[error(transparent)]
    Codec(#[from] CodecError),
    /// The CPU cache reported an error (building codecs, reading records).
    #[error(transparent)]
    Cache(#[from] CacheError),
}
