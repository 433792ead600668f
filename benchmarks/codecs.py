"""Codec benchmark: speed relative to ``np.copy``, compression rate and distortion.

For a float32 gradient-like vector (10M elements by default) and a data batch (60000 x 784,
Fashion-MNIST's training images when ``/usr/share/datasets/fashion-mnist`` has them, else
synthetic digit-like images), each codec's encode and decode time is reported as a ratio
to ``np.copy`` of the same input, measured interleaved in the same run (median of
``--reps`` repetitions of copy, encode, decode). Also: compression rate (uncompressed float32
bytes / exact payload bytes ``nbits / 8``) and relative error ``||x - x_hat|| / ||x||``.

Targets (issue 2): encode + decode within 5x of a copy for ``uniform``, ``sign`` and
``ef-sign``, within 20x for the other codecs. The last column says whether each is met.

Usage::

    python benchmarks/codecs.py              # full size (about a minute or two)
    python benchmarks/codecs.py --quick      # small inputs, 3 repetitions (CI smoke run)
    python benchmarks/codecs.py --size 1000000 --rows 10000 --reps 7
    python benchmarks/codecs.py --clock cpu  # CPU time: steadier when other jobs run
"""

from __future__ import annotations

import argparse
import gzip
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dq_flower.codecs import make

FMNIST = Path("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz")

# (label, codec name, params, input kind, target ratio or None for informational rows)
CASES = [
    ("identity", "identity", {}, "grad", 20),
    ("fp16", "fp16", {}, "grad", 20),
    ("qsgd s=7 (4 bit), bucket 128", "qsgd", {"levels": 7, "bucket": 128}, "grad", 20),
    ("qsgd s=1 (2 bit), bucket 512", "qsgd", {"levels": 1, "bucket": 512}, "grad", 20),
    ("terngrad", "terngrad", {}, "grad", 20),
    ("sign", "sign", {}, "grad", 5),
    ("ef-sign", "ef-sign", {}, "grad", 5),
    ("topk 1%", "topk", {"ratio": 0.01}, "grad", 20),
    ("powersgd rank 2", "powersgd", {"rank": 2}, "grad", 20),
    ("bingrad, bucket 512", "bingrad", {"bucket": 512, "iters": 3}, "grad", 20),
    ("orq s=3 (2 bit), bucket 512", "orq", {"levels": 3, "bucket": 512}, "grad", 20),
    ("orq s=7 (3 bit), bucket 512", "orq", {"levels": 7, "bucket": 512}, "grad", 20),
    ("uniform 2 bit, stochastic", "uniform", {"bits": 2}, "data", 5),
    ("uniform 2 bit, nearest", "uniform", {"bits": 2, "stochastic": False}, "data", 5),
    ("uniform 4 bit, stochastic", "uniform", {"bits": 4}, "data", 5),
    ("uniform 2 bit, dither", "uniform", {"bits": 2, "dither_seed": 1}, "data", 5),
    ("uniform 2 bit + zlib", "uniform", {"bits": 2, "entropy": "zlib"}, "data", None),
]


