"""The model codecs: ``identity`` (float32), ``fp16``, ``int8`` and ``int4``.

``fp16`` casts through torch where installed (several times faster), else numpy (the same
round-to-nearest-even bits): a client without PyTorch has every codec. ``int8`` and ``int4``
round to nearest on per-bucket ranges: buckets of :data:`BUCKET` coordinates (the last
padded with its last value) go through ``uniform`` with nearest rounding on their own
float32 range: error at most half a step, 8.25 (4.25) bits a coordinate with the ranges;
deterministic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .base import Codec, check_finite, flat_input
from .payload import Payload, PayloadError, expect_buffer, expect_floats, open_payload
from .registry import register
from .uniform import Uniform

__all__ = ["BUCKET", "Identity", "Fp16", "Int8", "Int4"]

#: Coordinates that share one range.
BUCKET = 256


@register("identity")
@dataclass(frozen=True)
class Identity(Codec):
    """Float32 values as they are: 32 bits per coordinate, lossless."""

    lossless = True

    def encode(self, x: np.ndarray, rng: np.random.Generator | None = None) -> Payload:
        """Carry ``x`` as float32 bytes."""
        flat, shape = flat_input(x)
        return self.payload(shape, {"values": flat.copy()}, 32 * flat.size)

    def decode(self, p: Payload) -> np.ndarray:
        """Return the carried float32 values in the payload's shape."""
        size = open_payload(p, self, lambda n: 32 * n)
        return expect_floats(p, "values", size).astype(np.float32, copy=True).reshape(p.shape)


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
        flat, shape = flat_input(x)
        if flat.size and (flat.min() < -_HALF_MAX or flat.max() > _HALF_MAX):
            flat = np.clip(flat, -_HALF_MAX, _HALF_MAX)
        half = _to_half(flat)
        return self.payload(shape, {"values": half}, 16 * half.size)

    def decode(self, p: Payload) -> np.ndarray:
        """Widen the carried float16 values to float32 (refusing NaN or inf)."""
        size = open_payload(p, self, lambda n: 16 * n)
        values = expect_buffer(p, "values", "float16", size).astype(np.float32)
        try:
            check_finite(values)
        except ValueError:
            raise PayloadError("fp16 payload 'values' holds NaN or inf") from None
        return values.reshape(p.shape)


class _Rounded(Codec):
    """``bits``-bit nearest rounding of any array on per-bucket ranges (see the module)."""

    bits: ClassVar[int] = 8

    def _rows(self) -> Uniform:
        return Uniform(bits=self.bits, stochastic=False)

    def encode(self, x: np.ndarray, rng: np.random.Generator | None = None) -> Payload:
        """Round ``x`` (float32, finite, any shape) to ``bits`` bits per coordinate."""
        flat, shape = flat_input(x)
        if not flat.size:
            return self.payload(shape, {}, 0)
        rows = -(-flat.size // BUCKET)
        padded = np.pad(flat, (0, rows * BUCKET - flat.size), mode="edge")
        inner = self._rows().encode(padded.reshape(rows, BUCKET))
        return self.payload(shape, dict(inner.buffers), inner.nbits)

    def decode(self, p: Payload) -> np.ndarray:
        """Widen the codes back to float32 in the payload's shape."""
        size = open_payload(p, self)
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
