"""Lossless entropy coding of packed code bytes: ``none``, ``zlib``, ``lzma``, ``zstd``.

``zstd`` needs the optional ``zstandard`` package. Decompression is bounded in output (the
caller states the exact size; longer or shorter streams, and claimed expansions beyond the
format's, are refused before decompressing) and in memory: the history a stream asks for
(xz's dictionary, zstd's window, read from the frame header first) is capped by
:func:`window_limit` (the expected size rounded up to a power of two, between
:data:`WINDOW_FLOOR` and :data:`WINDOW_CAP`), enforced by the library (liblzma's
``memlimit``, zstd's ``max_window_size``). Only ``.xz`` and one zstd frame are accepted; a
``MemoryError`` while decoding is a refusal with a reason.
"""

from __future__ import annotations

import io
import lzma
import zlib

import numpy as np

from .payload import PayloadError

__all__ = ["METHODS", "LZMA_STATE", "WINDOW_CAP", "WINDOW_FLOOR", "available", "check_method",
           "compress", "decompress", "memory_limit", "window_limit"]

#: Entropy coder names accepted by :func:`check_method`.
METHODS = ("none", "zlib", "lzma", "zstd")

#: Largest decompressed/compressed ratio per method (deflate's limit is 1032:1; lzma measured
#: 6,800:1 on 100 MB of zeros, bound at 2x; zstd generous), plus ``_SLACK`` for tiny inputs.
MAX_RATIO = {"zlib": 1032, "lzma": 16_000, "zstd": 65_536}
_SLACK = 256

#: Smallest history (xz dictionary, zstd window) a decoder is allowed, in bytes: ``lzma``
#: 8 MiB (``preset=6`` declares its 8 MiB dictionary for any message); ``zstd`` 1 MiB (level
#: 19 one-shot shrinks its window to the message).
WINDOW_FLOOR = {"lzma": 8 << 20, "zstd": 1 << 20}
#: Largest history accepted for any message: 64 MiB (xz's ``preset=9`` dictionary); the
#: encoders never go past 8 MiB.
WINDOW_CAP = 64 << 20
#: liblzma's memory beside the dictionary: 64 KiB measured for a one-block stream, with room.
LZMA_STATE = 1 << 20
#: How every accepted stream opens: the .xz stream header, a zstd frame (not a skippable one).
_XZ_MAGIC = b"\xfd7zXZ\x00"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def window_limit(method: str, size: int) -> int:
    """Largest history (dictionary or window) a ``method`` stream of ``size`` bytes may need.

    ``size`` rounded up to a power of two (no stream needs history beyond its own output),
    at least :data:`WINDOW_FLOOR` of the method, at most :data:`WINDOW_CAP`.
    """
    rounded = 1 << max(int(size) - 1, 0).bit_length()
    return min(WINDOW_CAP, max(WINDOW_FLOOR[method], rounded))


