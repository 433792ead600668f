"""Sign codecs: ``sign`` (signSGD, majority vote), ``ef-sign`` (scaled sign), ``terngrad``.

TernGrad (Wen et al., 2017): ternary stochastic gradients with one float32 scale. For the
one-bit codecs, bit 1 means negative (zero counts as positive). ``sign`` decodes to +-1
(the server takes a majority vote); ``ef-sign`` carries ``||p||_1 / D`` and decodes to
+-scale, for use inside :class:`~.ErrorFeedback` (which codes ``p = v + e``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from dq_flower.config import knob

from . import bitpack
from .base import Codec, SymbolSpec, flat_input, require_rng, stochastic_floor
from .bitpack import bucket_chunks
from .payload import Payload, PayloadError, expect_floats, expect_packed, open_payload
from .registry import register

__all__ = ["Sign", "EFSign", "TernGrad", "sign_bits", "abs_mean"]

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


def _decode_bits(p: Payload, size: int, low: float, high: float) -> np.ndarray:
    packed = expect_packed(p, "bits", 1, size)
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
        size = open_payload(p, self, lambda n: n)
        return _decode_bits(p, size, -1.0, 1.0)


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
        size = open_payload(p, self, lambda n: n + 32)
        s = float(expect_floats(p, "scale", 1)[0])
        if s < 0:
            raise PayloadError("ef-sign payload has a negative scale")
        return _decode_bits(p, size, -s, s)


def _clip(value: Any) -> Any:
    """``value`` if it is a finite number > 0 (kept as given: the payload's meta)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not math.isfinite(value) or value <= 0:
        raise ValueError(f"clip must be a finite number > 0 or None, got {value!r}")
    return value


@register("terngrad")
@dataclass(frozen=True)
class TernGrad(Codec):
    """Ternary codes ``t_i`` in {-1, 0, 1} and a scale ``m = max|v|``; decode ``m * t_i``.

    ``t_i = sign(v_i)`` with probability ``|v_i| / m``, else 0: unbiased for the vector that
    is coded. With ``clip=c``, ``v`` is first clipped to ``[-c * std(v), c * std(v)]`` (the
    paper's gradient clipping), which lowers the variance but makes the codec unbiased for
    the clipped vector only. Codes take 2 bits each (``1 + t_i``); ``nbits = 2 * D + 32``.

    Parameters
    ----------
    clip : float or None
        Clipping factor ``c > 0`` in units of the standard deviation, or None.
    """

    clip: float | None = knob(None, coerce=_clip)
    meta_fields = ("clip",)

    def symbol_spec(self) -> SymbolSpec:
        """The codes ``1 + t`` (0, 1, 2) in ``codes``; the scale beside them."""
        return SymbolSpec("codes", 2, 3, ("scale",))

    def encode(self, x: np.ndarray, rng: np.random.Generator | None = None) -> Payload:
        """Ternarize ``x`` (any shape) with one scale; ``rng`` drives the rounding."""
        flat, shape = flat_input(x)
        rng = require_rng(rng, self.name)
        if self.clip is not None and flat.size:
            std = float(np.std(flat, dtype=np.float64))
            if std > 0:  # a constant vector has nothing to clip (and std 0 would zero it)
                bound = np.float32(min(self.clip * std, float(np.finfo(np.float32).max)))
                flat = np.clip(flat, -bound, bound)
        m = np.float32(np.abs(flat).max()) if flat.size else np.float32(0.0)
        with np.errstate(over="ignore"):
            gain = np.float32(1.0) / m if m > 0 else np.float32(0.0)
        codes = np.empty(flat.size, dtype=np.uint8)
        for s, e in bucket_chunks(flat.size, 1):
            v = flat[s:e]
            # 1 + sign(v) * bernoulli(|v| / m) has the law of round_stochastic(1 + v / m).
            a = v * gain if np.isfinite(gain) else v / m  # 1 / m overflows for tiny m
            a += np.float32(1.0)
            codes[s:e] = stochastic_floor(a, rng, 2)
        buffers = {"codes": bitpack.pack(codes, 2), "scale": np.array([m], dtype=np.float32)}
        return self.payload(shape, buffers, 2 * flat.size + 32)

    def decode(self, p: Payload) -> np.ndarray:
        """Return ``m * (code - 1)``, float32 in the payload's shape."""
        size = open_payload(p, self, lambda n: 2 * n + 32)
        packed = expect_packed(p, "codes", 2, size)
        m = np.float32(expect_floats(p, "scale", 1)[0])
        if m < 0:
            raise PayloadError("terngrad payload has a negative scale")
        table = np.array([-m, 0.0, m, np.nan], dtype=np.float32)
        out = bitpack.unpack_to(packed, 2, size, table)
        if np.isnan(out).any():
            raise PayloadError("terngrad payload holds the invalid code 3")
        return out.reshape(p.shape)
