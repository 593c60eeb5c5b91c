"""Encode throughput: turboquant from Python, the same Rust code without Python, and a numpy peer.

    cargo xtask bench python                      # builds the wheel in a temporary venv, runs this
    python crates/python/bench/bench_encode.py [--n 4096] [--dim 128] [--bits 4] [--repeats 20]

Rows (vectors per second, best of --repeats runs, on batches of --n float32 vectors):

- ``numpy peer``: a faithful numpy TurboQuant-MSE encode — normalize, rotate with a dense
  orthogonal matrix, ``searchsorted`` against the Lloyd-Max thresholds, pack the codes into
  uint32 words, keep the norms as float16 — with the Haar matrix of the Haar row's codec, so
  its codes can be checked against turboquant's (printed as the share that agree).
- ``turboquant (Python)``: ``TqMse.encode(x)`` timed from Python, input conversion and output
  arrays included (x is C-contiguous float32, so nothing is copied).
- ``Rust API (same code)``: ``_bench_rust_encode``, the batch loop that ``TqMse.encode`` runs,
  on preallocated outputs with no Python in the timed region; the target is Python within 10%
  of it. ``Rust API (1 thread)`` is the plain per-row ``encode_into`` loop on one thread.

Set RAYON_NUM_THREADS=1 for per-core numbers on the turboquant rows.
"""

import argparse
import os
import platform
import sys
import time

import numpy as np

import turboquant as tq


def best_seconds(fn, repeats):
    fn()  # warm up (codebook cache, page faults, thread pool)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


class NumpyPeer:
    """TurboQuant-MSE encode in numpy: the structure of the usual numpy reference code."""

    def __init__(self, rotation, thresholds, bits):
        self.rotation_t = np.ascontiguousarray(rotation.T.astype(np.float32))
        self.thresholds = thresholds.astype(np.float32)
        self.bits = bits
        dim = rotation.shape[0]
        self.per_word = 32 // bits if 32 % bits == 0 else None
        self.words = (dim * bits + 31) // 32
        if self.per_word is None:
            raise SystemExit("the numpy peer packs only bit widths that divide 32")
        self.shifts = (np.arange(self.per_word, dtype=np.uint32) * bits).astype(np.uint32)

    def encode(self, x):
        norms = np.linalg.norm(x, axis=1)
        unit = x / np.where(norms == 0, 1, norms)[:, None]
        rotated = unit @ self.rotation_t
        codes = np.searchsorted(self.thresholds, rotated, side="left").astype(np.uint32)
        grouped = codes.reshape(len(x), self.words, self.per_word)
        words = np.bitwise_or.reduce(grouped << self.shifts, axis=2)
        return words, norms.astype(np.float16)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=4096, help="vectors per batch")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--bits", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()

    rng = np.random.default_rng(args.seed)
    x = rng.standard_normal((args.n, args.dim), dtype=np.float32)
    hadamard = tq.TqMse(args.dim, args.bits, args.seed, rotation="hadamard")
    haar = tq.TqMse(args.dim, args.bits, args.seed, rotation="haar")
    peer = NumpyPeer(haar.rotation.to_dense(), haar.codebook.thresholds_f32, args.bits)

    # The peer is faithful: with turboquant's own Haar matrix it gives turboquant's codes, up to
    # the rare coordinate whose rounding differs right at a threshold.
    peer_words, peer_norms = peer.encode(x)
    tq_words, tq_norms = haar.encode(x)
    shifts = np.arange(32 // args.bits, dtype=np.uint32) * args.bits
    mask = np.uint32((1 << args.bits) - 1)
    agree = ((peer_words[..., None] >> shifts) & mask) == ((tq_words[..., None] >> shifts) & mask)

    conversions = tq._conversions()
    rows = []
    seconds = best_seconds(lambda: peer.encode(x), args.repeats)
    rows.append(("numpy peer (dense Haar)", seconds))
    for name, codec in [("hadamard", hadamard), ("haar", haar)]:
        # Interleaved, so a load that comes and goes (other processes) hits every row alike.
        codec.encode(x)
        py = rust = single = float("inf")
        for _ in range(args.repeats):
            start = time.perf_counter()
            codec.encode(x)
            py = min(py, time.perf_counter() - start)
            rust = min(rust, tq._bench_rust_encode(codec, x, repeats=1))
            single = min(single, tq._bench_rust_encode(codec, x, repeats=1, sequential=True))
        rows.append((f"turboquant (Python), {name}", py))
        rows.append((f"Rust API (same code), {name}", rust))
        rows.append((f"Rust API (1 thread), {name}", single))
    copies = tq._conversions() - conversions

    print(
        f"TQ_mse encode, d = {args.dim}, b = {args.bits}, batches of {args.n} float32 vectors, "
        f"best of {args.repeats}; {tq.num_threads()} rayon thread(s), {os.cpu_count()} CPU(s), "
        f"numpy {np.__version__}, Python {platform.python_version()}"
    )
    print(f"{'':34} {'ms / batch':>11} {'M vectors/s':>12}")
    for name, s in rows:
        print(f"{name:34} {s * 1e3:11.3f} {args.n / s / 1e6:12.3f}")
    by_name = dict(rows)
    print()
    for name in ["hadamard", "haar"]:
        py = by_name[f"turboquant (Python), {name}"]
        rust = by_name[f"Rust API (same code), {name}"]
        print(
            f"{name:9} Python / Rust-API throughput: {rust / py:.3f} "
            f"({'within' if rust / py >= 0.9 else 'OUTSIDE'} the 10% target); "
            f"turboquant / numpy peer: {by_name['numpy peer (dense Haar)'] / py:.1f}x"
        )
    print(
        f"input copies during the timed Python calls: {copies} (C-contiguous float32 input); "
        f"peer codes equal to turboquant's (same Haar matrix): {agree.mean() * 100:.4f}%, "
        f"norms equal: {(peer_norms == tq_norms).mean() * 100:.2f}%"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
