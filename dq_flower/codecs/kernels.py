"""Numeric kernels the codecs share: input checks, random draws, bucket loops.

Pure numpy, vectorised; nothing here knows a payload.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dq_flower.knob import knob

__all__ = ["int_param", "check_finite", "check_int", "require_rng", "random_u16",
           "stochastic_floor", "BUCKET_RANGE", "bucket_chunks", "bucket_blocks", "n_buckets",
           "flat_input"]


def check_finite(x: np.ndarray, what: str = "input") -> np.ndarray:
    """Return ``x`` as a float32 array, raising ``ValueError`` if it has NaN or inf."""
    arr = np.asarray(x, dtype=np.float32)
    if arr.size == 0:
        return arr
    # Fast path: a finite dot product proves every entry finite (NaN and inf propagate);
    # an overflowing one falls back to the exact elementwise check.
    flat = arr.reshape(-1)
    with np.errstate(over="ignore", invalid="ignore"):
        if np.isfinite(np.dot(flat, flat)):
            return arr
    if not np.isfinite(arr).all():
        raise ValueError(f"{what} contains NaN or inf; codecs accept finite values only")
    return arr


def check_int(value: Any, name: str, lo: int, hi: int | None = None) -> int:
    """Return ``value`` as an int, or raise ``ValueError`` naming ``name`` if out of range."""
    if (isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < lo
            or (hi is not None and value > hi)):
        span = f"in {lo}..{hi}" if hi is not None else f">= {lo}"
        raise ValueError(f"{name} must be an integer {span}, got {value!r}")
    return int(value)


def int_param(name: str, default: int, lo: int, hi: int | None = None) -> Any:
    """A codec parameter field: an int in ``lo..hi``, stored as a plain ``int`` (JSON meta)."""
    return knob(default, coerce=lambda value: check_int(value, name, lo, hi))


def require_rng(rng: Any, codec: str) -> np.random.Generator:
    """Return ``rng`` if it is a ``numpy.random.Generator``, else raise ``ValueError``."""
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"codec {codec!r} draws random numbers: pass an explicit "
                         "numpy.random.Generator")
    return rng


def random_u16(rng: np.random.Generator, count: int) -> np.ndarray:
    """Draw ``count`` uniform 16-bit integers from ``rng``'s bit stream (4 per 64-bit draw)."""
    raw = rng.bit_generator.random_raw((count + 3) // 4)
    return np.asarray(raw, dtype=np.uint64).view(np.uint16)[:count]


def stochastic_floor(a: np.ndarray, rng: np.random.Generator, top: int) -> np.ndarray:
    """Return ``min(floor(a + u), top)`` as uint8, ``u`` uniform in [0, 1), overwriting ``a``.

    ``0 <= a <= top + tiny``, ``top <= 255``; ``u = r / 2**16`` for uniform 16-bit ``r`` (four
    per 64-bit draw): unbiased up to ``2**-16`` of a step.
    """
    r = random_u16(rng, a.size).reshape(a.shape)
    a *= np.float32(65536.0)
    np.add(a, r, out=a)
    a *= np.float32(1.0 / 65536.0)
    np.clip(a, np.float32(0.0), np.float32(top), out=a)  # faster than np.minimum here
    return a.astype(np.uint8)


#: Inclusive range of a codec's ``bucket`` parameter (coordinates per bucket).
BUCKET_RANGE = (1, 1 << 30)


def bucket_chunks(n_rows: int, row_len: int, target: int = 1 << 17):
    """Yield ``(start, stop)`` row ranges of about ``target`` elements (cache-sized blocks)."""
    step = max(1, target // max(1, row_len))
    for start in range(0, n_rows, step):
        yield start, min(n_rows, start + step)


def bucket_blocks(n: int, bucket: int, target: int = 1 << 17):
    """Yield ``(b0, b1, i0, i1)``: buckets ``b0:b1`` covering elements ``i0:i1`` of a flat array.

    Full buckets come in cache-sized blocks; a final shorter bucket comes alone.
    """
    nfull, tail = divmod(int(n), int(bucket))
    for s, e in bucket_chunks(nfull, bucket, target):
        yield s, e, s * bucket, e * bucket
    if tail:
        yield nfull, nfull + 1, nfull * bucket, n


def n_buckets(n: int, bucket: int) -> int:
    """Number of buckets of ``bucket`` elements (the last may be shorter) covering ``n``."""
    return -(-int(n) // int(bucket))


def flat_input(x: np.ndarray) -> tuple[np.ndarray, tuple[int, ...]]:
    """Return ``(flat float32 C-contiguous view or copy, shape)``; NaN or inf raise ValueError."""
    arr = check_finite(x)
    return np.ascontiguousarray(arr).reshape(-1), tuple(arr.shape)
