"""Lossless and half-precision float codecs: ``identity`` (float32) and ``fp16``.

``fp16`` casts through torch where installed (several times faster), else numpy (the same
round-to-nearest-even bits): a client without PyTorch has every codec.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .base import (
    Codec,
    Payload,
    PayloadError,
    check_finite,
    expect_buffer,
    expect_floats,
    expect_nbits,
)
from .registry import register


@register("identity")
@dataclass(frozen=True)
class Identity(Codec):
    """Float32 values as they are: 32 bits per coordinate, lossless."""

    lossless = True

    def encode(self, x: np.ndarray, rng: np.random.Generator | None = None) -> Payload:
        """Carry ``x`` as float32 bytes."""
        arr = check_finite(x)
        flat = np.ascontiguousarray(arr.reshape(-1))
        return self.payload(arr.shape, {"values": flat.copy()}, 32 * flat.size)

    def decode(self, p: Payload) -> np.ndarray:
        """Return the carried float32 values in the payload's shape."""
        size = self.open_payload(p)
        expect_nbits(p, 32 * size)
        values = expect_floats(p, "values", size)
        return values.astype(np.float32, copy=True).reshape(p.shape)


_HALF_MAX = 65504.0


def _to_half(flat: np.ndarray) -> np.ndarray:
    """``flat`` (float32) rounded to float16, through torch where it can be imported."""
    try:
        import torch
    except ImportError:
        return flat.astype(np.float16)
    return torch.from_numpy(flat).half().numpy()


@register("fp16")
@dataclass(frozen=True)
class Fp16(Codec):
    """IEEE half precision: 16 bits per coordinate (values beyond +-65504 saturate)."""

    def encode(self, x: np.ndarray, rng: np.random.Generator | None = None) -> Payload:
        """Round ``x`` to float16, saturating out-of-range values."""
        arr = check_finite(x)
        flat = np.ascontiguousarray(arr.reshape(-1))
        if flat.size and (flat.min() < -_HALF_MAX or flat.max() > _HALF_MAX):
            flat = np.clip(flat, -_HALF_MAX, _HALF_MAX)
        half = _to_half(flat)
        return self.payload(arr.shape, {"values": half}, 16 * half.size)

    def decode(self, p: Payload) -> np.ndarray:
        """Widen the carried float16 values to float32 (refusing NaN or inf)."""
        size = self.open_payload(p)
        expect_nbits(p, 16 * size)
        values = expect_buffer(p, "values", "float16", size).astype(np.float32)
        try:
            check_finite(values)
        except ValueError:
            raise PayloadError("fp16 payload 'values' holds NaN or inf") from None
        return values.reshape(p.shape)
