"""Behaviour of the bindings beyond bit equality: shapes, dtypes, copies, errors, caches."""

import threading
from pathlib import Path

import numpy as np
import pytest

import turboquant as tq

RNG = np.random.default_rng(1234)


def gaussian(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


# --- copies -----------------------------------------------------------------------------------


def test_contiguous_float32_input_is_not_copied():
    codec = tq.TqMse(128, 4, 1)
    x = gaussian(256, 128)
    assert x.flags.c_contiguous and x.dtype == np.float32
    before = tq._conversions()
    codec.encode(x)
    codec.decode(*codec.encode(x))
    codec.inner_products(x[:4], *codec.encode(x))
    assert tq._conversions() == before


@pytest.mark.parametrize(
    "make",
    [
        lambda x: x.astype(np.float64),
        lambda x: np.asfortranarray(x),
        lambda x: x.tolist(),
        lambda x: x.astype(">f4"),
    ],
    ids=["float64", "fortran", "list", "big-endian"],
)
def test_other_inputs_are_converted_once_with_the_same_result(make):
    codec = tq.TqMse(64, 3, 2)
    x = gaussian(16, 64)
    expected = codec.encode(x)
    before = tq._conversions()
    got = codec.encode(make(x))
    assert tq._conversions() == before + 1
    for a, b in zip(got, expected):
        np.testing.assert_array_equal(a, b)


def test_strided_rows_are_converted_once():
    codec = tq.TqMse(64, 4, 2)
    x = gaussian(32, 64)
    view = x[::2]
    before = tq._conversions()
    got = codec.encode(view)
    assert tq._conversions() == before + 1
    np.testing.assert_array_equal(got[0], codec.encode(np.ascontiguousarray(view))[0])


def test_misaligned_float32_buffers_are_copied_not_misread():
    codec = tq.TqMse(64, 4, 2)
    x = gaussian(4, 64)
    misaligned = np.frombuffer(b"\0" + x.tobytes(), dtype=np.float32, offset=1).reshape(4, 64)
    assert not misaligned.flags.aligned
    before = tq._conversions()
    got = codec.encode(misaligned)
    assert tq._conversions() == before + 1
    for a, b in zip(got, codec.encode(x)):
        np.testing.assert_array_equal(a, b)


def test_read_only_inputs_are_read_in_place():
    codec = tq.TqMse(64, 4, 2)
    x = gaussian(4, 64)
    x.flags.writeable = False
    before = tq._conversions()
    codec.encode(x)
    assert tq._conversions() == before


def test_outputs_are_owned_writable_arrays():
    words, norms = tq.TqMse(64, 4, 2).encode(gaussian(3, 64))
    assert words.dtype == np.uint32 and words.shape == (3, 8) and words.flags.c_contiguous
    assert norms.dtype == np.float16 and norms.shape == (3,)
    words[0, 0] = 7  # ours to modify


# --- errors -----------------------------------------------------------------------------------


def test_error_class_is_a_value_error():
    assert issubclass(tq.TurboQuantError, ValueError)
    assert tq.TurboQuantError.__module__ == "turboquant"


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: tq.TqMse(64, 9, 1), "unsupported bit width 9"),
        (lambda: tq.TqProd(64, 1, 1), "unsupported bit width 1"),
        (lambda: tq.TqMse(0, 4, 1), "dimension must be at least 1"),
        (lambda: tq.TqMse(64, 4, 1, rotation="fourier"), "unknown rotation kind"),
        (lambda: tq.Rotation("haar", 9000, 1), "exceeds the maximum"),
        (lambda: tq.LloydMaxCodebook(2, 3), "too small for the beta law"),
        (lambda: tq.LloydMaxCodebook(64, 3, law="cauchy"), "unknown law"),
        (lambda: tq.QjlSketch("haar", 64, 1, shrinkage=float("nan")), "shrinkage"),
        (lambda: tq.QjlSketch("haar", 64, 1, scale="huge"), "unknown sketch scale"),
        (lambda: tq.DebiasedMse(64, 0, 1), "unsupported bit width 0"),
        (lambda: tq.Allocation.preset("k9v9"), "not a shipped preset"),
    ],
)
def test_bad_parameters_raise_with_the_rust_message(call, message):
    with pytest.raises(tq.TurboQuantError, match=message):
        call()


