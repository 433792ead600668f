"""The DQ store's bytes per sample and its minibatch decode rate, for a sample shape.

Quantizes ``--n`` random samples of ``--shape`` (values 0-255, like image pixels) with the
``uniform`` codec at ``--bits`` bits and per-sample ranges (DQ's default for images), lays
them out as the server's store does (:class:`~dq_flower.dq.server.store.RowLayout`), adds
them to a :class:`~dq_flower.dq.server.store.SampleStore` with labels of ``--classes``
classes, ids, weights and ``--clients`` origin clients, and prints the store's bytes per
sample (packed codes and per-row metadata), the float32 size it replaces, the projected
size of ``--project`` samples, and the median rate at which minibatches of ``--batch``
rows are drawn and dequantized.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/store_per_sample.py
        [--shape 3,224,224] [--bits 2] [--n 512] [--project 1281167]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time

import numpy as np

from dq_flower.codecs import make
from dq_flower.dq.server.store import RowLayout, SampleStore, StoredRows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="3,224,224")
    parser.add_argument("--bits", type=int, default=2)
    parser.add_argument("--n", type=int, default=512)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=1_000_000,
                        help="origin identities drawn up to this (sets the node column's width)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--project", type=int, default=1_281_167,
                        help="samples of the projected store (ImageNet-1k's training set)")
    args = parser.parse_args()
    shape = tuple(int(s) for s in args.shape.split(","))
    dim = math.prod(shape)
    rng = np.random.default_rng(0)
    layout = RowLayout(dim, args.bits)
    codec = make("uniform", bits=args.bits)
    codes, side, dither = [], [], []
    for start in range(0, args.n, 64):  # encode in chunks: float rows are never all held
        x = rng.integers(0, 256, (min(64, args.n - start), dim)).astype(np.float32)
        c, s, d = layout.rows(codec.encode(x, rng))
        codes.append(c)
        side.append(s)
        dither.append(d)
    store = SampleStore(layout.dequantize)
    store.add(StoredRows(
        codes=np.concatenate(codes), side=np.concatenate(side),
        labels=rng.integers(0, args.classes, args.n), weights=np.ones(args.n, np.float32),
        node=rng.integers(0, args.clients, args.n).astype(np.uint64),
        ids=rng.integers(0, 2**20, args.n), dither=np.concatenate(dither)))
    per_row = store.nbytes / args.n
    seconds = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        store.draw(args.batch, rng)
        seconds.append(time.perf_counter() - t0)
    rate = args.batch / statistics.median(seconds)
    print(f"shape {shape} (d = {dim:,}), {args.bits} bits, {args.n} samples, "
          f"{args.classes} classes")
    print(f"packed codes per sample: {layout.row_bytes:,} B; whole store per sample "
          f"(codes, ranges, label, weight, origin, id): {per_row:,.1f} B; float32 sample: "
          f"{4 * dim:,} B ({4 * dim / per_row:.1f}x)")
    print(f"{args.project:,} samples: {args.project * per_row / 1e9:,.1f} GB in the store "
          f"({args.project * 4 * dim / 1e9:,.0f} GB as float32)")
    print(f"minibatches of {args.batch} drawn and dequantized: {rate:,.0f} samples/s "
          f"(median of {args.repeats}, one thread)")


if __name__ == "__main__":
    sys.exit(main())
