"""Read and rewrite a DQ reply's per-sample ranges in whichever form it carries them.

At the defaults (a lossless coder) the ranges travel zlib-coded in one ``ranges`` buffer
(``meta["ranges"] = "zlib"``), otherwise as raw float32 ``mins`` and ``scales``. Attacks and
fuzz mutations edit them through these helpers so that they reach the form actually sent;
a rewrite keeps the payload header exact (buffer sizes, ``nbits``).
"""

from __future__ import annotations

import json
import zlib

import numpy as np
from flwr.app import Array, RecordDict


def _raw(data: bytes, dtype: str) -> Array:
    size = len(data) // np.dtype(dtype).itemsize
    return Array(dtype=dtype, shape=(size,), stype="raw", data=data)


def sample_ranges(content: RecordDict) -> tuple[np.ndarray, np.ndarray]:
    """The samples' ``(mins, scales)`` as float32 arrays, undoing the ranges coder."""
    samples = content["samples"]
    if "ranges" in samples:
        raw = np.frombuffer(zlib.decompress(bytes(samples["ranges"].data)), dtype=np.float32)
        half = raw.size // 2
        return raw[:half].copy(), raw[half:].copy()
    return (np.frombuffer(samples["mins"].data, dtype=np.float32).copy(),
            np.frombuffer(samples["scales"].data, dtype=np.float32).copy())


def set_sample_ranges(content: RecordDict, mins: np.ndarray, scales: np.ndarray) -> None:
    """Write ``(mins, scales)`` back in the form the reply carried them."""
    samples = content["samples"]
    if "ranges" not in samples:
        samples["mins"] = _raw(np.asarray(mins, np.float32).tobytes(), "float32")
        samples["scales"] = _raw(np.asarray(scales, np.float32).tobytes(), "float32")
        return
    old = len(samples["ranges"].data)
    stream = zlib.compress(np.concatenate([mins, scales]).astype(np.float32).tobytes(), 9)
    samples["ranges"] = _raw(stream, "uint8")
    header = json.loads(bytes(samples["header"].data))
    header["buffers"]["ranges"][1] = len(stream)
    header["nbits"] += 8 * (len(stream) - old)
    samples["header"] = _raw(json.dumps(header).encode(), "uint8")
