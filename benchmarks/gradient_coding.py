"""Gradient payloads under zlib, the ``context`` symbol model and Elias: bits and time.

Real updates: one local epoch's weight difference ``w_1 - w_0`` of client 0 (plain SGD,
batch 32, lr 0.05, seed 0, from the seeded initial model):

* ``digits``: the digits MLP (D = 9,610) on one of 4 IID partitions (~340 rows);
* ``fmnist``: the wide CNN (D = 857,738) on one of 10 IID partitions (6,000 rows), when
  ``/usr/share/datasets/fashion-mnist`` holds the IDX files.

Each update is coded by ``qsgd`` (bucket 512; ``s = 1``: 2-bit codes -1/0/1, ``s = 7``:
4-bit), ``terngrad``, ``sign`` and ``ef-sign`` (rounding seed 1). Bits per coordinate of
what is sent, side information included:

* ``fixed``: the codec's payload; ``zlib``: after the generic lossless stage
  (:func:`dq_flower.codecs.lossless.pack`, where it shrinks the payload);
* ``symbols``: the codes through the adaptive order-0 ANS model of
  :mod:`dq_flower.codecs.symbols` plus the raw side information (sign bits as 2-symbol
  codes, measured although no codec sends them so);
* ``sent``: what ``entropy="context"`` sends (the smaller of ``symbols`` and zlib, zlib
  alone for the sign codecs), and its coder;
* ``elias``: QSGD's Elias coding (``benchmarks/elias.py``; the smallest of gamma/gamma,
  omega/omega, delta/gamma), TernGrad's codes as one bucket of QSGD ``s = 1`` levels;
* ``H0``: the codes' zero-order empirical entropy plus the side information.

Time: the coding stage alone (zlib: pack + unpack; symbols: code + decode the codes and
repack them), median over ``--repeats`` repeats, as ``symbols / zlib`` ratios of encode,
decode and their sum. ``entropy="context"`` also runs zlib on every message (to send the
smaller), so its encoder costs zlib's time plus the symbols' encode: ``context path /
zlib`` is ``(zlib enc + symbols enc + symbols dec) / (zlib enc + zlib dec)``.

Usage::

    python benchmarks/gradient_coding.py              # both tasks (about a minute)
    python benchmarks/gradient_coding.py --data digits --repeats 5
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import elias  # benchmarks/elias.py, next to this script
import numpy as np
import torch

from dq_flower.codecs import Codec, Payload, lossless, make, symbols
from dq_flower.codecs.bitpack import unpack
from dq_flower.codecs.context_coded import pack as context_pack
from dq_flower.codecs.context_coded import unpack as context_unpack
from dq_flower.harness.runtime import build_model, task_info
from dq_flower.harness.task_config import TaskConfig
from dq_flower.harness.tasks.data import load_partition
from dq_flower.model_ops import get_flat, set_flat, weighted_loss_grad

#: (label, codec, parameters, codes buffer, width, alphabet).
CASES = (("qsgd s=1 (2 bit)", "qsgd", {"levels": 1, "bucket": 512}, "codes", 2, 3),
         ("qsgd s=7 (4 bit)", "qsgd", {"levels": 7, "bucket": 512}, "codes", 4, 15),
         ("terngrad", "terngrad", {}, "codes", 2, 3),
         ("sign", "sign", {}, "bits", 1, 2),
         ("ef-sign", "ef-sign", {}, "bits", 1, 2))
#: (data name, model, partitions): the updates measured.
TASKS = (("digits", "mlp", 4), ("fmnist", "wide-cnn", 10))
ELIAS = (("gamma", "gamma"), ("omega", "omega"), ("delta", "gamma"))


def local_update(dataset: str, model_name: str, partitions: int, seed: int = 0,
                 lr: float = 0.05, batch: int = 32) -> np.ndarray:
    """One local epoch's weight difference of client 0 (float32)."""
    torch.manual_seed(seed)
    task = TaskConfig(dataset=dataset, model=model_name, seed=seed)
    model = build_model(task, task_info(task))
    x, y, _ = load_partition(dataset, 0, partitions, seed=seed)
    order = np.random.default_rng(seed).permutation(x.shape[0])
    w0 = get_flat(model)
    w = w0.copy()
    for start in range(0, order.size, batch):
        b = order[start:start + batch]
        _, g = weighted_loss_grad(model, x[b], y[b], np.full(b.size, 1 / b.size))
        w = w - np.float32(lr) * g
        set_flat(model, w)
    return (w - w0).astype(np.float32)