def memory_limit(method: str, size: int) -> int:
    """The decoder's memory limit in bytes for a ``method`` stream of ``size`` bytes.

    ``lzma``: :func:`window_limit` + :data:`LZMA_STATE` (``memlimit``); ``zstd``:
    :func:`window_limit` (``max_window_size``); ``zlib``: its fixed 32 KiB window.
    """
    if method == "lzma":
        return window_limit(method, size) + LZMA_STATE
    if method == "zstd":
        return window_limit(method, size)
    return 1 << 15


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

    The expansion ratio is checked first, output is capped at ``size + 1`` bytes and memory
    at :func:`memory_limit`; a ``MemoryError`` is a refusal with a reason.
    """
    try:
        return _decompress(data, method, size)
    except MemoryError:
        raise PayloadError(f"{method} stream ran out of memory decoding {size} bytes "
                           "(MemoryError); refused") from None


def _zstd_header(zstandard, buf: bytes, size: int, limit: int) -> None:
    """Refuse a zstd stream that is no zstd frame, or whose frame header asks too much."""
    if buf[:4] != _ZSTD_MAGIC:
        raise PayloadError(f"zstd stream is not a zstd frame (it opens {buf[:4].hex()}): "
                           "only the frame the encoder writes is accepted, no skippable "
                           "or magicless frame")
    try:
        params = zstandard.get_frame_parameters(buf)
    except zstandard.ZstdError as exc:
        raise PayloadError(f"zstd stream is corrupt: {exc}") from None
    if params.dict_id:
        raise PayloadError(f"zstd frame needs dictionary {params.dict_id}; none is accepted")
    if params.window_size > limit:
        raise PayloadError(f"zstd frame asks for a {params.window_size}-byte window; its "
                           f"memory limit for {size} bytes is a {limit}-byte window")
    if params.content_size != zstandard.CONTENTSIZE_UNKNOWN and params.content_size != size:
        raise PayloadError(f"zstd frame declares {params.content_size} bytes, expected {size}")


def _decompress(data: np.ndarray, method: str, size: int) -> np.ndarray:
    buf = np.ascontiguousarray(data, dtype=np.uint8).tobytes()
    if method == "none":
        if len(buf) != size:
            raise PayloadError(f"raw code stream holds {len(buf)} bytes, expected {size}")
        return np.frombuffer(buf, dtype=np.uint8).copy()
    if method not in MAX_RATIO:
        raise PayloadError(f"unknown entropy coder {method!r}")
    if size > MAX_RATIO[method] * len(buf) + _SLACK:
        raise PayloadError(f"{method} stream of {len(buf)} bytes cannot expand to the declared "
                           f"{size} bytes")
    limit = memory_limit(method, size)
    try:
        out, complete = _DECODERS[method](buf, size, limit)
    except (PayloadError, MemoryError):
        raise
    except Exception as exc:  # zlib.error, lzma.LZMAError, zstandard.ZstdError, ...
        raise _refusal(method, exc, size, limit) from exc
    if len(out) != size or not complete:
        raise PayloadError(f"{method} stream decodes to {len(out)}{'+' if not complete else ''} "
                           f"bytes, expected {size}")
    return np.frombuffer(out, dtype=np.uint8).copy()


def _inflate_zlib(buf: bytes, size: int, limit: int) -> tuple[bytes, bool]:
    """At most ``size + 1`` bytes of a zlib stream, and whether it ended cleanly there."""
    # memory bounded by the format: a window of at most 32 KiB (wbits=15, zlib
    # header only) and inflate's few KiB of state, whatever the stream declares
    d = zlib.decompressobj()
    out = d.decompress(buf, size + 1)
    return out, d.eof and not d.unused_data and not d.unconsumed_tail


def _inflate_lzma(buf: bytes, size: int, limit: int) -> tuple[bytes, bool]:
    """At most ``size + 1`` bytes of an xz stream within ``limit``, and whether it ended."""
    if buf[:6] != _XZ_MAGIC:
        raise PayloadError(
            f"lzma stream is not an xz stream (it opens {buf[:6].hex()}): only the "
            ".xz format the encoder writes is accepted, no .lzma or raw LZMA1 stream")
    # memlimit: liblzma refuses a block whose dictionary (plus its state) exceeds
    # it before reserving anything (an xz stream can declare up to 4 GiB)
    dx = lzma.LZMADecompressor(format=lzma.FORMAT_XZ, memlimit=limit)
    out = dx.decompress(buf, max_length=size + 1)
    return out, dx.eof and not dx.unused_data


def _inflate_zstd(buf: bytes, size: int, limit: int) -> tuple[bytes, bool]:
    """At most ``size + 1`` bytes of one zstd frame within ``limit``, and whether it ended."""
    zstandard = _zstd()
    if zstandard is None:
        raise PayloadError("payload uses zstd but 'zstandard' is not installed")
    _zstd_header(zstandard, buf, size, limit)
    # max_window_size: the decoder itself refuses any frame asking for more
    dz = zstandard.ZstdDecompressor(max_window_size=limit)
    reader = dz.stream_reader(io.BytesIO(buf))
    out = reader.read(size + 1)  # bounded read: a stream cannot expand further
    return out, reader.read(1) == b""


_DECODERS = {"zlib": _inflate_zlib, "lzma": _inflate_lzma, "zstd": _inflate_zstd}


def _refusal(method: str, exc: Exception, size: int, limit: int) -> PayloadError:
    """The reason a ``method`` decoder's own error ``exc`` refuses the stream."""
    text = str(exc)
    if method == "lzma" and "memory usage limit" in text.lower():
        return PayloadError(
            f"lzma stream needs more than its memory limit of {limit} bytes ("
            f"{limit >> 20} MiB: a dictionary of at most {window_limit(method, size)} "
            f"bytes for {size} bytes): {text}")
    if method == "zstd" and "too much memory" in text.lower():
        return PayloadError(
            f"zstd stream asks for a window above its memory limit of {limit} bytes "
            f"for {size} bytes: {text}")
    return PayloadError(f"{method} stream is corrupt: {text or type(exc).__name__}")
