"""``entropy-coder = "context"`` for the gradient codecs: their codes through :mod:`.symbols`.

A codec with a :meth:`Codec.symbol_spec` (``qsgd``, ``terngrad``) has its codes coded by the
adaptive order-0 ANS coder of :mod:`.symbols`, side buffers sent as they are; the encoder
sends the smaller of that and zlib (:func:`.lossless.pack`), named by meta
:data:`~.lossless.CODER_META`. A context-coded payload carries :data:`~.lossless.STREAM`, the
side buffers and the original ``nbits`` (:data:`~.lossless.NBITS_META`), ``nbits`` 8 x its
bytes; :func:`unpack` bounds the code count by the stream (:func:`.symbols.fits`) first.
"""

from __future__ import annotations

import numpy as np

from . import bitpack, symbols
from .base import Codec, SymbolSpec
from .lossless import CODER_META, LAYOUT_META, NBITS_META, STREAM, EntropyCoded
from .lossless import pack as pack_bytes
from .lossless import unpack as unpack_bytes
from .payload import Payload, PayloadError, check_codec, expect_shape

__all__ = ["CONTEXT", "FALLBACK", "ContextCoded", "pack", "unpack"]

#: The coder's name (meta value and ``entropy=``).
CONTEXT = "context"
#: The byte coder a context-coded codec falls back to.
FALLBACK = "zlib"


def pack(p: Payload, spec: SymbolSpec) -> Payload | None:
    """``p`` with its codes context-coded, or None where the stream would be refused."""
    if any(k in p.meta for k in (CODER_META, LAYOUT_META, NBITS_META)) \
            or set(p.buffers) != {spec.buffer, *spec.side}:
        return None
    size = int(np.prod(p.shape))
    codes = bitpack.unpack(p.buffers[spec.buffer], spec.width, size)
    stream = symbols.encode(codes, spec.alphabet)
    if not symbols.fits(size, stream.size):
        return None
    buffers = {STREAM: stream, **{name: p.buffers[name] for name in spec.side}}
    nbytes = sum(int(b.nbytes) for b in buffers.values())
    meta = {**p.meta, CODER_META: CONTEXT, NBITS_META: int(p.nbits)}
    return Payload(p.codec, tuple(p.shape), meta, buffers, nbits=8 * nbytes, version=p.version)


def unpack(p: Payload, spec: SymbolSpec) -> Payload:
    """Undo :func:`pack` strictly: the codec's own payload, or :class:`PayloadError`."""
    if p.meta.get(CODER_META) != CONTEXT or LAYOUT_META in p.meta:
        raise PayloadError("payload is not context-coded")
    if set(p.buffers) != {STREAM, *spec.side}:
        raise PayloadError(f"context-coded {p.codec} payload must carry exactly "
                           f"{', '.join((STREAM, *spec.side))}")
    stream = p.buffers[STREAM]
    if stream.dtype != np.uint8 or stream.ndim != 1:
        raise PayloadError(f"context-coded payload's {STREAM!r} must be flat uint8")
    nbytes = sum(int(b.nbytes) for b in p.buffers.values())
    if p.nbits != 8 * nbytes:
        raise PayloadError(f"context-coded payload declares {p.nbits} bits; it carries "
                           f"{8 * nbytes}")
    size = expect_shape(p)
    nbits = p.meta.get(NBITS_META)
    if isinstance(nbits, bool) or not isinstance(nbits, int) \
            or not 0 <= nbits <= size * spec.width + 8 * nbytes:
        raise PayloadError(f"context-coded payload's original nbits {nbits!r} does not fit")
    codes = symbols.decode(stream, spec.alphabet, size)  # count bounded by the stream first
    buffers = {spec.buffer: bitpack.pack(codes, spec.width),
               **{name: p.buffers[name] for name in spec.side}}
    meta = {k: v for k, v in p.meta.items() if k not in (CODER_META, NBITS_META)}
    return Payload(p.codec, tuple(p.shape), meta, buffers, nbits=nbits, version=p.version)


class ContextCoded(EntropyCoded):
    """A codec whose payloads are context-coded (or zlib-coded) where that shrinks them.

    ``encode`` sends the smaller of :func:`pack` and zlib; ``decode`` accepts either (or none).
    """

    def __init__(self, codec: Codec) -> None:  # noqa: D107  (the class doc says it)
        self._wrap(codec, "ContextCoded")
        self.coder = CONTEXT
        self.spec = codec.symbol_spec()

    def __repr__(self) -> str:
        return f"ContextCoded({self.codec!r})"

    def encode(self, x: np.ndarray, rng: np.random.Generator | None = None) -> Payload:
        """The codec's payload of ``x``, coded by whichever of context and zlib is smaller."""
        raw = self.codec.encode(x, rng)
        zipped = pack_bytes(raw, FALLBACK)
        coded = pack(raw, self.spec) if self.spec is not None else None
        if coded is not None and coded.nbits < zipped.nbits:
            return coded
        return zipped

    def decode(self, p: Payload) -> np.ndarray:
        """Undo the context or zlib coding (strictly) and decode."""
        check_codec(p, self.name)
        if p.meta.get(CODER_META) == CONTEXT:
            if self.spec is None:
                raise PayloadError(f"{self.name} payloads are never context-coded")
            return self.codec.decode(unpack(p, self.spec))
        return self.codec.decode(unpack_bytes(p, FALLBACK))