def _median_time(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def _elias_bits(p: Payload, codes: np.ndarray, name: str) -> float:
    """Bits of the best Elias variant (norms or scale included), NaN for the sign codecs."""
    if name == "qsgd":
        q, _, _, bucket = elias.payload_levels(p)
    elif name == "terngrad":
        q, bucket = codes.astype(np.int64) - 1, max(codes.size, 1)
    else:
        return float("nan")
    return float(min(elias.levels_nbits(q, bucket, g, m) for g, m in ELIAS))


def _symbol_stage(codec: Codec, p: Payload, buffer: str, width: int, alphabet: int):
    """(bits sent with the symbol model, encode fn, decode fn) for payload ``p``."""
    spec = codec.symbol_spec()
    size = int(np.prod(p.shape))
    if spec is not None:
        coded = context_pack(p, spec)
        assert coded is not None
        return coded.nbits, (lambda: context_pack(p, spec)), (lambda: context_unpack(coded, spec))
    codes = unpack(p.buffers[buffer], width, size)
    stream = symbols.encode(codes, alphabet)
    side = p.nbits - width * size
    return 8 * stream.size + side, (lambda: symbols.encode(unpack(p.buffers[buffer], width,
                                                                    size), alphabet)), \
        (lambda: symbols.decode(stream, alphabet, size))


def measure(x: np.ndarray, name: str, params: dict, buffer: str, width: int,
            alphabet: int, repeats: int) -> dict[str, float | str]:
    """Bits per coordinate of every coder, and the symbol/zlib time ratios."""
    codec = make(name, **params)
    p = codec.encode(x, np.random.default_rng(1))
    size = x.size
    codes = unpack(p.buffers[buffer], width, size)
    side = p.nbits - width * size
    zipped = lossless.pack(p, "zlib")
    sym_bits, sym_enc, sym_dec = _symbol_stage(codec, p, buffer, width, alphabet)
    sent = make(name, entropy="context", **params).encode(x, np.random.default_rng(1))
    ref = codec.decode(p)
    assert np.array_equal(make(name, entropy="context", **params).decode(sent), ref)
    counts = np.bincount(codes)
    nz = counts[counts > 0]
    h0 = float(-(nz * np.log2(nz / size)).sum()) + side
    z_enc = _median_time(lambda: lossless.pack(p, "zlib"), repeats)
    z_dec = _median_time(lambda: lossless.unpack(zipped, "zlib"), repeats)
    s_enc, s_dec = _median_time(sym_enc, repeats), _median_time(sym_dec, repeats)
    return {"fixed": p.nbits / size, "zlib": zipped.nbits / size, "symbols": sym_bits / size,
            "sent": sent.nbits / size, "coder": lossless.coder_of(sent),
            "elias": _elias_bits(p, codes, name) / size, "H0": h0 / size,
            "enc": s_enc / z_enc, "dec": s_dec / z_dec,
            "both": (s_enc + s_dec) / (z_enc + z_dec), "zlib_ms": 1e3 * (z_enc + z_dec),
            "sent_both": (z_enc + s_enc + s_dec) / (z_enc + z_dec)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", nargs="+", default=[t[0] for t in TASKS])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("| data | codec | fixed | zlib | symbols | sent (coder) | elias | H0 | symbols vs "
          "zlib | enc / zlib | dec / zlib | enc+dec / zlib | context path / zlib "
          "| zlib enc+dec ms |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for data, model, parts in TASKS:
        if data not in args.data:
            continue
        try:
            x = local_update(data, model, parts)
        except FileNotFoundError as exc:
            print(f"| {data} | skipped: {exc} |")
            continue
        for label, name, params, buffer, width, alphabet in CASES:
            r = measure(x, name, params, buffer, width, alphabet, args.repeats)
            gain = 100 * (1 - float(r["symbols"]) / float(r["zlib"]))
            print(f"| {data} (D = {x.size:,}) | {label} | {r['fixed']:.3f} | {r['zlib']:.3f} | "
                  f"{r['symbols']:.3f} | {r['sent']:.3f} ({r['coder']}) | {r['elias']:.3f} | "
                  f"{r['H0']:.3f} | {gain:+.1f}% | {r['enc']:.2f}x | {r['dec']:.1f}x | "
                  f"{r['both']:.2f}x | {r['sent_both']:.2f}x | {r['zlib_ms']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
