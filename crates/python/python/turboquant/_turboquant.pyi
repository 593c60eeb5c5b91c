"""Type stubs for the native part of ``turboquant`` (built from crates/python/src by maturin).

Array arguments accept anything ``numpy.asarray`` does. A C-contiguous, aligned array of the
stated dtype (float32 for vectors, uint32 for packed words, float16 for stored norms) is read in
place; anything else is converted once. Every error raises :class:`TurboQuantError`.
"""

import os
from typing import Any, Literal, Optional, Tuple, Union

import numpy as np
import numpy.typing as npt

ArrayLike = npt.ArrayLike
F32 = npt.NDArray[np.float32]
F64 = npt.NDArray[np.float64]
F16 = npt.NDArray[np.float16]
U32 = npt.NDArray[np.uint32]
U8 = npt.NDArray[np.uint8]

RotationKind = Literal["haar", "hadamard"]
SketchKind = Literal["gaussian", "haar", "hadamard"]
SketchScale = Literal["paper", "asymptotic", "exact"]
Law = Literal["beta", "gaussian"]
Stream = Literal["key", "value"]
Kernel = Literal["fused", "fused-scalar", "reference", "llamacpp-f16"]

class TurboQuantError(ValueError):
    """Any error the Rust library reports; the message is the Rust error's."""

class LloydMaxCodebook:
    """MSE-optimal scalar quantizer for one coordinate of a randomly rotated unit vector.

    ``law="beta"``: the exact law ``(1 - t²)^((dim - 3)/2)`` (``dim >= 3``); ``"gaussian"``: its
    limit ``N(0, 1/dim)``. ``bits`` in 1..=8. Solved once per process per (law, dim, bits).
    """

    def __init__(self, dim: int, bits: int, law: Law = "beta") -> None: ...
    @property
    def dim(self) -> int: ...
    @property
    def bits(self) -> int: ...
    @property
    def law(self) -> Law: ...
    @property
    def levels(self) -> int:
        """``2**bits``."""
    @property
    def centroids(self) -> F64:
        """The ``2**bits`` centroids, increasing, symmetric about 0."""
    @property
    def thresholds(self) -> F64:
        """The ``2**bits - 1`` midpoints between adjacent centroids."""
    @property
    def centroids_f32(self) -> F32:
        """The centroids rounded to float32 (what ``dequantize`` returns)."""
    @property
    def thresholds_f32(self) -> F32:
        """Thresholds rounded down to float32: ``searchsorted(thresholds_f32, x)`` is the code."""
    @property
    def mse_per_coordinate(self) -> float: ...
    @property
    def unit_vector_distortion(self) -> float:
        """``D_mse = dim * mse_per_coordinate``."""
    def quantize(self, x: ArrayLike) -> U8:
        """Codes (same shape as ``x``) of float32 values; NaN raises, ±inf give the outer codes."""
    def dequantize(self, codes: ArrayLike) -> F32:
        """The float32 centroid of every code (uint8, each ``< levels``)."""

class Rotation:
    """A seeded random orthogonal ``dim × dim`` matrix Π: a pure function of (kind, dim, seed)."""

    def __init__(self, kind: RotationKind, dim: int, seed: int) -> None: ...
    @property
    def kind(self) -> RotationKind: ...
    @property
    def dim(self) -> int: ...
    @property
    def seed(self) -> int: ...
    def apply(self, x: ArrayLike) -> F32:
        """``Π·x`` for every row of float32 ``[n, dim]`` (finite values only)."""
    def apply_inverse(self, x: ArrayLike) -> F32:
        """``Πᵀ·x`` for every row of float32 ``[n, dim]``."""
    def to_dense(self) -> F64:
        """Π as a row-major float64 ``[dim, dim]`` matrix."""

class QjlSketch:
    """1-bit QJL sketch ``z = sign(S·r)``, ``γ = ‖r‖``, estimates ``α·γ·s·⟨S·y, z⟩``."""

    def __init__(
        self,
        kind: SketchKind,
        dim: int,
        seed: int,
        scale: Optional[SketchScale] = None,
        shrinkage: float = 1.0,
    ) -> None: ...
    @property
    def kind(self) -> SketchKind: ...
    @property
    def scale(self) -> SketchScale: ...
    @property
    def dim(self) -> int: ...
    @property
    def seed(self) -> int: ...
    @property
    def shrinkage(self) -> float: ...
    @property
    def words(self) -> int:
        """uint32 words per sketch, ``ceil(dim / 32)``."""
    @property
    def scale_factor(self) -> float: ...
    @property
    def gain(self) -> float: ...
    @property
    def bias_factor(self) -> Optional[float]: ...
    @property
    def mmse_shrinkage(self) -> Optional[float]: ...
    def encode(self, r: ArrayLike) -> Tuple[U32, F32]:
        """``(bits [n, words], gamma [n])`` for float32 ``[n, dim]`` residuals."""
    def project(self, y: ArrayLike) -> F32:
        """``S·y`` for every row of float32 ``[n, dim]``."""
    def estimate_inner_products(self, projected: ArrayLike, bits: ArrayLike, gamma: ArrayLike) -> F32:
        """Row-wise estimates ``[n]`` from ``project(y)``, ``bits`` and ``gamma``."""
    def reconstruct(self, bits: ArrayLike, gamma: ArrayLike) -> F32:
        """``r̂ = α·γ·s·Sᵀz`` for every row: float32 ``[n, dim]``."""

