"""Codec and Payload: the contract every codec follows.

A :class:`Codec` maps a float32 array to a :class:`Payload` (packed bytes plus side
information) and back. A payload knows its exact wire size in bits (``nbits``) and travels
inside a Flower ``ArrayRecord`` as raw bytes, with one small JSON header array.

This module is the contract's one import path (``from .base import ...``, as every codec
module does); its parts live in

- :mod:`.payload`: :class:`Payload`, its wire record and its limits;
- :mod:`.header`: the strict, bounded parser of a record's JSON header;
- :mod:`.checks`: what decoders check of a payload before they allocate;
- :mod:`.kernels`: numeric helpers (input checks, random draws, bucket loops);
- :mod:`.errors`: :class:`PayloadError`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar, NamedTuple

import numpy as np

from .checks import (
    expect_buffer,
    expect_nbits,
    expect_shape,
    meta_equal,
    meta_int,
    require_finite,
)
from .errors import PayloadError
from .header import MAX_HEADER_BYTES, MAX_HEADER_DEPTH
from .kernels import (
    bucket_blocks,
    bucket_chunks,
    check_finite,
    check_int,
    flat_input,
    n_buckets,
    random_u16,
    require_rng,
    stochastic_floor,
)
from .payload import ALLOWED_DTYPES, MAX_ELEMENTS, PAYLOAD_VERSION, Payload

__all__ = [
    "PAYLOAD_VERSION",
    "MAX_ELEMENTS",
    "MAX_HEADER_BYTES",
    "MAX_HEADER_DEPTH",
    "ALLOWED_DTYPES",
    "Codec",
    "SymbolSpec",
    "Payload",
    "PayloadError",
    "check_finite",
    "check_int",
    "expect_buffer",
    "meta_int",
    "meta_equal",
    "expect_nbits",
    "expect_shape",
    "require_finite",
    "require_rng",
    "random_u16",
    "stochastic_floor",
    "bucket_chunks",
    "bucket_blocks",
    "n_buckets",
    "flat_input",
]


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

    Subclasses are frozen dataclasses whose fields are the codec's parameters; they validate
    them in ``__post_init__`` and raise ``ValueError`` naming the field.
    """

    #: Registry name, set by :func:`dq_flower.codecs.registry.register`.
    name: ClassVar[str] = ""
    #: True when ``E[decode(encode(x))] != x``; such codecs are used with error feedback.
    biased: ClassVar[bool] = False
    #: True when ``decode(encode(x)) == x`` exactly.
    lossless: ClassVar[bool] = False

    @abstractmethod
    def encode(self, x: np.ndarray, rng: np.random.Generator | None = None) -> Payload:
        """Encode ``x`` (float32, finite) into a payload; random choices draw from ``rng``."""

    @abstractmethod
    def decode(self, p: Payload) -> np.ndarray:
        """Decode a payload to a float32 array of its declared shape.

        Every decoder checks that the buffers match the declared shape before allocating its
        output, so a payload whose bytes do not back its declared size is refused cheaply.
        The declared size itself (up to :data:`MAX_ELEMENTS`) is the caller's to bound:
        some payloads are legitimately far smaller than their output (sparse or low-rank
        gradients, entropy-coded data), so call :meth:`Payload.expect_elements` (or check
        ``p.shape``) first.
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

    def roundtrip(self, x: np.ndarray, rng: np.random.Generator | None = None) -> np.ndarray:
        """Return ``decode(encode(x, rng))``."""
        return self.decode(self.encode(x, rng))
