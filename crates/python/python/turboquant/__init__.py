"""TurboQuant KV-cache compression from numpy.

The classes are the Rust crates of turboquant-rs through PyO3: every batch call takes float32
arrays ``[n, d]`` (a C-contiguous float32 array is read in place; anything else is converted
once), releases the GIL while Rust runs, and returns numpy arrays. Results equal the Rust API's
bit for bit. Errors raise :class:`TurboQuantError` (a :class:`ValueError`) with the Rust message.

See ``docs/python.md`` in the repository for a guide.
"""

from ._turboquant import (
    Allocation,
    DebiasedMse,
    KvCache,
    LloydMaxCodebook,
    ModelCache,
    QjlSketch,
    Rotation,
    TqMse,
    TqProd,
    TurboQuantError,
    _bench_rust_encode,
    _conversions,
    num_threads,
)

__all__ = [
    "Allocation",
    "DebiasedMse",
    "KvCache",
    "LloydMaxCodebook",
    "ModelCache",
    "QjlSketch",
    "Rotation",
    "TqMse",
    "TqProd",
    "TurboQuantError",
    "num_threads",
]