def test_bad_shapes_raise():
    codec = tq.TqMse(64, 4, 1)
    with pytest.raises(tq.TurboQuantError, match=r"expected shape \[n, 64\], got \[63\]"):
        codec.encode(np.zeros(63, np.float32))
    with pytest.raises(tq.TurboQuantError, match=r"\[n, 64\]"):
        codec.encode(np.zeros((2, 3, 64), np.float32))
    words, norms = codec.encode(gaussian(4, 64))
    with pytest.raises(tq.TurboQuantError, match="words"):
        codec.decode(words[:, :7], norms)
    with pytest.raises(tq.TurboQuantError, match="words"):
        codec.decode(words[:3], norms)
    with pytest.raises(tq.TurboQuantError, match="queries"):
        codec.inner_products(gaussian(2, 32), words, norms)


def test_unconvertible_dtypes_raise():
    codec = tq.TqMse(64, 4, 1)
    with pytest.raises(tq.TurboQuantError, match="cannot convert to float32"):
        codec.encode(np.array([["a"] * 64]))
    with pytest.raises(tq.TurboQuantError, match="cannot convert"):
        codec.encode(object())


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_inputs_raise_naming_the_row(bad):
    x = gaussian(10, 64)
    x[7, 5] = bad
    for codec in [tq.TqMse(64, 4, 1), tq.TqProd(64, 4, 1), tq.DebiasedMse(64, 4, 1)]:
        with pytest.raises(tq.TurboQuantError, match="row 7: input coordinate 5 is not finite"):
            codec.encode(x)
    with pytest.raises(tq.TurboQuantError, match="not finite"):
        tq.Rotation("hadamard", 64, 1).apply(x)
    with pytest.raises(tq.TurboQuantError, match="not finite"):
        tq.QjlSketch("haar", 64, 1).encode(x)
    with pytest.raises(tq.TurboQuantError, match="queries"):
        tq.TqMse(64, 4, 1).inner_products(x, *tq.TqMse(64, 4, 1).encode(gaussian(2, 64)))


def test_nan_is_an_error_for_the_codebook_but_infinities_are_outer_codes():
    book = tq.LloydMaxCodebook(64, 2)
    with pytest.raises(tq.TurboQuantError, match="element 1 is NaN"):
        book.quantize(np.array([0.0, np.nan], np.float32))
    assert list(book.quantize(np.array([-np.inf, np.inf], np.float32))) == [0, 3]
    with pytest.raises(tq.TurboQuantError, match="not below 4 levels"):
        book.dequantize(np.array([4], np.uint8))


def test_norm_beyond_float16_raises():
    x = np.full((1, 64), 1e4, np.float32)
    with pytest.raises(tq.TurboQuantError, match="f16 range"):
        tq.TqMse(64, 4, 1).encode(x)


def test_empty_batches():
    codec = tq.TqProd(64, 5, 1)
    codes = codec.encode(np.zeros((0, 64), np.float32))
    assert [c.shape for c in codes] == [(0, 8), (0,), (0, 2), (0,)]
    assert codec.decode(*codes).shape == (0, 64)
    assert codec.inner_products(gaussian(3, 64), *codes).shape == (3, 0)


# --- the codecs -------------------------------------------------------------------------------


def test_mse_error_is_near_the_codebook_distortion():
    codec = tq.TqMse(128, 4, 3)
    x = gaussian(2000, 128)
    x_hat = codec.decode(*codec.encode(x))
    relative = ((x - x_hat) ** 2).sum(axis=1) / (x**2).sum(axis=1)
    assert abs(relative.mean() - codec.codebook.unit_vector_distortion) < 0.1 * 0.0093


