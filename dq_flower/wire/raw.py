"""Flat arrays as they travel: raw bytes with no ``np.save`` header, read back checked."""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord

from dq_flower.codecs import PayloadError

__all__ = ["raw_array", "read_raw"]


def raw_array(arr: np.ndarray) -> Array:
    """Flat Flower ``Array`` carrying ``arr``'s bytes as they are (no ``np.save`` header)."""
    flat = np.ascontiguousarray(arr).reshape(-1)
    return Array(dtype=str(flat.dtype), shape=(flat.size,), stype="raw", data=flat.tobytes())


def read_raw(record: ArrayRecord, key: str, dtype: str, max_bytes: int,
             what: str = "sample-info") -> np.ndarray:
    """The values of ``record[key]``: of ``dtype``, at most ``max_bytes``, else PayloadError."""
    if key not in record:
        raise PayloadError(f"{what} misses {key!r}")
    arr = record[key]
    if arr.dtype != dtype:
        raise PayloadError(f"{what} {key!r} is {arr.dtype}, expected {dtype}")
    if len(arr.data) > max_bytes or len(arr.data) % np.dtype(dtype).itemsize:
        raise PayloadError(f"{what} {key!r} carries {len(arr.data)} bytes")
    return np.frombuffer(arr.data, dtype=dtype)
