"""QSGD's own Elias coding of its levels against the package's generic lossless coders.

A real gradient: the wide CNN (``wide-cnn``, D = 857,738) on Fashion-MNIST when
``/usr/share/datasets/fashion-mnist`` holds the IDX files (else the digits MLP, D = 9,610),
trained by plain SGD (batch 32, lr 0.05, seed 0) for ``--steps`` steps; then the minibatch
gradients of ``--grads`` fresh minibatches at that point. Each is quantized by the package's
``qsgd`` codec (bucket 512; levels 1, 4 and 7: 2-, 4- and 4-bit fixed-length codes), with
rounding seed ``1 + i`` for gradient ``i``, and its bits per coordinate are reported:

* ``fixed``: the payload as the codec makes it (packed codes + one float32 norm per bucket);
* ``zlib`` / ``lzma`` / ``zstd``: after the generic lossless stage
  (:func:`dq_flower.codecs.lossless.pack`, codes and norms as one stream, applied only
  where it shrinks the payload: what is actually sent);
* ``elias g/g``, ``o/o``, ``d/g``: QSGD's Elias coding (``benchmarks/elias.py``)
  with gamma, omega (the paper's recursive code) or delta gaps and gamma or omega
  magnitudes: norms + gaps + signs + magnitudes, exact bits;
* ``H0``: the codes' zero-order empirical entropy plus the norms, for reference (what an
  ideal per-symbol coder with a free, exact code table would reach).

Every value is the median over the gradients; each Elias stream of the first gradient is
decoded and checked against the quantized levels.

Usage::

    python benchmarks/qsgd_coding.py              # wide CNN on Fashion-MNIST (about a minute)
    python benchmarks/qsgd_coding.py --grads 1 --steps 10
"""

from __future__ import annotations

import argparse
import time

import elias  # benchmarks/elias.py, next to this script
import numpy as np
import torch

from dq_flower.codecs import entropy, lossless, make
from dq_flower.harness.runtime import build_model, task_info
from dq_flower.harness.task_config import TaskConfig
from dq_flower.harness.tasks.data import load_dataset_cached
from dq_flower.model_ops import get_flat, set_flat, weighted_loss_grad

LEVELS = (1, 4, 7)  # 2s + 1 code values: 2-, 4- and 4-bit fixed-length codes
BUCKET = 512
#: Elias variants: (column, gap code, magnitude code).
ELIAS = (("elias g/g", "gamma", "gamma"), ("elias o/o", "omega", "omega"),
         ("elias d/g", "delta", "gamma"))


def gradients(steps: int, count: int, lr: float = 0.05, seed: int = 0
              ) -> tuple[str, list[np.ndarray]]:
    """``count`` minibatch gradients after ``steps`` SGD steps; and the task's label."""
    torch.manual_seed(seed)
    try:
        task = TaskConfig(dataset="fmnist", model="wide-cnn", seed=seed)
        info = task_info(task)
        label = "wide-cnn on Fashion-MNIST"
    except FileNotFoundError:
        task = TaskConfig(dataset="digits", model="mlp", seed=seed)
        info = task_info(task)
        label = "digits MLP (Fashion-MNIST not found)"
    model = build_model(task, info)
    ds = load_dataset_cached(task.dataset, None, seed)
    x, y = ds.train_x, ds.train_y
    rng = np.random.default_rng(seed)
    w = get_flat(model)
    batch = np.full(32, 1 / 32)
    for _ in range(steps):
        idx = rng.choice(x.shape[0], 32, replace=False)
        _, g = weighted_loss_grad(model, x[idx], y[idx], batch)
        w = w - np.float32(lr) * g
        set_flat(model, w)
    grads = []
    for _ in range(count):
        idx = rng.choice(x.shape[0], 32, replace=False)
        grads.append(weighted_loss_grad(model, x[idx], y[idx], batch)[1].astype(np.float32))
    return label, grads


def entropy_bits(codes: np.ndarray, nb: int) -> float:
    """Zero-order empirical entropy of ``codes`` in bits, plus 32 bits per norm."""
    counts = np.bincount(codes)
    prob = counts[counts > 0] / codes.size
    return float(-(counts[counts > 0] * np.log2(prob)).sum()) + 32 * nb


def measure(x: np.ndarray, levels: int, seed: int, check: bool) -> dict[str, float]:
    """Bits per coordinate of each coder for one quantized gradient."""
    codec = make("qsgd", levels=levels, bucket=BUCKET)
    p = codec.encode(x, np.random.default_rng(seed))
    dim = x.size
    out = {"fixed": p.nbits / dim}
    for coder in ("zlib", "lzma", "zstd"):
        if coder in entropy.available():
            packed = lossless.pack(p, coder)
            if check:
                assert np.array_equal(codec.decode(lossless.unpack(packed, coder)),
                                      codec.decode(p))
            out[coder] = packed.nbits / dim
    q, norms, _, bucket = elias.payload_levels(p)
    for col, gap_code, mag_code in ELIAS:
        if check:
            stream, nbits = elias.encode_levels(q, norms, bucket, gap_code, mag_code)
            got, got_norms = elias.decode_levels(stream, nbits, dim, bucket, gap_code, mag_code)
            assert np.array_equal(got, q) and np.array_equal(got_norms, norms)
        else:
            nbits = elias.levels_nbits(q, bucket, gap_code, mag_code)
        out[col] = nbits / dim
    out["H0"] = entropy_bits((q + levels).astype(np.int64), norms.size) / dim
    out["nonzero"] = float(np.count_nonzero(q)) / dim
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30, help="SGD steps before measuring")
    parser.add_argument("--grads", type=int, default=5, help="gradients (medians over them)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    label, grads = gradients(args.steps, args.grads)
    dim = grads[0].size
    rows = []
    for levels in LEVELS:
        width = f"{make('qsgd', levels=levels).width} bit"
        runs = [measure(g, levels, 1 + i, check=i == 0) for i, g in enumerate(grads)]
        rows.append((levels, width, {k: float(np.median([r[k] for r in runs]))
                                     for k in runs[0]}))
    cols = [c for c in ("fixed", "zlib", "lzma", "zstd") if c in rows[0][2]]
    cols += [c for c, _, _ in ELIAS] + ["H0"]
    print(f"{label}, D = {dim:,}, after {args.steps} SGD steps (batch 32, lr 0.05, seed 0); "
          f"qsgd bucket {BUCKET}. Bits per coordinate, median of {len(grads)} minibatch "
          "gradients.\n")
    print("| qsgd | nonzero | " + " | ".join(cols) + " | best | Elias vs zlib |")
    print("|---|---:|" + "---:|" * len(cols) + "---|---:|")
    for levels, width, r in rows:
        coders = [c for c in cols if c not in ("fixed", "H0")]
        best = min(coders, key=lambda c: r[c])
        el = min((c for c, _, _ in ELIAS), key=lambda c: r[c])
        vs = 100 * (1 - r[el] / r["zlib"])
        print(f"| s={levels} ({width}) | {100 * r['nonzero']:.1f}% | "
              + " | ".join(f"{r[c]:.3f}" for c in cols)
              + f" | {best} | {el}: {vs:+.1f}% |")
    print("\n'Elias vs zlib': bits the best Elias variant saves over zlib-9 (negative: zlib "
          f"is smaller). Time {time.perf_counter() - t0:.0f} s.")


if __name__ == "__main__":
    main()
