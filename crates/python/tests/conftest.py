"""Shared fixtures: the reference document written by the Rust API (tests/data/reference.json)."""

import base64
import json
from pathlib import Path

import numpy as np
import pytest

DATA = Path(__file__).parent / "data" / "reference.json"


def decode_array(entry):
    """An array stored as {"dtype", "shape", "b64"} (little-endian bytes, base64)."""
    dtype = np.dtype(entry["dtype"]).newbyteorder("<")
    data = np.frombuffer(base64.b64decode(entry["b64"]), dtype=dtype)
    return data.astype(dtype.newbyteorder("="), copy=False).reshape(entry["shape"])


@pytest.fixture(scope="session")
def reference():
    with DATA.open() as f:
        return json.load(f)


def assert_same_bits(actual, expected):
    """Equal dtype, shape and bytes (so -0.0 != 0.0 and NaN payloads count)."""
    actual = np.asarray(actual)
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    if actual.tobytes() != expected.tobytes():
        bad = np.flatnonzero(
            actual.reshape(-1).view(np.uint8 if actual.itemsize == 1 else f"u{actual.itemsize}")
            != expected.reshape(-1).view(np.uint8 if expected.itemsize == 1 else f"u{expected.itemsize}")
        )
        raise AssertionError(
            f"{bad.size} of {actual.size} elements differ; first at flat index {bad[0]}: "
            f"{actual.reshape(-1)[bad[0]]!r} != {expected.reshape(-1)[bad[0]]!r}"
        )
