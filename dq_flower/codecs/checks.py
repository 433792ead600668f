"""Checks a decoder runs on a payload before it allocates or trusts anything."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .errors import PayloadError
from .payload import Payload, checked_shape

__all__ = ["require_finite", "expect_buffer", "expect_floats", "expect_stream", "meta_int",
           "meta_equal", "expect_nbits", "expect_shape"]


def require_finite(p: Payload, name: str, arr: np.ndarray) -> np.ndarray:
    """Raise :class:`PayloadError` if side information ``arr`` holds NaN or inf."""
    if not np.isfinite(arr).all():
        raise PayloadError(f"{p.codec} payload side information {name!r} holds NaN or inf")
    return arr


def expect_buffer(p: Payload, name: str, dtype: str, size: int) -> np.ndarray:
    """Return ``p.buffers[name]``, its dtype and element count checked (before allocating)."""
    if name not in p.buffers:
        raise PayloadError(f"{p.codec} payload misses buffer {name!r}")
    buf = p.buffers[name]
    if str(buf.dtype) != dtype:
        raise PayloadError(f"{p.codec} buffer {name!r} is {buf.dtype}, expected {dtype}")
    if buf.size != size:
        raise PayloadError(f"{p.codec} buffer {name!r} holds {buf.size} elements, expected {size}")
    return buf


def expect_floats(p: Payload, name: str, size: int) -> np.ndarray:
    """Return float32 side information ``p.buffers[name]`` of ``size`` elements, all finite."""
    return require_finite(p, name, expect_buffer(p, name, "float32", size))


def expect_stream(p: Payload, name: str, owner: str = "") -> np.ndarray:
    """Return ``p.buffers[name]`` after checking it is a flat uint8 stream."""
    stream = p.buffers.get(name)
    if stream is None or stream.dtype != np.uint8 or stream.ndim != 1:
        raise PayloadError(f"{owner or p.codec} payload {name!r} must be a flat uint8 stream")
    return stream


def meta_int(p: Payload, key: str, lo: int, hi: int) -> int:
    """Return integer ``p.meta[key]`` after checking ``lo <= value <= hi``."""
    value = p.meta.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise PayloadError(f"{p.codec} payload meta {key!r}={value!r} is not an int in "
                           f"[{lo}, {hi}]")
    return value


def meta_equal(p: Payload, key: str, expected: Any) -> None:
    """Raise :class:`PayloadError` unless ``p.meta[key] == expected`` (the decoder's own value)."""
    value = p.meta.get(key)
    if type(value) is not type(expected) or value != expected:
        raise PayloadError(f"{p.codec} payload meta {key!r}={value!r} does not match the "
                           f"decoder's {expected!r}")


def expect_nbits(p: Payload, expected: int) -> None:
    """Raise :class:`PayloadError` unless the payload's declared ``nbits`` equals ``expected``."""
    if p.nbits != expected:
        raise PayloadError(f"{p.codec} payload declares {p.nbits} bits; its layout has {expected}")


def expect_shape(p: Payload, ndim: int | None = None) -> int:
    """Check ``p.shape`` (ints, at most :data:`MAX_ELEMENTS` elements); return the element count."""
    shape = checked_shape(p.shape)
    if ndim is not None and len(shape) != ndim:
        raise PayloadError(f"{p.codec} payload shape {shape} is not {ndim}-D")
    return math.prod(shape)
