"""Codec: the contract every codec follows, the numeric kernels the codecs share, ErrorFeedback.

The kernels are input checks, random draws and bucket loops (pure numpy, vectorised).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar, NamedTuple

import numpy as np

from dq_flower.config import knob

from .bitpack import bucket_chunks
from .payload import Payload, check_int

__all__ = ["Codec", "SymbolSpec", "int_param", "check_finite", "require_rng", "random_u16",
           "stochastic_floor", "BUCKET_RANGE", "bucket_blocks", "n_buckets",
           "flat_input", "ErrorFeedback"]


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


def int_param(name: str, default: int | None, lo: int, hi: int | None = None) -> Any:
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
    encoders build payloads with :meth:`payload`, decoders start with
    :func:`~.payload.open_payload`.
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

    def payload(self, shape: tuple[int, ...], buffers: dict[str, np.ndarray], nbits: int,
                **meta: Any) -> Payload:
        """A payload of this codec, its header meta: :attr:`meta_fields`, then ``meta``."""
        own = {key: getattr(self, key) for key in self.meta_fields}
        return Payload(self.name, shape, {**own, **meta}, buffers, nbits=nbits)

    def roundtrip(self, x: np.ndarray, rng: np.random.Generator | None = None) -> np.ndarray:
        """Return ``decode(encode(x, rng))``."""
        return self.decode(self.encode(x, rng))


_RESIDUAL = "residual"
_CODEC_PREFIX = "codec/"


class ErrorFeedback:
    """Wrap ``codec`` with a residual ``e`` (zero at first).

    Residual memory around any codec (Seide et al. 2014; Karimireddy et al. 2019):
    ``encode(x)`` codes ``p = x + e`` and keeps ``e' = p - decode(payload)``, so that
    ``x + e == decode(payload) + e'`` at every step (up to float32 rounding): nothing the codec
    drops is lost, it is sent later. The state (the residual, and the wrapped codec's own
    state such as PowerSGD's warm start) goes in and out as a dict of numpy arrays, for
    Flower's ``Context.state``.

    Parameters
    ----------
    codec : Codec
        The codec to wrap (typically a biased one: sign, ef-sign, topk, powersgd, bingrad).
    """

    def __init__(self, codec: Codec) -> None:
        if not isinstance(codec, Codec):
            raise ValueError(f"ErrorFeedback wraps a Codec, got {type(codec).__name__}")
        self.codec = codec
        self.residual: np.ndarray | None = None

    @property
    def name(self) -> str:
        """The wrapped codec's registry name (payloads carry it)."""
        return self.codec.name

    def __repr__(self) -> str:
        return f"ErrorFeedback({self.codec!r})"

    def encode(self, x: np.ndarray, rng: np.random.Generator | None = None) -> Payload:
        """Encode ``x + residual`` and keep the new residual.

        Raises ``ValueError`` if ``x`` holds NaN or inf or its shape differs from the residual's.
        """
        arr = check_finite(x)
        if self.residual is None:
            target = arr.astype(np.float32, copy=True)
        else:
            if self.residual.shape != arr.shape:
                raise ValueError(f"input shape {arr.shape} differs from the residual's "
                                 f"{self.residual.shape}; call reset() when the model changes")
            target = arr + self.residual
        payload = self.codec.encode(target, rng)
        target -= self.codec.decode(payload)
        self.residual = target
        return payload

    def decode(self, p: Payload) -> np.ndarray:
        """Decode with the wrapped codec (the residual lives on the sender only)."""
        return self.codec.decode(p)

    def reset(self) -> None:
        """Drop the residual (and the codec's own state, if it has any)."""
        self.residual = None
        if hasattr(self.codec, "reset"):
            self.codec.reset()

    def state_dict(self) -> dict[str, np.ndarray]:
        """The residual (if any) and the codec's state, as float32 arrays."""
        state: dict[str, np.ndarray] = {}
        if self.residual is not None:
            state[_RESIDUAL] = self.residual.copy()
        if hasattr(self.codec, "state_dict"):
            for key, value in self.codec.state_dict().items():
                state[_CODEC_PREFIX + key] = value
        return state

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        """Restore what :meth:`state_dict` returned.

        No ``residual`` means zero; without ``codec/`` keys the codec keeps its own state.
        Unknown keys or a residual with NaN or inf raise ``ValueError``.
        """
        unknown = [k for k in state if k != _RESIDUAL and not k.startswith(_CODEC_PREFIX)]
        if unknown:
            raise ValueError(f"unknown error-feedback state keys {unknown}")
        residual = state.get(_RESIDUAL)
        codec_state = {k[len(_CODEC_PREFIX):]: v for k, v in state.items()
                       if k.startswith(_CODEC_PREFIX)}
        if codec_state and not hasattr(self.codec, "load_state_dict"):
            raise ValueError(f"codec {self.codec.name!r} keeps no state")
        new_residual = None if residual is None else check_finite(residual, "residual").copy()
        if codec_state and hasattr(self.codec, "load_state_dict"):  # checked above
            self.codec.load_state_dict(codec_state)
        self.residual = new_residual