def test_prod_inner_products_are_unbiased_on_average():
    codec = tq.TqProd(128, 4, 3)
    x = gaussian(3000, 128)
    q = gaussian(1, 128)
    error = codec.inner_products(q, *codec.encode(x))[0] - x @ q[0]
    # The mean of 3000 errors sits within 6 standard errors of zero (a biased estimator, like
    # TQ_mse's inner products, misses by about D_mse times the scores' spread).
    assert abs(error.mean()) < 6 * error.std() / np.sqrt(len(error))


def test_debiased_mse_scales_the_mse_scores():
    x, q = gaussian(50, 64), gaussian(4, 64)
    plain, debiased = tq.TqMse(64, 3, 9), tq.DebiasedMse(64, 3, 9)
    codes = plain.encode(x)
    np.testing.assert_allclose(
        debiased.inner_products(q, *codes),
        plain.inner_products(q, *codes) * debiased.correction,
        rtol=1e-6,
    )
    assert debiased.codec.bits == 3


def test_rotation_round_trip_and_dense_matrix():
    for kind in ["haar", "hadamard"]:
        rotation = tq.Rotation(kind, 48, 2)
        x = gaussian(5, 48)
        np.testing.assert_allclose(rotation.apply_inverse(rotation.apply(x)), x, atol=1e-5)
        dense = rotation.to_dense()
        np.testing.assert_allclose(dense @ dense.T, np.eye(48), atol=1e-9)
        np.testing.assert_allclose(rotation.apply(x), x @ dense.T, atol=1e-4)


def test_codebook_properties():
    book = tq.LloydMaxCodebook(128, 4)
    assert book.levels == 16 and book.law == "beta" and book.dim == 128
    assert abs(book.unit_vector_distortion - 0.0093148) < 1e-6
    np.testing.assert_allclose(book.centroids, -book.centroids[::-1])
    x = gaussian(1000) / np.sqrt(128)
    np.testing.assert_array_equal(
        book.quantize(x), np.searchsorted(book.thresholds_f32, x, side="left")
    )


def test_qjl_sketch_properties():
    sketch = tq.QjlSketch("haar", 64, 1)
    assert sketch.words == 2 and sketch.scale == "exact"
    assert abs(sketch.bias_factor - 1.0) < 1e-12
    assert tq.QjlSketch("hadamard", 64, 1).bias_factor is None


def test_concurrent_calls_from_threads_agree():
    codec = tq.TqProd(128, 5, 11)
    x = gaussian(4096, 128)
    expected = codec.encode(x)
    results = [None] * 4

    def work(i):
        results[i] = codec.encode(x)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for got in results:
        for a, b in zip(got, expected):
            np.testing.assert_array_equal(a, b)


# --- allocations ------------------------------------------------------------------------------

TOML = """
name = "mine"
description = "keys at 5 bits, values at 3"
key = { codec = "prod", bits = 5 }
value = { codec = "mse", bits = 3 }
"""


def test_allocation_from_toml_text_and_path(tmp_path):
    from_text = tq.Allocation.from_toml(TOML)
    assert from_text.name == "mine" and from_text.description.startswith("keys")
    path = tmp_path / "mine.toml"
    path.write_text(TOML)
    for source in [path, str(path)]:
        assert tq.Allocation.from_toml(source).to_toml() == from_text.to_toml()
    assert tq.Allocation.load(path).name == "mine"
    # 64-dim heads: keys 32 + 8 + 4 bytes, values 24 + 2 bytes per token.
    assert from_text.bits_per_value(4, 2, 64, stream="key") == 44 * 8 / 64
    assert from_text.bits_per_value(4, 2, 64, stream="value") == 26 * 8 / 64
    assert from_text.bytes_per_token(0, 4, 0, 64, "key") == 44


def test_allocation_errors_name_the_field(tmp_path):
    with pytest.raises(tq.TurboQuantError, match=r"`value.bitz`: unknown field `bitz`"):
        tq.Allocation.from_toml('name = "x"\nkey = { codec = "mse", bits = 4 }\nvalue = { codec = "mse", bitz = 4 }\n')
    with pytest.raises(tq.TurboQuantError, match="mse"):
        tq.Allocation.from_toml('name = "x"\nkey = { codec = "mse", bits = 12 }\nvalue = { codec = "f16" }\n')
    with pytest.raises(tq.TurboQuantError):
        tq.Allocation.from_toml(tmp_path / "missing.toml")
    with pytest.raises(tq.TurboQuantError, match="missing.toml"):
        tq.Allocation.from_toml(str(tmp_path / "missing.toml"))
    with pytest.raises(tq.TurboQuantError, match="from_toml expects"):
        tq.Allocation.from_toml(12)


