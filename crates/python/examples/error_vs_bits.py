"""Quantize random and real keys with TurboQuant at 1..8 bits and plot the error against bits.

    python crates/python/examples/error_vs_bits.py [--keys FILE.npy] [--gguf FILE.gguf] [--out PNG]

Random keys: i.i.d. Gaussian vectors, d = 64. Real keys, in the first of these that exists:

1. ``--keys FILE.npy``: any float array ``[..., d]`` you dumped from your own model (e.g. the
   ``past_key_values`` of a Hugging Face model), flattened to ``[n, d]``;
2. the reference model's own layer-0 keys: SmolLM2-135M-Instruct (the GGUF that
   ``cargo xtask fetch-model`` puts in ``$TQ_MODEL_DIR`` or ``~/.cache/turboquant-rs/models``),
   read with the ``gguf`` package (``pip install gguf``). Layer 0 sees only the token
   embedding, so its keys are exactly ``W_k · rmsnorm(embedding(token))`` (before RoPE, which
   rotates pairs of channels and keeps norms): computed here for 4096 tokens of the vocabulary,
   3 KV heads of 64 channels each.

Prints, per bit width, the relative MSE ``E‖x − x̃‖² / ‖x‖²`` of TQ_mse beside the codebook's
``D_mse`` and the lower bound ``4^−b``, and the relative RMS error of TQ_prod's inner-product
estimates; with matplotlib installed, writes the plot to ``--out``.
"""

import argparse
import os
from pathlib import Path

import numpy as np

import turboquant as tq

MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def model_dir():
    override = os.environ.get("TQ_MODEL_DIR")
    if override:
        return Path(override)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "turboquant-rs" / "models"


def reference_model_keys(path, tokens=4096):
    """Layer-0 keys of SmolLM2 for `tokens` vocabulary entries, [tokens · kv_heads, head_dim]."""
    import gguf  # optional: pip install gguf

    reader = gguf.GGUFReader(str(path))
    tensors = {t.name: t for t in reader.tensors}

    def weight(name):
        t = tensors[name]
        return gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)

    def field(key):
        f = reader.fields[key]
        return f.parts[f.data[0]][0]

    embedding = weight("token_embd.weight")  # [vocab, hidden]
    ids = np.linspace(0, embedding.shape[0] - 1, tokens).astype(int)
    h = embedding[ids]
    eps = float(field("llama.attention.layer_norm_rms_epsilon"))
    h = h / np.sqrt((h * h).mean(axis=1, keepdims=True) + eps) * weight("blk.0.attn_norm.weight")
    keys = h @ weight("blk.0.attn_k.weight").T  # [tokens, kv_heads · head_dim]
    head_dim = int(field("llama.rope.dimension_count"))
    return np.ascontiguousarray(keys.reshape(-1, head_dim), dtype=np.float32)


def real_keys(args):
    if args.keys:
        keys = np.load(args.keys)
        return keys.reshape(-1, keys.shape[-1]).astype(np.float32), f"keys from {args.keys}"
    path = Path(args.gguf) if args.gguf else model_dir() / MODEL_FILE
    if not path.exists():
        print(f"no real keys: {path} is missing (cargo xtask fetch-model fetches it)")
        return None, None
    try:
        return reference_model_keys(path), "SmolLM2-135M layer-0 keys"
    except ImportError:
        print("no real keys: reading the GGUF needs the gguf package (pip install gguf)")
        return None, None


def errors(x, seed=1):
    """Per bit width: (relative MSE of TQ_mse, codebook D_mse, relative RMS error of TQ_prod)."""
    d = x.shape[1]
    rng = np.random.default_rng(seed)
    queries = rng.standard_normal((64, d)).astype(np.float32)
    exact = queries @ x.T
    rows = []
    for bits in range(1, 9):
        mse = tq.TqMse(d, bits, seed)
        x_hat = mse.decode(*mse.encode(x))
        relative = float((((x - x_hat) ** 2).sum(axis=1) / (x * x).sum(axis=1)).mean())
        prod_error = float("nan")
        if bits >= 2:
            prod = tq.TqProd(d, bits, seed)
            estimate = prod.inner_products(queries, *prod.encode(x))
            prod_error = float(np.sqrt(((estimate - exact) ** 2).mean() / (exact**2).mean()))
        rows.append((bits, relative, mse.codebook.unit_vector_distortion, prod_error))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keys", help="a .npy array [..., d] of your own keys")
    parser.add_argument("--gguf", help=f"the reference model file (default: {MODEL_FILE} in the model cache)")
    parser.add_argument("--out", default="error_vs_bits.png", help="where to write the plot")
    args = parser.parse_args()

    sets = {"random Gaussian keys, d = 64": np.random.default_rng(0).standard_normal((4096, 64)).astype(np.float32)}
    keys, label = real_keys(args)
    if keys is not None:
        sets[f"{label}, d = {keys.shape[1]}"] = keys

    results = {}
    for label, x in sets.items():
        results[label] = rows = errors(x)
        print(f"\n{label}: {x.shape[0]} vectors")
        print(f"{'bits':>4} {'TQ_mse rel. MSE':>16} {'D_mse (codebook)':>17} {'4^-b':>9} {'TQ_prod rel. RMS':>17}")
        for bits, relative, d_mse, prod in rows:
            print(f"{bits:>4} {relative:16.5f} {d_mse:17.5f} {4.0**-bits:9.5f} {prod:17.4f}")

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("\nmatplotlib is not installed: no plot (pip install matplotlib)")
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    bits = np.arange(1, 9)
    for label, rows in results.items():
        ax.semilogy(bits, [r[1] for r in rows], "o-", label=f"TQ_mse: {label}")
    ax.semilogy(bits, [r[2] for r in next(iter(results.values()))], "k:", label="D_mse (codebook)")
    ax.semilogy(bits, 4.0**-bits, "k--", label="lower bound 4^-b")
    ax.set_xlabel("bits per coordinate")
    ax.set_ylabel("relative MSE  E‖x − x̃‖² / ‖x‖²")
    ax.legend(fontsize=7)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
