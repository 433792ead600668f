"""Lossless entropy coding of packed code bytes: ``none``, ``zlib``, ``lzma``, ``zstd``.

``zlib`` (level 9) and ``lzma`` come with Python; ``zstd`` needs the optional ``zstandard``
package. Decompression is bounded: the caller states the exact decompressed size (known
from the payload's declared shape), streams longer or shorter than that are refused, and a
stream whose claimed expansion exceeds what the format can produce is refused before any
decompression starts.
"""

from __future__ import annotations

import io
import lzma
import zlib

import numpy as np

from .base import PayloadError

__all__ = ["METHODS", "available", "check_method", "compress", "decompress"]

#: Entropy coder names accepted by :func:`check_method`.
METHODS = ("none", "zlib", "lzma", "zstd")

#: Largest decompressed/compressed size ratio accepted per method. Deflate cannot expand
#: more than 1032:1; lzma measured 6,800:1 on 100 MB of zeros here (bound set at 2x);
#: zstd's bound is generous. Plus a fixed allowance for tiny inputs.
MAX_RATIO = {"zlib": 1032, "lzma": 16_000, "zstd": 65_536}
_SLACK = 256


def _zstd():
    try:
        import zstandard
    except ImportError:
        return None
    return zstandard


def available() -> list[str]:
    """Entropy coders usable on this machine."""
    return [m for m in METHODS if m != "zstd" or _zstd() is not None]


def check_method(method: str, name: str = "entropy") -> str:
    """Return ``method`` if it is a usable coder, else raise ``ValueError`` naming ``name``."""
    if method not in METHODS:
        raise ValueError(f"{name} must be one of {', '.join(METHODS)}, got {method!r}")
    if method == "zstd" and _zstd() is None:
        raise ValueError(f"{name}='zstd' needs the optional 'zstandard' package")
    return method


def compress(data: np.ndarray, method: str) -> np.ndarray:
    """Compress uint8 ``data`` losslessly with ``method``; return the uint8 stream."""
    raw = np.ascontiguousarray(data, dtype=np.uint8).tobytes()
    if method == "none":
        out = raw
    elif method == "zlib":
        out = zlib.compress(raw, 9)
    elif method == "lzma":
        out = lzma.compress(raw, format=lzma.FORMAT_XZ, preset=6)
    elif method == "zstd":
        zstandard = _zstd()
        if zstandard is None:
            raise ValueError("entropy='zstd' needs the optional 'zstandard' package")
        out = zstandard.ZstdCompressor(level=19).compress(raw)
    else:
        raise ValueError(f"unknown entropy coder {method!r}")
    return np.frombuffer(out, dtype=np.uint8).copy()


def decompress(data: np.ndarray, method: str, size: int) -> np.ndarray:
    """Decompress ``data`` to exactly ``size`` bytes, or raise :class:`PayloadError`.

    The expansion ratio is checked before decompressing, and the decompressor never produces
    more than ``size + 1`` bytes, so a malicious stream cannot exhaust memory.
    """
    buf = np.ascontiguousarray(data, dtype=np.uint8).tobytes()
    if method == "none":
        if len(buf) != size:
            raise PayloadError(f"raw code stream holds {len(buf)} bytes, expected {size}")
        return np.frombuffer(buf, dtype=np.uint8).copy()
    if method not in MAX_RATIO:
        raise PayloadError(f"unknown entropy coder {method!r}")
    if size > MAX_RATIO[method] * len(buf) + _SLACK:
        raise PayloadError(
            f"{method} stream of {len(buf)} bytes cannot expand to the declared {size} bytes"
        )
    try:
        if method == "zlib":
            d = zlib.decompressobj()
            out = d.decompress(buf, size + 1)
            complete = d.eof and not d.unused_data and not d.unconsumed_tail
        elif method == "lzma":
            dx = lzma.LZMADecompressor(format=lzma.FORMAT_XZ)
            out = dx.decompress(buf, max_length=size + 1)
            complete = dx.eof and not dx.unused_data
        else:
            zstandard = _zstd()
            if zstandard is None:
                raise PayloadError("payload uses zstd but 'zstandard' is not installed")
            reader = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(buf))
            out = reader.read(size + 1)  # bounded read: a stream cannot expand further
            complete = reader.read(1) == b""
    except Exception as exc:  # zlib.error, lzma.LZMAError, zstandard.ZstdError, ...
        if isinstance(exc, PayloadError):
            raise
        raise PayloadError(f"{method} stream is corrupt: {exc}") from exc
    if len(out) != size or not complete:
        raise PayloadError(
            f"{method} stream decodes to {len(out)}{'+' if not complete else ''} bytes, "
            f"expected {size}"
        )
    return np.frombuffer(out, dtype=np.uint8).copy()
