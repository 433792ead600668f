"""The token-window coder against zlib and lzma: bits per character on held-out text.

Messages as DQ would send them: windows of ``--window`` bytes of one device's held-out
Austen chapters (``load_austen``: one device per novel, a seeded 10% of each novel's
chapters held out; the text as UTF-8 bytes, one token per byte), ``--windows`` windows per
message, for each message size given. Each message is coded by

* ``tokens``: :mod:`dq_flower.codecs.tokens` (adaptive order-3 byte model, ANS), every
  message checked to decode exactly;
* ``zlib``: level 9, as DQ's ``entropy-coder = "zlib"`` sends it;
* ``xz``: :mod:`lzma` in the xz container at preset 6, as ``entropy-coder = "lzma"``
  sends it;
* ``lzma-raw``: LZMA2 at preset 9e with no container (no header, no check): the smallest
  lzma stream, which no DQ message carries; shown so the container's bytes are not
  mistaken for the model's.

Bits per character are 8 x (stream bytes) / (characters coded), summed over every message
of every device. The median encode and decode milliseconds per message of ``tokens`` and
``zlib``, measured side by side in one run, are printed too.

Usage::

    python benchmarks/token_coder.py           # windows of 128 B; 8, 32, 128 per message
    python benchmarks/token_coder.py --windows 32 --messages 4
"""

from __future__ import annotations

import argparse
import lzma
import time
import zlib
from collections.abc import Callable, Sequence

import numpy as np

from dq_flower.codecs import tokens
from dq_flower.harness.tasks.data.austen import load_austen

CODERS = ("tokens", "zlib", "xz", "lzma-raw")


def _lzma_raw(raw: bytes) -> bytes:
    return lzma.compress(raw, format=lzma.FORMAT_RAW,
                         filters=[{"id": lzma.FILTER_LZMA2, "preset": 9 | lzma.PRESET_EXTREME}])


def _timed(fn: Callable[[], object]) -> tuple[object, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def messages(texts: Sequence[str], window: int, per_message: int,
             most: int) -> list[np.ndarray]:
    """Up to ``most`` messages per text: ``per_message`` consecutive byte windows each."""
    out = []
    for text in texts:
        raw = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
        rows = raw[:raw.size // window * window].reshape(-1, window)
        for k in range(min(most, rows.shape[0] // per_message)):
            out.append(rows[k * per_message:(k + 1) * per_message].astype(np.int64))
    return out


def measure(msgs: list[np.ndarray]) -> dict[str, float]:
    """Bits per character of each coder and the tokens/zlib median milliseconds."""
    size = dict.fromkeys(CODERS, 0)
    times: dict[str, list[float]] = {k: [] for k in ("tokens-enc", "tokens-dec", "zlib-enc",
                                                        "zlib-dec")}
    chars = 0
    for ids in msgs:
        raw = ids.astype(np.uint8).tobytes()
        stream, t_enc = _timed(lambda ids=ids: tokens.encode(ids, 256))
        back, t_dec = _timed(lambda s=stream, ids=ids: tokens.decode(s, 256, *ids.shape))
        assert np.array_equal(back, ids), "the token coder lost data"
        zipped, z_enc = _timed(lambda raw=raw: zlib.compress(raw, 9))
        unzipped, z_dec = _timed(lambda z=zipped: zlib.decompress(z))
        assert unzipped == raw
        size["tokens"] += np.asarray(stream).size
        size["zlib"] += len(zipped)  # type: ignore[arg-type]
        size["xz"] += len(lzma.compress(raw, format=lzma.FORMAT_XZ, preset=6))
        size["lzma-raw"] += len(_lzma_raw(raw))
        times["tokens-enc"].append(t_enc)
        times["tokens-dec"].append(t_dec)
        times["zlib-enc"].append(z_enc)
        times["zlib-dec"].append(z_dec)
        chars += len(raw)
    out = {c: 8 * size[c] / chars for c in CODERS}
    out.update({k: 1e3 * float(np.median(v)) for k, v in times.items()})
    out["chars"] = chars
    return out


def main(argv: Sequence[str] | None = None) -> str:
    """Run the benchmark; print and return its table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=int, default=128, help="bytes per window")
    parser.add_argument("--windows", type=int, nargs="+", default=[8, 32, 128],
                        help="windows per message (one row each)")
    parser.add_argument("--messages", type=int, default=16,
                        help="most messages per device and row")
    parser.add_argument("--data-dir", default=None, help="the Austen database's folder")
    args = parser.parse_args(argv)
    texts = [d.test for d in load_austen(args.data_dir).devices]
    lines = ["| message | messages | characters | tokens | zlib | xz | lzma-raw "
             "| tokens enc ms | tokens dec ms | zlib enc ms | zlib dec ms |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for per in args.windows:
        msgs = messages(texts, args.window, per, args.messages)
        r = measure(msgs)
        lines.append(
            f"| {per} x {args.window} B | {len(msgs)} | {int(r['chars']):,} | "
            f"{r['tokens']:.3f} | {r['zlib']:.3f} | {r['xz']:.3f} | {r['lzma-raw']:.3f} | "
            f"{r['tokens-enc']:.1f} | {r['tokens-dec']:.1f} | {r['zlib-enc']:.2f} | "
            f"{r['zlib-dec']:.3f} |")
        print(lines[-1] if len(lines) > 3 else "\n".join(lines), flush=True)
    return "\n".join(lines)


if __name__ == "__main__":
    main()