def test_presets():
    names = tq.Allocation.preset_names()
    assert "k5v4" in names and set(tq.Allocation.recommended_names()) <= set(names)
    assert tq.Allocation.preset_text("k5v4").startswith("#") or "k5v4" in tq.Allocation.preset_text("k5v4")
    assert tq.Allocation.preset_text("nope") is None
    assert tq.Allocation.preset("f16").bits_per_value(2, 1, 64) == 16.0


# --- caches -----------------------------------------------------------------------------------


def test_kv_cache_append_attend_and_bytes():
    cache = tq.KvCache(tq.Allocation.preset("k5v4"), 2, 64, layer=3, num_layers=30)
    keys, values = gaussian(10, 2, 64), gaussian(10, 2, 64)
    cache.append(keys, values)
    cache.append(gaussian(2, 128), gaussian(2, 128))  # flattened heads
    assert len(cache) == 12
    np.testing.assert_array_equal(cache.positions(), np.arange(12))
    assert cache.bytes_per_token == 2 * (44 + 34) + 4
    assert cache.formula_bytes == cache.allocated_bytes
    queries = gaussian(3, 4, 64)
    fused = cache.attend(queries)
    reference = cache.attend(queries, kernel="reference")
    assert fused.shape == (3, 4, 64)
    np.testing.assert_allclose(fused, reference, atol=1e-4)
    # Causal: a query at position 0 sees only the first token's value.
    early = cache.attend(queries[:1], positions=[0], kernel="reference")
    assert early.shape == (1, 4, 64)
    cache.truncate(5)
    assert len(cache) == 5
    cache.clear()
    assert len(cache) == 0
    with pytest.raises(tq.TurboQuantError, match="empty"):
        cache.attend(queries)