def gradient_vector(size: int, seed: int = 0) -> np.ndarray:
    """Heavy-tailed, gradient-like float32 values: Gaussian times a log-normal scale."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(size, dtype=np.float32)
    x *= np.exp(rng.standard_normal(size, dtype=np.float32))
    x *= np.float32(1e-3)
    return x


def synthetic_images(rows: int, seed: int = 0) -> np.ndarray:
    """Digit-like 28x28 images in [0, 1]: three soft strokes on a zero background."""
    rng = np.random.default_rng(seed)
    grid = np.arange(28, dtype=np.float32)
    img = np.zeros((rows, 28, 28), dtype=np.float32)
    for _ in range(3):  # three blobs per image, vectorised over images
        cy, cx = (rng.uniform(7, 21, (2, rows, 1, 1))).astype(np.float32)
        r2 = rng.uniform(4, 25, (rows, 1, 1)).astype(np.float32)
        img += np.exp(-((grid[None, :, None] - cy) ** 2 + (grid[None, None, :] - cx) ** 2) / r2)
    img = np.clip(img, 0, 1)
    img[img < 0.1] = 0.0
    return (np.round(img * 255) / 255).reshape(rows, 784).astype(np.float32)


def data_batch(rows: int) -> tuple[np.ndarray, str]:
    """The first ``rows`` Fashion-MNIST training images scaled to [0, 1], or synthetic ones."""
    if FMNIST.exists():
        with gzip.open(FMNIST, "rb") as fh:
            head = fh.read(16)
            count = int.from_bytes(head[4:8], "big")
            if rows <= count:
                raw = fh.read(rows * 784)
                images = np.frombuffer(raw, dtype=np.uint8).reshape(rows, 784)
                return images.astype(np.float32) / np.float32(255), "Fashion-MNIST"
    return synthetic_images(rows), "synthetic digit-like images"


@dataclass
class Row:
    label: str
    encode: float
    decode: float
    copy: float
    rate: float
    error: float
    target: float | None
    kind: str

    @property
    def ratio(self) -> float:
        return (self.encode + self.decode) / self.copy


def measure(name: str, params: dict, x: np.ndarray, reps: int, clock) -> tuple[float, ...]:
    codec = make(name, **params)
    rng = np.random.default_rng(0)
    payload = codec.encode(x, rng)  # warm-up (and the payload measured below)
    y = codec.decode(payload)
    copies, encodes, decodes = [], [], []
    for _ in range(reps):  # interleaved, so that machine load hits all three alike
        t0 = clock()
        np.copy(x)
        t1 = clock()
        p = codec.encode(x, rng)
        t2 = clock()
        codec.decode(p)
        t3 = clock()
        copies.append(t1 - t0)
        encodes.append(t2 - t1)
        decodes.append(t3 - t2)
    rate = 32 * x.size / payload.nbits
    diff = (x.astype(np.float64) - y).reshape(-1)
    norm = float(np.linalg.norm(x.reshape(-1).astype(np.float64)))
    error = float(np.linalg.norm(diff)) / norm if norm else 0.0
    medians = [float(np.median(t)) for t in (encodes, decodes, copies)]
    return (*medians, rate, error)


def table(rows: list[Row]) -> str:
    out = [
        "| codec | encode / copy | decode / copy | (enc + dec) / copy | target | met | "
        "compression | rel. error |",
        "|---|---:|---:|---:|---:|:---:|---:|---:|",
    ]
    for r in rows:
        if r.target is None:
            target, met = "-", "n/a"
        else:
            target, met = f"<= {r.target}x", "yes" if r.ratio <= r.target else "**MISSED**"
        out.append(
            f"| {r.label} | {r.encode / r.copy:.1f} | {r.decode / r.copy:.1f} | "
            f"{r.ratio:.1f} | {target} | {met} | {r.rate:.1f}x | {r.error:.3f} |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=10_000_000, help="gradient length")
    parser.add_argument("--rows", type=int, default=60_000, help="data batch rows (x 784)")
    parser.add_argument("--reps", type=int, default=5, help="repetitions (median)")
    parser.add_argument("--quick", action="store_true", help="small inputs, 3 repetitions")
    parser.add_argument("--only", default="", help="comma-separated codec names to run")
    parser.add_argument(
        "--clock",
        choices=["wall", "cpu"],
        default="wall",
        help="wall: time.perf_counter; cpu: time.process_time (robust on a busy machine)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.size, args.rows, args.reps = min(args.size, 200_000), min(args.rows, 2_000), 3
    grad = gradient_vector(args.size)
    data, source = data_batch(args.rows)
    only = {n for n in args.only.split(",") if n}
    rows = []
    for label, name, params, kind, target in CASES:
        if only and name not in only:
            continue
        x = grad if kind == "grad" else data
        clock = time.perf_counter if args.clock == "wall" else time.process_time
        enc, dec, cp, rate, err = measure(name, params, x, args.reps, clock)
        rows.append(Row(label, enc, dec, cp, rate, err, target, kind))
        print(f"  {label}: {(enc + dec) / cp:.1f}x copy", file=sys.stderr, flush=True)
    copies = {k: np.median([r.copy for r in rows if r.kind == k] or [0]) for k in ("grad", "data")}
    header = (
        f"Gradient codecs: {args.size:,} float32 values (Gaussian x log-normal scale), np.copy "
        f"{copies['grad'] * 1e3:.1f} ms; data quantizer: {args.rows:,} x 784 {source}, np.copy "
        f"{copies['data'] * 1e3:.1f} ms. Median of {args.reps} interleaved repetitions "
        f"({'wall-clock' if args.clock == 'wall' else 'process CPU'} time); numpy "
        f"{np.__version__}, Python {platform.python_version()}, {platform.machine()}."
    )
    text = header + "\n\n" + table(rows)
    print(text)
    return text


if __name__ == "__main__":
    main()
