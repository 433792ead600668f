"""Lossless coding of any codec's payload: :func:`pack`, :func:`unpack`, :class:`EntropyCoded`.

:func:`pack` concatenates a payload's buffers and compresses them as one stream
(:func:`dq_flower.codecs.entropy.compress`: ``zlib`` level 9, ``lzma``, ``zstd``) where that
shrinks it and they hold at most :func:`max_raw_bytes`; the packed payload keeps codec and
shape, carries one ``uint8`` buffer :data:`STREAM`, meta :data:`CODER_META`, the layout
``name:dtype:size;...`` (:data:`LAYOUT_META`) and the original ``nbits``
(:data:`NBITS_META`), and its ``nbits`` is 8 x the stream's bytes. :func:`unpack` is strict:
the configured coder only; the layout parsed and bounded (by :func:`max_raw_bytes` of the
declared shape and the coder's expansion ratio) **before** decompressing; exactly that many
bytes within :func:`dq_flower.codecs.entropy.memory_limit`; the original ``nbits`` fitting.
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np

from .base import Codec
from .entropy import check_method, compress, decompress
from .payload import (
    ALLOWED_DTYPES,
    MAX_ELEMENTS,
    Payload,
    PayloadError,
    check_codec,
    expect_shape,
)

__all__ = ["CODER_META", "LAYOUT_META", "NBITS_META", "STREAM", "EntropyCoded", "max_raw_bytes",
           "pack", "unpack", "coder_of", "raw_nbits"]

#: Meta key naming the coder of a packed payload.
CODER_META = "entropy-coder"
#: Meta key holding the original buffers, ``name:dtype:size`` joined by ``;``.
LAYOUT_META = "entropy-layout"
#: Meta key holding the payload's ``nbits`` before coding.
NBITS_META = "entropy-nbits"
#: Name of the one buffer of a packed payload.
STREAM = "entropy-stream"
#: Most buffers a packed layout may list, and the longest layout text.
MAX_LAYOUT_BUFFERS = 16
MAX_LAYOUT_CHARS = 2048
#: Bound on a packed payload's decoded bytes: 8 per declared element plus 64 KiB (the
#: widest codec, ``topk`` at ratio 1, takes 33 bits); a larger payload is sent uncoded.
RAW_BYTES_PER_ELEMENT = 8
RAW_ALLOWANCE = 1 << 16

_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_OWN_KEYS = (CODER_META, LAYOUT_META, NBITS_META)


def max_raw_bytes(elements: int) -> int:
    """Largest byte count a packed payload of ``elements`` declared elements may decode to."""
    return RAW_BYTES_PER_ELEMENT * int(elements) + RAW_ALLOWANCE


def coder_of(p: Payload) -> str:
    """The coder a payload was packed with, ``"none"`` for a payload sent as it is."""
    value = p.meta.get(CODER_META, "none")
    return value if isinstance(value, str) else "?"


def raw_nbits(p: Payload) -> int:
    """The payload's bits before lossless coding (its ``nbits`` when it is not packed).

    Trust it only after :func:`unpack` (or a decoder) has accepted the payload.
    """
    value = p.meta.get(NBITS_META, p.nbits)
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else p.nbits


def pack(p: Payload, method: str) -> Payload:
    """``p`` (as its codec made it) coded with ``method`` (``none``, ``zlib``, ``lzma``, ``zstd``).

    ``p`` itself is returned for ``none``, an empty payload, one above :func:`max_raw_bytes`
    or one that coding would not shrink.
    """
    check_method(method)
    if method == "none" or any(k in p.meta for k in _OWN_KEYS):
        return p
    parts = [np.ascontiguousarray(b).reshape(-1) for b in p.buffers.values()]
    total = sum(b.nbytes for b in parts)
    elements = math.prod(p.shape)
    if total == 0 or total > max_raw_bytes(elements):
        return p
    raw = np.concatenate([b.view(np.uint8) for b in parts])
    stream = compress(raw, method)
    if stream.size >= total:
        return p
    layout = ";".join(f"{name}:{b.dtype}:{b.size}" for name, b in zip(p.buffers, parts,
                                                                       strict=True))
    meta = {**p.meta, CODER_META: method, LAYOUT_META: layout, NBITS_META: int(p.nbits)}
    return Payload(p.codec, tuple(p.shape), meta, {STREAM: stream}, nbits=8 * int(stream.size),
                   version=p.version)


def _layout(text: Any) -> list[tuple[str, str, int]]:
    """Parse and bound a layout string; raise :class:`PayloadError` if malformed."""
    if not isinstance(text, str) or not 0 < len(text) <= MAX_LAYOUT_CHARS:
        raise PayloadError("entropy-coded payload has a missing or oversized buffer layout")
    entries = text.split(";")
    if len(entries) > MAX_LAYOUT_BUFFERS:
        raise PayloadError(f"entropy-coded payload lists {len(entries)} buffers; at most "
                           f"{MAX_LAYOUT_BUFFERS}")
    out, seen = [], set()
    for entry in entries:
        fields = entry.split(":")
        if len(fields) != 3:
            raise PayloadError(f"entropy-coded payload layout entry {entry[:40]!r} is malformed")
        name, dtype, size = fields
        if not _NAME.fullmatch(name) or name in seen or name == STREAM:
            raise PayloadError(f"entropy-coded payload layout has a bad buffer name {name[:40]!r}")
        if dtype not in ALLOWED_DTYPES:
            raise PayloadError(f"entropy-coded payload buffer {name!r} has dtype {dtype[:20]!r}")
        if not size.isdigit() or len(size) > 11 or int(size) > MAX_ELEMENTS:
            raise PayloadError(f"entropy-coded payload buffer {name!r} has size {size[:20]!r}")
        seen.add(name)
        out.append((name, dtype, int(size)))
    return out


def unpack(p: Payload, method: str) -> Payload:
    """Undo :func:`pack` strictly (coded with ``method``); an unpacked ``p`` is returned as is.

    :class:`PayloadError` for another coder; stray keys or buffers; a malformed or oversized
    layout (checked before decompressing); a stream that does not decode to exactly the
    layout's size or needs more memory than its decoder's limit; an original ``nbits`` that
    does not fit in it.
    """
    if CODER_META not in p.meta:
        if any(k in p.meta for k in _OWN_KEYS) or STREAM in p.buffers:
            raise PayloadError("payload carries entropy-coding fields without a coder")
        return p
    stream = _coded_stream(p, method)
    layout, total, nbits = _bounded_layout(p)
    # expansion ratio checked before decompressing; output and memory bounded while doing so
    raw = decompress(stream, method, total)
    meta = {k: v for k, v in p.meta.items() if k not in _OWN_KEYS}
    return Payload(p.codec, tuple(p.shape), meta, _split(raw, layout, total), nbits=nbits,
                   version=p.version)


def _coded_stream(p: Payload, method: str) -> np.ndarray:
    """The one stream of a packed payload, its coder and ``nbits`` checked."""
    coder = p.meta[CODER_META]
    if coder == "none" or coder != method:
        raise PayloadError(f"payload is entropy-coded with {coder!r}; this receiver accepts "
                           f"{method!r}")
    stream = p.buffers.get(STREAM)
    if set(p.buffers) != {STREAM} or stream is None or stream.dtype != np.uint8 \
            or stream.ndim != 1:
        raise PayloadError(f"entropy-coded payload must carry exactly one uint8 {STREAM!r}")
    if p.nbits != 8 * stream.size:
        raise PayloadError(f"entropy-coded payload declares {p.nbits} bits; its stream has "
                           f"{8 * stream.size}")
    return stream


def _bounded_layout(p: Payload) -> tuple[list[tuple[str, str, int]], int, int]:
    """``(layout, its total bytes, original nbits)``, bounded by the declared shape."""
    layout = _layout(p.meta.get(LAYOUT_META))
    total = sum(size * np.dtype(dtype).itemsize for _, dtype, size in layout)
    elements = expect_shape(p)
    if total > max_raw_bytes(elements):
        raise PayloadError(f"entropy-coded payload declares {total} bytes for {elements} "
                           f"elements; at most {max_raw_bytes(elements)} accepted")
    nbits = p.meta.get(NBITS_META)
    if isinstance(nbits, bool) or not isinstance(nbits, int) or not 0 <= nbits <= 8 * total:
        raise PayloadError(f"entropy-coded payload's original nbits {nbits!r} does not fit "
                           f"its {total} bytes")
    return layout, total, nbits


def _split(raw: np.ndarray, layout: list[tuple[str, str, int]], total: int
           ) -> dict[str, np.ndarray]:
    """The decoded stream ``raw`` cut into the layout's buffers (copies)."""
    buffers: dict[str, np.ndarray] = {}
    offset = 0
    try:
        for name, dtype, size in layout:
            nbytes = size * np.dtype(dtype).itemsize
            buffers[name] = raw[offset:offset + nbytes].view(dtype).copy()
            offset += nbytes
    except MemoryError:
        raise PayloadError(f"entropy-coded payload ran out of memory splitting its {total} "
                           "bytes (MemoryError); refused") from None
    return buffers


