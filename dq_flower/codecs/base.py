"""Codec and Payload: the contract every codec follows, and its one import path.

Its parts live in :mod:`.payload` (:class:`Payload`, wire record, limits), :mod:`.header`
(the JSON header parser), :mod:`.checks` (decoder checks), :mod:`.kernels` (numeric
helpers) and :mod:`.errors` (:class:`PayloadError`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple

import numpy as np

from . import checks, kernels
from .checks import *  # noqa: F403  (re-exported: the decoders' checks)
from .checks import expect_nbits, expect_shape, meta_equal
from .errors import PayloadError
from .header import MAX_HEADER_BYTES, MAX_HEADER_DEPTH
from .kernels import *  # noqa: F403  (re-exported: the numeric kernels)
from .payload import ALLOWED_DTYPES, MAX_ELEMENTS, PAYLOAD_VERSION, Payload

__all__ = ["PAYLOAD_VERSION", "MAX_ELEMENTS", "MAX_HEADER_BYTES", "MAX_HEADER_DEPTH",
           "ALLOWED_DTYPES", "Codec", "SymbolSpec", "Payload", "PayloadError", *checks.__all__,
           *kernels.__all__]


class SymbolSpec(NamedTuple):
    """Where a codec's payload keeps its integer codes, for the ``context`` coder.

    ``buffer`` holds one ``width``-bit code per element (:mod:`.bitpack` packing) in
    ``[0, alphabet)``; ``side`` names the payload's other buffers (sent as they are).
    """

    buffer: str
    width: int
    alphabet: int
    side: tuple[str, ...]


class Codec(ABC):
    """Maps float32 arrays to payloads and back.

    Subclasses are frozen dataclasses of checked parameters (``ValueError`` naming the field);
    encoders build payloads with :meth:`payload`, decoders start with :meth:`open_payload`.
    """

    #: Registry name, set by :func:`dq_flower.codecs.registry.register`.
    name: ClassVar[str] = ""
    #: True when ``E[decode(encode(x))] != x``; such codecs are used with error feedback.
    biased: ClassVar[bool] = False
    #: True when ``decode(encode(x)) == x`` exactly.
    lossless: ClassVar[bool] = False
    #: Parameters every payload's meta carries, in this order, and its decoder requires equal.
    meta_fields: ClassVar[tuple[str, ...]] = ()
    @abstractmethod
    def encode(self, x: np.ndarray, rng: np.random.Generator | None = None) -> Payload:
        """Encode ``x`` (float32, finite) into a payload; random choices draw from ``rng``."""

    @abstractmethod
    def decode(self, p: Payload) -> np.ndarray:
        """Decode a payload to a float32 array of its declared shape.

        Buffers are checked against the shape before allocating; the declared size (up to
        :data:`MAX_ELEMENTS`) is the caller's to bound: call :meth:`Payload.expect_elements`.
        """

    def symbol_spec(self) -> SymbolSpec | None:
        """The layout of the payload's codes for the ``context`` coder (None: it has none)."""
        return None

    def check_payload(self, p: Payload) -> None:
        """Raise :class:`PayloadError` unless ``p`` was made by this codec."""
        if p.codec != self.name:
            raise PayloadError(f"payload made by {p.codec!r} given to codec {self.name!r}")
        if p.version != PAYLOAD_VERSION:
            raise PayloadError(f"unknown payload version {p.version!r}")

    def payload(self, shape: tuple[int, ...], buffers: dict[str, np.ndarray], nbits: int,
                **meta: Any) -> Payload:
        """A payload of this codec, its header meta: :attr:`meta_fields`, then ``meta``."""
        own = {key: getattr(self, key) for key in self.meta_fields}
        return Payload(self.name, shape, {**own, **meta}, buffers, nbits=nbits)

    def open_payload(self, p: Payload, nbits: Callable[[int], int] | None = None,
                     ndim: int | None = None) -> int:
        """Check ``p``'s codec, version, shape and :attr:`meta_fields`; return its element count.

        Raises
        ------
        PayloadError
            Another codec or version, a malformed (or not ``ndim``-D) shape, a meta field unlike
            this codec's, or ``p.nbits`` unlike ``nbits(count)`` where ``nbits`` is given.
        """
        self.check_payload(p)
        size = expect_shape(p, ndim)
        for key in self.meta_fields:
            meta_equal(p, key, getattr(self, key))
        if nbits is not None:
            expect_nbits(p, nbits(size))
        return size

    def roundtrip(self, x: np.ndarray, rng: np.random.Generator | None = None) -> np.ndarray:
        """Return ``decode(encode(x, rng))``."""
        return self.decode(self.encode(x, rng))
