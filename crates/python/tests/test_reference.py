"""The bindings return the Rust API's bits on the inputs of tests/data/reference.json.

The document is written by crates/python/tests/reference_fixture.rs from the library crates'
own per-vector calls, and that Rust test checks on every `cargo test` that the file still
equals what the Rust API returns; here the same inputs go through `turboquant`.
"""

import numpy as np
import pytest

import turboquant as tq
from conftest import assert_same_bits, decode_array


def test_provenance_is_recorded(reference):
    assert "reference_fixture.rs" in reference["provenance"]


def test_codebooks(reference):
    x = decode_array(reference["inputs"]["x"])
    for case in reference["codebooks"]:
        book = tq.LloydMaxCodebook(case["dim"], case["bits"], law=case["law"])
        assert_same_bits(book.centroids_f32, decode_array(case["centroids_f32"]))
        assert_same_bits(book.thresholds_f32, decode_array(case["thresholds_f32"]))
        assert book.unit_vector_distortion == case["unit_vector_distortion"]
        codes = book.quantize(x.reshape(-1))
        assert_same_bits(codes, decode_array(case["codes"]))
        assert_same_bits(book.dequantize(codes), decode_array(case["dequantized"]))


@pytest.mark.parametrize("index", range(4))
def test_rotations(reference, index):
    case = reference["rotations"][index]
    rotation = tq.Rotation(case["kind"], case["dim"], case["seed"])
    x = decode_array(case["x"])
    assert_same_bits(rotation.apply(x), decode_array(case["apply"]))
    assert_same_bits(rotation.apply_inverse(x), decode_array(case["apply_inverse"]))


def test_qjl_sketch(reference):
    case = reference["qjl"]
    x = decode_array(reference["inputs"]["x"])
    sketch = tq.QjlSketch(case["kind"], case["dim"], case["seed"])
    bits, gamma = sketch.encode(x)
    assert_same_bits(bits, decode_array(case["bits"]))
    assert_same_bits(gamma, decode_array(case["gamma"]))
    projected = sketch.project(decode_array(case["queries"]))
    assert_same_bits(projected, decode_array(case["projected"]))
    estimates = sketch.estimate_inner_products(projected, bits, gamma)
    assert_same_bits(estimates, decode_array(case["estimates"]))
    assert_same_bits(sketch.reconstruct(bits, gamma), decode_array(case["reconstructed"]))


@pytest.mark.parametrize("index", range(3))
def test_mse_codecs(reference, index):
    case = reference["mse"][index]
    x = decode_array(reference["inputs"]["x"])
    queries = decode_array(reference["inputs"]["queries"])
    if case["debiased"]:
        codec = tq.DebiasedMse(case["dim"], case["bits"], case["seed"], rotation=case["rotation"])
    else:
        codec = tq.TqMse(
            case["dim"],
            case["bits"],
            case["seed"],
            rotation=case["rotation"],
            norm_correction=case["norm_correction"],
        )
    words, norms = codec.encode(x)
    assert_same_bits(words, decode_array(case["words"]))
    assert_same_bits(norms, decode_array(case["norms"]))
    assert_same_bits(codec.decode(words, norms), decode_array(case["decoded"]))
    scores = codec.inner_products(queries, words, norms)
    assert_same_bits(scores, decode_array(case["inner_products"]))


@pytest.mark.parametrize("index", range(3))
def test_prod_codecs(reference, index):
    case = reference["prod"][index]
    x = decode_array(reference["inputs"]["x"])
    queries = decode_array(reference["inputs"]["queries"])
    rotation = "haar" if case["sketch"] == "gaussian" else "hadamard"
    codec = tq.TqProd(
        case["dim"],
        case["bits"],
        case["seed"],
        sketch=case["sketch"],
        rotation=rotation,
        shrinkage=case["shrinkage"],
    )
    codes = codec.encode(x)
    for got, name in zip(codes, ["words", "norms", "signs", "gammas"]):
        assert_same_bits(got, decode_array(case[name]))
    assert_same_bits(codec.decode(*codes), decode_array(case["decoded"]))
    assert_same_bits(codec.inner_products(queries, *codes), decode_array(case["inner_products"]))


@pytest.mark.parametrize("kernel", ["reference", "fused-scalar"])
def test_kv_cache_attention(reference, kernel):
    case = reference["kv_cache"]
    allocation = tq.Allocation.preset(case["allocation"])
    cache = tq.KvCache(
        allocation,
        case["kv_heads"],
        case["head_dim"],
        layer=case["layer"],
        num_layers=case["num_layers"],
    )
    cache.append(
        decode_array(case["keys"]), decode_array(case["values"]), decode_array(case["positions"])
    )
    assert cache.bytes_per_token == case["bytes_per_token"]
    out = cache.attend(
        decode_array(case["queries"]),
        positions=decode_array(case["query_positions"]),
        scale=case["scale"],
        kernel=kernel,
    )
    assert_same_bits(out, decode_array(case["outputs"][kernel]))


def test_model_cache_forward(reference):
    case = reference["model_cache"]
    cache = tq.ModelCache(
        tq.Allocation.preset(case["allocation"]),
        case["num_layers"],
        case["kv_heads"],
        case["head_dim"],
    )
    assert cache.bytes_per_token == case["bytes_per_token"]
    for step in case["steps"]:
        out = cache.forward_layer(
            step["layer"],
            decode_array(step["queries"]),
            decode_array(step["keys"]),
            decode_array(step["values"]),
            positions=decode_array(step["positions"]),
            scale=case["scale"],
            kernel=case["kernel"],
        )
        assert_same_bits(out, decode_array(step["output"]))


def test_allocation_bits_per_value(reference):
    case = reference["allocations"]
    shape = (case["num_layers"], case["num_kv_heads"], case["head_dim"])
    assert sorted(case["bits_per_value"]) == sorted(tq.Allocation.preset_names())
    for name, bits in case["bits_per_value"].items():
        allocation = tq.Allocation.preset(name)
        assert allocation.bits_per_value(*shape, stream="key") == bits["key"]
        assert allocation.bits_per_value(*shape, stream="value") == bits["value"]
        assert allocation.bits_per_value(*shape) == (bits["key"] + bits["value"]) / 2


def test_results_do_not_depend_on_batch_size(reference):
    """A row's code is a function of that row alone, whatever the batch around it."""
    x = decode_array(reference["inputs"]["x"])
    codec = tq.TqProd(64, 5, 7)
    whole = codec.encode(x)
    for i in range(len(x)):
        single = codec.encode(x[i : i + 1])
        for a, b in zip(single, whole):
            assert_same_bits(a, b[i : i + 1])
