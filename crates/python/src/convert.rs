//! From Python objects to borrowed Rust slices, and from Rust errors to Python exceptions.
//!
//! # Copies
//!
//! An input that already is a C-contiguous (and aligned) numpy array of the element type
//! (`float32` for vectors, `uint32` for packed words, `float16` for stored norms) is borrowed as
//! it is: the Rust code reads numpy's own buffer ([`PyReadonlyArrayDyn::as_slice`]), with the
//! GIL released. Anything else (another dtype, a strided view, a list, a misaligned buffer) is
//! converted exactly once, by `numpy.require(obj, dtype, ["C", "A"])` (`ascontiguousarray`
//! that also aligns), and that copy is borrowed. [`conversions`] counts
//! those conversions so tests can observe that the fast path copies nothing. Outputs are Rust
//! vectors handed to numpy without a copy (`IntoPyArray` on an owned `ndarray` array).
//!
//! While Rust reads a borrowed array with the GIL released, another Python thread could still
//! write to it (numpy has no lock); as with any numpy extension that releases the GIL, do not
//! mutate an array while a call that reads it runs.

use std::fmt::Display;
use std::sync::atomic::{AtomicU64, Ordering};

use numpy::ndarray::{ArrayD, IxDyn};
use numpy::{
    Element, IntoPyArray, PyArrayDyn, PyArrayMethods, PyReadonlyArrayDyn, PyUntypedArrayMethods,
};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

pyo3::create_exception!(
    turboquant,
    TurboQuantError,
    PyValueError,
    "Raised for every error the Rust library reports (bad shapes, dtypes that cannot be \
     converted, NaN or infinite inputs, invalid parameters, allocation files that do not \
     parse); the message is the Rust error's. A subclass of ValueError."
);

/// Conversions to a contiguous array of the wanted dtype since the module was loaded.
static CONVERSIONS: AtomicU64 = AtomicU64::new(0);

/// How many inputs so far were not already C-contiguous, aligned arrays of the wanted dtype and
/// had to be converted (copied) once.
pub(crate) fn conversions() -> u64 {
    CONVERSIONS.load(Ordering::Relaxed)
}

/// The exception for any Rust-side error: a [`TurboQuantError`] carrying its message.
pub(crate) fn error(message: impl Display) -> PyErr {
    TurboQuantError::new_err(message.to_string())
}

/// `error` with the argument's name in front.
pub(crate) fn arg_error(name: &str, message: impl Display) -> PyErr {
    error(format!("{name}: {message}"))
}

/// A borrowed, C-contiguous numpy array of `T`: numpy's buffer when the input already was one,
/// else the one conversion of it.
pub(crate) struct Input<'py, T: Element> {
    array: PyReadonlyArrayDyn<'py, T>,
    name: &'static str,
}

impl<'py, T: Element> Input<'py, T> {
    /// Borrows `obj` as a C-contiguous array of `T`, converting (copying) it only if it is not
    /// one already.
    pub(crate) fn new(obj: &Bound<'py, PyAny>, name: &'static str) -> PyResult<Self> {
        let py = obj.py();
        if let Ok(array) = obj.cast::<PyArrayDyn<T>>()
            && array.is_c_contiguous()
            && array.is_aligned()
        {
            let array = array.try_readonly().map_err(|e| arg_error(name, e))?;
            return Ok(Self { array, name });
        }
        // `require(..., ["C", "A"])` is `ascontiguousarray` that also copies a misaligned
        // buffer (a slice of one would be undefined behaviour).
        let numpy = py.import("numpy")?;
        let converted = numpy
            .call_method1("require", (obj, T::get_dtype(py), ["C", "A"]))
            .map_err(|e| {
                arg_error(
                    name,
                    format!("cannot convert to {}: {e}", dtype_name::<T>(py)),
                )
            })?;
        CONVERSIONS.fetch_add(1, Ordering::Relaxed);
        let array = converted
            .cast_into::<PyArrayDyn<T>>()
            .map_err(|e| arg_error(name, e))?;
        let array = array.try_readonly().map_err(|e| arg_error(name, e))?;
        Ok(Self { array, name })
    }

    /// The array's shape.
    pub(crate) fn shape(&self) -> &[usize] {
        self.array.shape()
    }

    /// The elements in C order, borrowed from numpy's buffer.
    pub(crate) fn slice(&self) -> PyResult<&[T]> {
        self.array.as_slice().map_err(|e| arg_error(self.name, e))
    }

    /// Checks that the array has exactly `expected` as its shape, where `None` is any length;
    /// `what` describes the expected shape in the message (e.g. `[n, 64]`).
    pub(crate) fn expect_shape(&self, expected: &[Option<usize>], what: &str) -> PyResult<()> {
        let shape = self.shape();
        let fits = shape.len() == expected.len()
            && shape
                .iter()
                .zip(expected)
                .all(|(&actual, want)| want.is_none_or(|w| w == actual));
        if fits {
            Ok(())
        } else {
            Err(arg_error(
                self.name,
                format!("expected shape {what}, got {shape:?}"),
            ))
        }
    }

    /// Requires a `[n, width]` matrix and returns `n`.
    pub(crate) fn rows(&self, width: usize) -> PyResult<usize> {
        self.expect_shape(&[None, Some(width)], &format!("[n, {width}]"))?;
        Ok(self.shape()[0])
    }

    /// Requires a vector `[n]` (when `n` is given, of exactly that length) and returns its length.
    pub(crate) fn vector(&self, n: Option<usize>) -> PyResult<usize> {
        let what = n.map_or_else(|| "[n]".to_string(), |n| format!("[{n}]"));
        self.expect_shape(&[n], &what)?;
        Ok(self.shape()[0])
    }
}

impl<'py> Input<'py, f32> {
    /// Rejects NaN (and, with `infinite`, ±∞) elements, naming the first one.
    pub(crate) fn require_finite(&self, infinite: bool) -> PyResult<()> {
        let data = self.slice()?;
        let bad = |v: &f32| v.is_nan() || (infinite && v.is_infinite());
        if let Some(index) = data.iter().position(bad) {
            let what = if infinite { "finite" } else { "a number" };
            return Err(arg_error(
                self.name,
                format!("element {index} is {}, not {what}", data[index]),
            ));
        }
        Ok(())
    }
}

fn dtype_name<T: Element>(py: Python<'_>) -> String {
    T::get_dtype(py).to_string()
}

/// A Rust vector as a numpy array of the given shape, without copying it.
pub(crate) fn output<'py, T: Element>(
    py: Python<'py>,
    data: Vec<T>,
    shape: &[usize],
) -> PyResult<Bound<'py, PyArrayDyn<T>>> {
    let array = ArrayD::from_shape_vec(IxDyn(shape), data).map_err(error)?;
    Ok(array.into_pyarray(py))
}

/// Positions as `u32`: any integer array-like, each in `0..=u32::MAX`.
pub(crate) fn positions(obj: &Bound<'_, PyAny>, name: &'static str) -> PyResult<Vec<u32>> {
    let input = Input::<i64>::new(obj, name)?;
    input.vector(None)?;
    input
        .slice()?
        .iter()
        .enumerate()
        .map(|(i, &p)| {
            u32::try_from(p)
                .map_err(|_| arg_error(name, format!("element {i} ({p}) is not in 0..=4294967295")))
        })
        .collect()
}
