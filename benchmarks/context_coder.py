"""The ``context`` sample coder against the byte coders: bits per coordinate and speed.

Sizes (bits per coordinate of the sample codes as sent, side information excluded), for
quantized samples coded in messages of 64 samples as DQ sends them, stochastic rounding
(seed 0), every message checked to decode exactly:

* ``fmnist``: the first 6,400 Fashion-MNIST training images (``--fmnist-dir``), one range
  per sample, the context coder given the 1x28x28 image shape;
* ``digits``: scikit-learn's 1,797 digits (8x8), one range per sample (the quantizer keeps
  the smaller of the 2-D and the per-position model, as it does for small images);
* ``cancer``: scikit-learn's breast-cancer table (569 x 30), standardized, then quantized
  with per-feature ranges on [0, 1] as DQ's ``ranges=feature`` does (a flat, per-feature
  model).

Speed: per 64-sample message, the median over messages of the median over repeats of the
encode and the decode time of each coder on the same codes, measured side by side in one
run; the ``context / zlib`` ratios are printed. Times are the CPU time of the calling thread
by default (every coder here runs on that one thread), so other processes on a shared
machine do not lengthen one coder's calls more than another's; ``--clock wall`` takes
wall-clock time instead. The first line says which context coder ran (compiled with numba,
or constriction's) and how long its first calls took (compiling, or loading numba's cache).

Usage::

    python benchmarks/context_coder.py                # bits 1, 2, 4, 8; all data sets
    python benchmarks/context_coder.py --bits 1 2 --repeats 5
"""

from __future__ import annotations

import argparse
import time
from functools import partial
from pathlib import Path

import numpy as np
from sklearn.datasets import load_breast_cancer, load_digits

from dq_flower.codecs import context, make
from dq_flower.codecs.affine import feature_ranges, normalise
from dq_flower.codecs.bitpack import unpack
from dq_flower.codecs.entropy import compress, decompress

CODERS = ("zlib", "lzma", "context")
MESSAGE = 64


def datasets(fmnist_dir: str) -> dict[str, tuple[np.ndarray, tuple[int, ...] | None, bool]]:
    """Name -> (rows, sample shape, fixed range)."""
    out: dict[str, tuple[np.ndarray, tuple[int, ...] | None, bool]] = {}
    path = Path(fmnist_dir) / "train-images-idx3-ubyte.gz"
    if path.exists():
        from dq_flower.harness.tasks.data import parse_idx

        x = parse_idx(path)[:6400].reshape(6400, 784).astype(np.float32) / 255.0
        out["fmnist"] = (x, (1, 28, 28), False)
    out["digits"] = (load_digits().data.astype(np.float32) / 16.0, (1, 8, 8), False)
    table = load_breast_cancer().data
    table = ((table - table.mean(0)) / table.std(0)).astype(np.float32)
    lo, span = feature_ranges(table)
    out["cancer"] = (normalise(table, lo, span), (30,), True)
    return out


CLOCKS = {"cpu": time.thread_time, "wall": time.perf_counter}
_clock = CLOCKS["cpu"]


def _time(fn, repeats: int) -> float:
    best = []
    for _ in range(repeats):
        t0 = _clock()
        fn()
        best.append(_clock() - t0)
    return float(np.median(best))


def first_calls() -> float:
    """Seconds of the context coder's first encode and decode of each kind of batch."""

    t0 = time.perf_counter()
    for bits in (1, 2, 3):
        for shape in ((1, 2, 2), None):
            codes = np.zeros(8, np.uint8)
            context.decode(context.encode(codes, bits, 2, 4, shape), bits, 2, 4, shape)
    return time.perf_counter() - t0


