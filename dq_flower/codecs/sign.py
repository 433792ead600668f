"""One-bit sign codecs: ``sign`` (signSGD, majority vote) and ``ef-sign`` (scaled sign).

Bit 1 means negative (zero counts as positive). ``sign`` decodes to +-1 (the server takes a
majority vote); ``ef-sign`` carries ``||p||_1 / D`` and decodes to +-scale, for use inside
:class:`~.ErrorFeedback` (which codes ``p = v + e``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import bitpack
from .base import (
    Codec,
    Payload,
    PayloadError,
    bucket_chunks,
    expect_buffer,
    expect_floats,
    expect_nbits,
    flat_input,
)
from .registry import register

__all__ = ["Sign", "EFSign", "sign_bits", "abs_mean"]

_CHUNK = 1 << 17  # elements per block; a multiple of 8, so blocks pack to whole bytes


def sign_bits(flat: np.ndarray) -> np.ndarray:
    """Pack ``flat < 0`` MSB-first into ``ceil(D / 8)`` bytes, block by block."""
    out = np.empty(bitpack.packed_nbytes(flat.size, 1), dtype=np.uint8)
    for s, e in bucket_chunks(flat.size, 1, _CHUNK):
        out[s // 8 : (e + 7) // 8] = np.packbits(flat[s:e] < 0)
    return out


def abs_mean(flat: np.ndarray) -> np.float32:
    """``||flat||_1 / D`` as float32 (float32 block sums, accumulated in float64)."""
    if flat.size == 0:
        return np.float32(0.0)
    total = 0.0
    buf = np.empty(min(_CHUNK, flat.size), dtype=np.float32)
    for s, e in bucket_chunks(flat.size, 1, _CHUNK):
        with np.errstate(over="ignore"):
            part = float(np.abs(flat[s:e], out=buf[: e - s]).sum())
        if not np.isfinite(part):  # float32 overflow: redo this block in float64
            part = float(buf[: e - s].sum(dtype=np.float64))
        total += part
    return np.float32(total / flat.size)


def _decode_bits(codec: Codec, p: Payload, size: int, low: float, high: float) -> np.ndarray:
    packed = expect_buffer(p, "bits", "uint8", bitpack.packed_nbytes(size, 1))
    if size and not bitpack.padding_is_zero(packed, 1, size):
        raise PayloadError(f"{codec.name} payload has non-zero padding bits")
    table = np.array([high, low], dtype=np.float32)
    return bitpack.unpack_to(packed, 1, size, table).reshape(p.shape)


@register("sign")
@dataclass(frozen=True)
class Sign(Codec):
    """Plain sign: 1 bit per coordinate, decoded to +-1 (0 maps to +1). ``nbits = D``."""

    biased = True

    def encode(self, x: np.ndarray, rng: np.random.Generator | None = None) -> Payload:
        """Send the sign bit of each coordinate."""
        flat, shape = flat_input(x)
        return self.payload(shape, {"bits": sign_bits(flat)}, flat.size)

    def decode(self, p: Payload) -> np.ndarray:
        """Return +-1 per coordinate, float32 in the payload's shape."""
        size = self.open_payload(p)
        expect_nbits(p, size)
        return _decode_bits(self, p, size, -1.0, 1.0)


@register("ef-sign")
@dataclass(frozen=True)
class EFSign(Codec):
    """Scaled sign (EF-signSGD): sign bits and ``scale = ||p||_1 / D``. ``nbits = D + 32``.

    Decodes to ``+-scale``. Biased; wrap it in :class:`~.ErrorFeedback` for the memory.
    """

    biased = True

    def encode(self, x: np.ndarray, rng: np.random.Generator | None = None) -> Payload:
        """Send the sign bits and the mean absolute value."""
        flat, shape = flat_input(x)
        buffers = {"bits": sign_bits(flat), "scale": np.array([abs_mean(flat)], np.float32)}
        return self.payload(shape, buffers, flat.size + 32)

    def decode(self, p: Payload) -> np.ndarray:
        """Return +-scale per coordinate, float32 in the payload's shape."""
        size = self.open_payload(p)
        expect_nbits(p, size + 32)
        scale = expect_floats(p, "scale", 1)
        s = float(scale[0])
        if s < 0:
            raise PayloadError("ef-sign payload has a negative scale")
        return _decode_bits(self, p, size, -s, s)
