"""Low-precision model codecs: ``int8`` and ``int4``, nearest rounding on per-bucket ranges.

Buckets of :data:`BUCKET` coordinates (the last padded with its last value) go through
``uniform`` with nearest rounding on their own float32 range: error at most half a step,
8.25 (4.25) bits a coordinate with the ranges; deterministic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .base import Codec, Payload, PayloadError, check_finite
from .registry import register
from .uniform import Uniform

__all__ = ["BUCKET", "Int8", "Int4"]

#: Coordinates that share one range.
BUCKET = 256


class _Rounded(Codec):
    """``bits``-bit nearest rounding of any array on per-bucket ranges (see the module)."""

    bits: ClassVar[int] = 8

    def _rows(self) -> Uniform:
        return Uniform(bits=self.bits, stochastic=False)

    def encode(self, x: np.ndarray, rng: np.random.Generator | None = None) -> Payload:
        """Round ``x`` (float32, finite, any shape) to ``bits`` bits per coordinate."""
        arr = check_finite(x)
        flat = np.ascontiguousarray(arr, dtype=np.float32).reshape(-1)
        if not flat.size:
            return self.payload(arr.shape, {}, 0)
        rows = -(-flat.size // BUCKET)
        padded = np.pad(flat, (0, rows * BUCKET - flat.size), mode="edge")
        inner = self._rows().encode(padded.reshape(rows, BUCKET))
        return self.payload(arr.shape, dict(inner.buffers), inner.nbits)

    def decode(self, p: Payload) -> np.ndarray:
        """Widen the codes back to float32 in the payload's shape."""
        size = self.open_payload(p)
        if not size:
            if p.buffers:
                raise PayloadError(f"{self.name} payload of no elements carries buffers")
            return np.zeros(p.shape, dtype=np.float32)
        rows = -(-size // BUCKET)
        inner = Payload("uniform", (rows, BUCKET), {"bits": self.bits, "per_channel": 0,
                                                    "dither_seed": None, "entropy": "none"},
                        dict(p.buffers), nbits=p.nbits, version=p.version)
        try:
            values = self._rows().decode(inner)
        except PayloadError as err:
            raise PayloadError(str(err).replace("uniform", self.name, 1)) from None
        return values.reshape(-1)[:size].reshape(p.shape)


@register("int8")
@dataclass(frozen=True)
class Int8(_Rounded):
    """8 bits per coordinate, nearest rounding on ranges of 256 coordinates."""

    bits: ClassVar[int] = 8


@register("int4")
@dataclass(frozen=True)
class Int4(_Rounded):
    """4 bits per coordinate, nearest rounding on ranges of 256 coordinates."""

    bits: ClassVar[int] = 4