def measure(x: np.ndarray, shape, fixed: bool, bits: int, repeats: int) -> dict[str, dict]:
    """Bits per coordinate and median per-message encode/decode seconds of every coder."""
    rng = np.random.default_rng(0)
    quant = make("uniform", bits=bits, fixed_range=fixed)
    ctx_q = make("uniform", bits=bits, fixed_range=fixed, entropy="context",
                 sample_shape=shape)
    ctx_dec = make("uniform", bits=bits, fixed_range=fixed, entropy="context")
    sizes = {c: 0 for c in ("packed", *CODERS)}
    times: dict[str, dict[str, list[float]]] = {c: {"enc": [], "dec": []} for c in CODERS}
    for start in range(0, x.shape[0] - MESSAGE + 1, MESSAGE):
        xb = x[start:start + MESSAGE]
        raw = quant.encode(xb, rng)
        packed = raw.buffers["codes"]
        sizes["packed"] += 8 * packed.size
        decoded = quant.decode(raw)
        for coder in ("zlib", "lzma"):
            stream = compress(packed, coder)
            assert np.array_equal(decompress(stream, coder, packed.size), packed)
            sizes[coder] += 8 * min(stream.size, packed.size)
            times[coder]["enc"].append(_time(partial(compress, packed, coder), repeats))
            times[coder]["dec"].append(
                _time(partial(decompress, stream, coder, packed.size), repeats))
        # the context coder on the same codes, through the quantizer's own coding stage
        codes = unpack(packed, bits, xb.size)

        img = ctx_q._image_shape(xb.shape[1])
        stream = context.encode(codes, bits, *xb.shape, img)
        if img is not None and xb.shape[1] <= context.MAX_PER_FEATURE_D:
            flat = context.encode(codes, bits, *xb.shape, None)  # as the quantizer does
            if flat.size < stream.size:
                stream, img = flat, None
        times["context"]["enc"].append(
            _time(partial(context.encode, codes, bits, *xb.shape, img), repeats))
        times["context"]["dec"].append(
            _time(partial(context.decode, stream, bits, *xb.shape, img), repeats))
        sizes["context"] += 8 * min(stream.size, packed.size)
        sent = ctx_q.encode(xb, np.random.default_rng(start))  # the real payload path
        ref = quant.encode(xb, np.random.default_rng(start))
        assert np.array_equal(ctx_dec.decode(sent), quant.decode(ref))
        assert np.array_equal(context.decode(stream, bits, *xb.shape, img), codes)
        assert decoded.shape == xb.shape
    coords = (x.shape[0] // MESSAGE) * MESSAGE * x.shape[1]
    return {c: {"bpc": sizes[c] / coords,
                "enc_ms": 1e3 * float(np.median(times[c]["enc"])) if c in times else 0.0,
                "dec_ms": 1e3 * float(np.median(times[c]["dec"])) if c in times else 0.0}
            for c in sizes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bits", type=int, nargs="+", action="extend")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="cpu")
    parser.add_argument("--fmnist-dir", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--data", nargs="+", default=["fmnist", "digits", "cancer"])
    args = parser.parse_args()
    global _clock
    _clock = CLOCKS[args.clock]

    coder = "compiled (numba)" if context.compiled() else "constriction (numba not installed)"
    print(f"context coder: {coder}; its first calls, 6 kinds of batch: {first_calls():.2f} s; "
          f"clock: {args.clock}\n")
    print("| data | bits | packed | zlib-9 | lzma | context | context enc ms | zlib enc ms "
          "| enc ratio | context dec ms | zlib dec ms | dec ratio | round-trip ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, (x, shape, fixed) in datasets(args.fmnist_dir).items():
        if name not in args.data:
            continue
        for bits in args.bits or [1, 2, 4, 8]:
            r = measure(x, shape, fixed, bits, args.repeats)
            c, z = r["context"], r["zlib"]
            print(f"| {name} | {bits} | {r['packed']['bpc']:.3f} | {z['bpc']:.3f} | "
                  f"{r['lzma']['bpc']:.3f} | {c['bpc']:.3f} | {c['enc_ms']:.3f} | "
                  f"{z['enc_ms']:.3f} | {c['enc_ms'] / z['enc_ms']:.1f}x | "
                  f"{c['dec_ms']:.3f} | {z['dec_ms']:.3f} | {c['dec_ms'] / z['dec_ms']:.1f}x | "
                  f"{(c['enc_ms'] + c['dec_ms']) / (z['enc_ms'] + z['dec_ms']):.1f}x |",
                  flush=True)


if __name__ == "__main__":
    main()