def test_kv_cache_attention_matches_numpy_softmax_on_an_f32_cache():
    allocation = tq.Allocation.from_toml('name = "f32"\nkey = { codec = "f32" }\nvalue = { codec = "f32" }\n')
    cache = tq.KvCache(allocation, 1, 32)
    k, v, q = gaussian(20, 1, 32), gaussian(20, 1, 32), gaussian(1, 2, 32)
    cache.append(k, v)
    out = cache.attend(q, kernel="reference")
    scores = q[0] @ k[:, 0].T / np.sqrt(32)
    p = np.exp(scores - scores.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(out[0], p @ v[:, 0], rtol=1e-5, atol=1e-6)


def test_kv_cache_errors_leave_it_unchanged():
    cache = tq.KvCache(tq.Allocation.preset("k5v4"), 2, 64, capacity=4)
    cache.append(gaussian(3, 2, 64), gaussian(3, 2, 64))
    with pytest.raises(tq.TurboQuantError, match=r"\[n, 2, 64\]"):
        cache.append(gaussian(1, 3, 64), gaussian(1, 3, 64))
    with pytest.raises(tq.TurboQuantError, match="keys hold 1 tokens but values hold 2"):
        cache.append(gaussian(1, 2, 64), gaussian(2, 2, 64))
    with pytest.raises(tq.TurboQuantError, match="not the next position"):
        cache.append(gaussian(1, 2, 64), gaussian(1, 2, 64), positions=[1])
    with pytest.raises(tq.TurboQuantError, match="0..=4294967295"):
        cache.append(gaussian(1, 2, 64), gaussian(1, 2, 64), positions=[-1])
    bad = gaussian(1, 2, 64)
    bad[0, 1, 3] = np.nan
    with pytest.raises(tq.TurboQuantError, match="not finite"):
        cache.append(bad, gaussian(1, 2, 64))
    assert len(cache) == 3
    with pytest.raises(tq.TurboQuantError, match="context overflow"):
        cache.append(gaussian(2, 2, 64), gaussian(2, 2, 64))
    assert len(cache) == 3
    with pytest.raises(tq.TurboQuantError, match="share"):
        cache.attend(gaussian(1, 3, 64))
    with pytest.raises(tq.TurboQuantError, match="unknown kernel"):
        cache.attend(gaussian(1, 2, 64), kernel="gpu")
    with pytest.raises(tq.TurboQuantError, match="window"):
        tq.KvCache(tq.Allocation.preset("k5v4"), 2, 64, capacity=4, window=2)


def test_absurd_sizes_are_errors_not_aborts():
    allocation = tq.Allocation.preset("k5v4")
    with pytest.raises(tq.TurboQuantError, match="1 TiB"):
        tq.KvCache(allocation, 8, 128, capacity=2**40)
    with pytest.raises(tq.TurboQuantError, match="1 TiB"):
        tq.ModelCache(allocation, 4, 8, 128, window=2**60)
    with pytest.raises(tq.TurboQuantError, match="out of range"):
        tq.KvCache(allocation, 2, 64, layer=4, num_layers=4)
    with pytest.raises(tq.TurboQuantError, match="exceeds the maximum"):
        tq.TqMse(2**30, 4, 1)
    with pytest.raises(tq.TurboQuantError):
        tq.QjlSketch("gaussian", 2**30, 1)


def test_sliding_window_cache():
    cache = tq.KvCache(tq.Allocation.preset("mse-k4v4"), 1, 64, window=4)
    cache.append(gaussian(10, 1, 64), gaussian(10, 1, 64))
    assert len(cache) == 10
    np.testing.assert_array_equal(cache.positions(), np.arange(6, 10))


def test_model_cache_forward_and_memory():
    cache = tq.ModelCache(tq.Allocation.preset("rec4.25"), 3, 1, 64)
    for _ in range(2):  # two chunks
        for layer in range(3):
            out = cache.forward_layer(layer, gaussian(4, 3, 64), gaussian(4, 1, 64), gaussian(4, 1, 64))
            assert out.shape == (4, 3, 64)
    assert len(cache) == 8
    memory = cache.memory()
    assert [m["name"] for m in memory] == ["blk.0.kv", "blk.1.kv", "blk.2.kv"]
    assert all(m["formula_bytes"] == m["allocated_bytes"] for m in memory)
    assert cache.attend(1, gaussian(2, 3, 64)).shape == (2, 3, 64)
    cache.truncate(5)
    assert len(cache) == 5
    cache.reset()
    assert len(cache) == 0
    with pytest.raises(tq.TurboQuantError, match="layer 3"):
        cache.attend(3, gaussian(1, 1, 64))
    with pytest.raises(tq.TurboQuantError, match=r"\[4, q_heads, 64\]"):
        cache.forward_layer(0, gaussian(3, 1, 64), gaussian(4, 1, 64), gaussian(4, 1, 64))


def test_model_cache_append_then_attend_equals_forward_layer():
    allocation = tq.Allocation.preset("rec4.25")
    written, forwarded = tq.ModelCache(allocation, 2, 1, 64), tq.ModelCache(allocation, 2, 1, 64)
    q, k, v = gaussian(5, 2, 64), gaussian(5, 1, 64), gaussian(5, 1, 64)
    for layer in range(2):
        written.append(layer, k, v)
        out = forwarded.forward_layer(layer, q, k, v)
        # The last query sees every token in both caches: the same attention, bit for bit.
        np.testing.assert_array_equal(written.attend(layer, q[-1:]), out[-1:])
    assert len(written) == 5
    with pytest.raises(tq.TurboQuantError, match="layer 2"):
        written.append(2, k, v)
    with pytest.raises(tq.TurboQuantError, match="values hold 4"):
        written.append(0, gaussian(5, 1, 64), gaussian(4, 1, 64))


def test_stub_file_names_every_public_name():
    stub = (Path(tq.__file__).parent / "_turboquant.pyi").read_text()
    for name in tq.__all__:
        assert name in stub, name