class TqMse:
    """TurboQuant-MSE: rotate, quantize each coordinate (Lloyd-Max), pack, keep the norm (f16)."""

    def __init__(
        self,
        dim: int,
        bits: int,
        seed: int,
        rotation: RotationKind = "hadamard",
        norm_correction: bool = False,
    ) -> None: ...
    @property
    def dim(self) -> int: ...
    @property
    def bits(self) -> int: ...
    @property
    def seed(self) -> int: ...
    @property
    def norm_correction(self) -> bool: ...
    @property
    def rotation(self) -> Rotation: ...
    @property
    def codebook(self) -> LloydMaxCodebook: ...
    @property
    def words_per_vector(self) -> int: ...
    @property
    def bytes_per_vector(self) -> int: ...
    def encode(self, x: ArrayLike) -> Tuple[U32, F16]:
        """``(words [n, words_per_vector], norms [n])`` for float32 ``[n, dim]``."""
    def decode(self, words: ArrayLike, norms: ArrayLike) -> F32:
        """The reconstructions, float32 ``[n, dim]``."""
    def inner_products(self, queries: ArrayLike, words: ArrayLike, norms: ArrayLike) -> F32:
        """``⟨q_i, x̃_j⟩`` for queries ``[m, dim]`` and ``n`` codes: float32 ``[m, n]``."""

class DebiasedMse:
    """TQ_mse codes scored through ``⟨q, x̃⟩ / (1 - D_mse(bits))`` (unbiased)."""

    def __init__(self, dim: int, bits: int, seed: int, rotation: RotationKind = "hadamard") -> None: ...
    @property
    def dim(self) -> int: ...
    @property
    def bits(self) -> int: ...
    @property
    def seed(self) -> int: ...
    @property
    def correction(self) -> float: ...
    @property
    def codec(self) -> TqMse: ...
    @property
    def words_per_vector(self) -> int: ...
    @property
    def bytes_per_vector(self) -> int: ...
    def encode(self, x: ArrayLike) -> Tuple[U32, F16]: ...
    def decode(self, words: ArrayLike, norms: ArrayLike) -> F32: ...
    def inner_products(self, queries: ArrayLike, words: ArrayLike, norms: ArrayLike) -> F32: ...

class TqProd:
    """TurboQuant-prod: TQ_mse(bits - 1) plus a 1-bit QJL sketch of the residual (unbiased)."""

    def __init__(
        self,
        dim: int,
        bits: int,
        seed: int,
        sketch: SketchKind = "haar",
        rotation: RotationKind = "hadamard",
        norm_correction: bool = False,
        scale: Optional[SketchScale] = None,
        shrinkage: float = 1.0,
    ) -> None: ...
    @property
    def dim(self) -> int: ...
    @property
    def bits(self) -> int: ...
    @property
    def seed(self) -> int: ...
    @property
    def mse(self) -> TqMse: ...
    @property
    def sketch(self) -> QjlSketch: ...
    @property
    def words_per_vector(self) -> int: ...
    @property
    def sign_words_per_vector(self) -> int: ...
    @property
    def bytes_per_vector(self) -> int: ...
    def encode(self, x: ArrayLike) -> Tuple[U32, F16, U32, F16]:
        """``(words, norms, signs, gammas)`` for float32 ``[n, dim]``."""
    def decode(self, words: ArrayLike, norms: ArrayLike, signs: ArrayLike, gammas: ArrayLike) -> F32: ...
    def inner_products(
        self,
        queries: ArrayLike,
        words: ArrayLike,
        norms: ArrayLike,
        signs: ArrayLike,
        gammas: ArrayLike,
    ) -> F32:
        """Unbiased ``⟨q_i, x_j⟩`` estimates: float32 ``[m, n]``."""