class EntropyCoded(Codec):
    """A codec whose payloads are entropy-coded with ``coder`` where that shrinks them.

    ``encode`` is the codec's, then :func:`pack`; ``decode`` is :func:`unpack`, then the
    codec's. Everything else (traits, parameters, state) is the wrapped codec's.

    Parameters
    ----------
    codec : Codec
        The codec to wrap.
    coder : str
        ``zlib``, ``lzma`` or ``zstd`` (``none`` is allowed and packs nothing).
    """

    def __init__(self, codec: Codec, coder: str) -> None:
        self._wrap(codec, "EntropyCoded")
        self.coder = check_method(coder, "entropy")

    def _wrap(self, codec: Codec, kind: str) -> None:
        """Hold ``codec`` (a plain one; ``kind`` names this wrapper) and take on its traits."""
        if not isinstance(codec, Codec) or isinstance(codec, EntropyCoded):
            raise ValueError(f"{kind} wraps a plain Codec, got {type(codec).__name__}")
        self.codec = codec
        # the wrapped codec's class-level traits, per instance (a wrapper has no own ones)
        self.name = codec.name  # type: ignore[misc]
        self.biased = codec.biased  # type: ignore[misc]
        self.lossless = codec.lossless  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"EntropyCoded({self.codec!r}, coder={self.coder!r})"

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, EntropyCoded) and other.codec == self.codec
                and other.coder == self.coder)

    def __hash__(self) -> int:
        return hash((self.codec, self.coder))

    def __getattr__(self, attr: str) -> Any:
        if attr == "codec":  # not set yet (copy, unpickling): no recursion
            raise AttributeError(attr)
        return getattr(self.codec, attr)

    def encode(self, x: np.ndarray, rng: np.random.Generator | None = None) -> Payload:
        """The codec's payload of ``x``, entropy-coded where that shrinks it."""
        return pack(self.codec.encode(x, rng), self.coder)

    def decode(self, p: Payload) -> np.ndarray:
        """Undo the entropy coding (strictly, see :func:`unpack`) and decode."""
        check_codec(p, self.name)
        return self.codec.decode(unpack(p, self.coder))
