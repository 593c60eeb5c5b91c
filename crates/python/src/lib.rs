//! # tq-python: the `turboquant` Python module
//!
//! Python bindings for the TurboQuant crates, importable as `turboquant` (built with maturin,
//! see `crates/python/pyproject.toml` and `docs/python.md`):
//!
//! | Python | Rust |
//! |---|---|
//! | `LloydMaxCodebook(dim, bits, law)` | [`tq_lloyd_max::LloydMaxCodebook`] |
//! | `Rotation(kind, dim, seed)` | [`tq_rotation::Rotation`] |
//! | `QjlSketch(kind, dim, seed, scale, shrinkage)` | [`tq_qjl::QjlSketch`] |
//! | `TqMse`, `TqProd`, `DebiasedMse` | [`tq_cache::codec`] |
//! | `Allocation.from_toml / preset / load` | [`tq_cache::allocation::Allocation`] |
//! | `KvCache`, `ModelCache` | [`tq_cache::kv_cache::KvCache`], [`tq_cache::states::ModelCache`] |
//!
//! Every batch call takes float32 arrays `[n, d]` and returns numpy arrays; each row goes
//! through the library's own per-vector API ([`batch`]), so results equal the Rust API's bit
//! for bit (`tests/data/reference.json`, written by `tests/reference_fixture.rs`, pins that
//! from both sides). Rust runs with the GIL released (`Python::detach`), on rayon.
//!
//! # Copies
//!
//! A C-contiguous float32 input is read in place, without a copy; anything else is converted
//! once with `numpy.require(x, dtype, ["C", "A"])` (the `convert` module;
//! `turboquant._conversions()` counts those conversions, which the tests use to observe it).
//! Outputs are Rust vectors handed to numpy without a copy.
//!
//! # Errors
//!
//! Every Rust error — and every bad shape, dtype that cannot be converted, NaN or infinite
//! input — raises `turboquant.TurboQuantError` (a `ValueError`) carrying the Rust message; no
//! input reaches a panic.
//!
//! # Dependencies
//!
//! `pyo3` (the Python binding layer: classes, exceptions, the GIL) and `numpy` (zero-copy
//! access to numpy arrays, and float16 through `half`) are dependencies of this crate only:
//! the library crates stay free of Python, and nothing in the workspace depends on this
//! crate (the arrows point down the pipeline). PyO3 builds against the stable ABI
//! (`abi3-py39`), so one wheel serves CPython 3.9 and newer. The `extension-module` feature
//! (on in maturin builds) stops linking libpython; it is off by default so `cargo test` and
//! `cargo clippy` on the workspace link their test binaries.
#![deny(missing_docs)]

mod allocation;
pub mod batch;
mod cache;
mod codebook;
mod codecs;
mod convert;
mod qjl;
mod rotation;

use pyo3::prelude::*;

/// `turboquant._turboquant`, the native part of the `turboquant` package (the package's
/// `__init__.py` re-exports everything).
#[pymodule]
fn _turboquant(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("TurboQuantError", py.get_type::<convert::TurboQuantError>())?;
    m.add_class::<codebook::PyLloydMaxCodebook>()?;
    m.add_class::<rotation::PyRotation>()?;
    m.add_class::<qjl::PyQjlSketch>()?;
    m.add_class::<codecs::PyTqMse>()?;
    m.add_class::<codecs::PyTqProd>()?;
    m.add_class::<codecs::PyDebiasedMse>()?;
    m.add_class::<allocation::PyAllocation>()?;
    m.add_class::<cache::PyKvCache>()?;
    m.add_class::<cache::PyModelCache>()?;
    m.add_function(wrap_pyfunction!(codecs::_bench_rust_encode, m)?)?;
    m.add_function(wrap_pyfunction!(_conversions, m)?)?;
    m.add_function(wrap_pyfunction!(num_threads, m)?)?;
    Ok(())
}

/// How many array inputs so far were not C-contiguous, aligned arrays of the wanted dtype and
/// were converted (copied) once by `numpy.require(x, dtype, ["C", "A"])`; a C-contiguous
/// float32 input adds nothing.
#[pyfunction]
fn _conversions() -> u64 {
    convert::conversions()
}

/// The number of threads batch calls run on (rayon's pool; `RAYON_NUM_THREADS` sets it
/// before the first call).
#[pyfunction]
fn num_threads() -> usize {
    rayon::current_num_threads()
}
