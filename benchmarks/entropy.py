"""What lossless coding saves on real payloads: bits per coordinate before and after.

The digits MLP (64-128-10, D = 9,610) is trained by plain SGD (batch 32, lr 0.1, seed 0)
for ``--steps`` steps on scikit-learn's digits; then every codec encodes (with the
baselines' parameters and the same seeded generator) three real vectors:

* ``grad``: the minibatch gradient at that point (what the one-step baselines upload);
* ``delta``: one local epoch's pseudo-gradient ``(w0 - w) / (lr * steps)`` of a quarter of
  the training rows (what the ``fedavg-*`` methods upload);
* ``model``: the float32 weights themselves (the downlink; FedAvg's upload).

For each: the payload's exact bits per coordinate as the codec makes it, and after the
generic lossless stage of :mod:`dq_flower.codecs.lossless` with zlib (level 9) and lzma,
applied only where it shrinks the payload (the bits are what is actually sent).

Usage::

    python benchmarks/entropy.py              # markdown table
    python benchmarks/entropy.py --steps 200
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from dq_flower.codecs import make
from dq_flower.harness.runtime import build_model, task_info
from dq_flower.harness.task_config import TaskConfig
from dq_flower.harness.tasks.data import load_dataset_cached
from dq_flower.model_ops import get_flat, set_flat, weighted_loss_grad

#: (label, codec, parameters, vector): the baselines' own parameters.
CASES = [
    ("identity (float32)", "identity", {}, "model"),
    ("identity (float32)", "identity", {}, "grad"),
    ("fp16", "fp16", {}, "model"),
    ("fp16", "fp16", {}, "delta"),
    ("qsgd s=4, bucket 512", "qsgd", {"levels": 4, "bucket": 512}, "grad"),
    ("qsgd s=1 (2 bit), bucket 512", "qsgd", {"levels": 1, "bucket": 512}, "delta"),
    ("qsgd s=7 (4 bit), bucket 512", "qsgd", {"levels": 7, "bucket": 512}, "delta"),
    ("terngrad", "terngrad", {}, "grad"),
    ("orq s=3, bucket 512", "orq", {"levels": 3, "bucket": 512}, "grad"),
    ("sign", "sign", {}, "grad"),
    ("ef-sign", "ef-sign", {}, "grad"),
    ("ef-sign", "ef-sign", {}, "delta"),
    ("topk 1%", "topk", {"ratio": 0.01}, "grad"),
    ("topk 1%", "topk", {"ratio": 0.01}, "delta"),
    ("powersgd rank 2 (flat)", "powersgd", {"rank": 2}, "grad"),
    ("bingrad, bucket 512", "bingrad", {"bucket": 512}, "grad"),
]
CODERS = ("zlib", "lzma")


def vectors(steps: int, seed: int = 0) -> dict[str, np.ndarray]:
    """The gradient, one-epoch pseudo-gradient and weights after ``steps`` SGD steps."""
    torch.manual_seed(seed)
    task = TaskConfig(dataset="digits", model="mlp", seed=seed)
    model = build_model(task, task_info(task))
    ds = load_dataset_cached("digits", None, seed)
    x, y = ds.train_x, ds.train_y
    rng = np.random.default_rng(seed)
    w = get_flat(model)
    for _ in range(steps):
        idx = rng.choice(x.shape[0], 32, replace=False)
        _, g = weighted_loss_grad(model, x[idx], y[idx], np.full(32, 1 / 32))
        w = w - np.float32(0.1) * g
        set_flat(model, w)
    idx = rng.choice(x.shape[0], 32, replace=False)
    _, grad = weighted_loss_grad(model, x[idx], y[idx], np.full(32, 1 / 32))
    rows = rng.permutation(x.shape[0])[: x.shape[0] // 4]
    w0, wl, n = w.copy(), w.copy(), 0
    for start in range(0, rows.size, 32):
        b = rows[start:start + 32]
        _, g = weighted_loss_grad(model, x[b], y[b], np.full(b.size, 1 / b.size))
        wl = wl - np.float32(0.1) * g
        set_flat(model, wl)
        n += 1
    delta = ((w0 - wl) / np.float32(0.1 * n)).astype(np.float32)
    return {"grad": grad.astype(np.float32), "delta": delta, "model": w0.astype(np.float32)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=100, help="SGD steps before measuring")
    args = parser.parse_args()
    vecs = vectors(args.steps)
    dim = vecs["grad"].size
    print(f"Digits MLP, D = {dim:,}, after {args.steps} SGD steps (seed 0). Bits per "
          "coordinate as sent.\n")
    print("| codec | vector | as coded | + zlib | + lzma | zlib saves |")
    print("|---|---|---:|---:|---:|---:|")
    for label, name, params, kind in CASES:
        x = vecs[kind]
        bits = {"none": make(name, **params).encode(x, np.random.default_rng(1)).nbits}
        for coder in CODERS:
            codec = make(name, entropy=coder, **params)
            p = codec.encode(x, np.random.default_rng(1))
            assert np.array_equal(codec.decode(p),
                                  make(name, **params).decode(
                                      make(name, **params).encode(x, np.random.default_rng(1))))
            bits[coder] = p.nbits
        saved = 1 - bits["zlib"] / bits["none"]
        print(f"| {label} | {kind} | {bits['none'] / dim:.3f} | {bits['zlib'] / dim:.3f} | "
              f"{bits['lzma'] / dim:.3f} | {100 * saved:.0f}% |")


if __name__ == "__main__":
    main()