class Allocation:
    """Codec, bits and seeds of every key and value stream of a model, from TOML."""

    @staticmethod
    def from_toml(source: Union[str, "os.PathLike[str]"]) -> "Allocation":
        """TOML text, or a path (an ``os.PathLike``, or a str naming an existing file)."""
    @staticmethod
    def preset(name: str) -> "Allocation": ...
    @staticmethod
    def load(name_or_path: Union[str, "os.PathLike[str]"]) -> "Allocation": ...
    @staticmethod
    def preset_names() -> list[str]: ...
    @staticmethod
    def recommended_names() -> list[str]: ...
    @staticmethod
    def preset_text(name: str) -> Optional[str]: ...
    @property
    def name(self) -> str: ...
    @property
    def description(self) -> Optional[str]: ...
    @property
    def seed(self) -> int: ...
    @property
    def sink_tokens(self) -> int: ...
    @property
    def recent_fp_tokens(self) -> int: ...
    @property
    def recent_fraction(self) -> Optional[float]: ...
    def to_toml(self) -> str: ...
    def bits_per_value(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        stream: Literal["key", "value", "both"] = "both",
    ) -> float:
        """Stored bits per value (codes, sign bits and f16 norms), averaged over the model."""
    def bytes_per_token(self, layer: int, num_layers: int, kv_head: int, head_dim: int, stream: Stream) -> int: ...
    def validate_for(self, num_layers: int, num_kv_heads: int, head_dim: int) -> None: ...

class KvCache:
    """The compressed key/value cache of one attention layer."""

    def __init__(
        self,
        allocation: Allocation,
        kv_heads: int,
        head_dim: int,
        layer: int = 0,
        num_layers: int = 1,
        capacity: Optional[int] = None,
        window: Optional[int] = None,
        max_rewind: int = 0,
    ) -> None: ...
    @property
    def kv_heads(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def bytes_per_token(self) -> int: ...
    @property
    def allocated_bytes(self) -> int: ...
    @property
    def formula_bytes(self) -> int: ...
    @property
    def fixed_bytes(self) -> int: ...
    def __len__(self) -> int: ...
    def append(self, keys: ArrayLike, values: ArrayLike, positions: Optional[ArrayLike] = None) -> None:
        """Keys / values float32 ``[n, kv_heads, head_dim]``; positions default to the next ones."""
    def attend(
        self,
        queries: ArrayLike,
        positions: Optional[ArrayLike] = None,
        scale: Optional[float] = None,
        kernel: Kernel = "fused",
    ) -> F32:
        """Attention of float32 ``[m, q_heads, head_dim]`` queries over the cache."""
    def positions(self) -> U32: ...
    def clear(self) -> None: ...
    def truncate(self, new_len: int) -> None: ...

class ModelCache:
    """The KV caches of every layer of a model, codecs from one allocation."""

    def __init__(
        self,
        allocation: Allocation,
        num_layers: int,
        kv_heads: int,
        head_dim: int,
        capacity: Optional[int] = None,
        window: Optional[int] = None,
    ) -> None: ...
    @property
    def num_layers(self) -> int: ...
    @property
    def bytes_per_token(self) -> int: ...
    @property
    def allocated_bytes(self) -> int: ...
    def __len__(self) -> int: ...
    def memory(self) -> list[dict[str, Any]]: ...
    def forward_layer(
        self,
        layer: int,
        queries: ArrayLike,
        keys: ArrayLike,
        values: ArrayLike,
        positions: Optional[ArrayLike] = None,
        scale: Optional[float] = None,
        kernel: Kernel = "fused",
    ) -> F32:
        """Write ``n`` tokens' keys / values into ``layer``, then attend with their queries."""
    def append(
        self,
        layer: int,
        keys: ArrayLike,
        values: ArrayLike,
        positions: Optional[ArrayLike] = None,
    ) -> None:
        """Write ``n`` tokens' keys / values into ``layer`` without attending."""
    def attend(
        self,
        layer: int,
        queries: ArrayLike,
        positions: Optional[ArrayLike] = None,
        scale: Optional[float] = None,
        kernel: Kernel = "fused",
    ) -> F32: ...
    def truncate(self, new_len: int) -> None: ...
    def reset(self) -> None: ...

def num_threads() -> int:
    """Threads the batch calls run on (rayon; ``RAYON_NUM_THREADS`` sets it at start-up)."""

def _conversions() -> int:
    """Inputs converted (copied) so far: not C-contiguous, aligned arrays of the right dtype."""

def _bench_rust_encode(codec: TqMse, x: ArrayLike, repeats: int = 5, sequential: bool = False) -> float:
    """Best seconds per batch of the Rust side of ``TqMse.encode`` alone (no Python)."""
