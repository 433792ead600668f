"""TernGrad (Wen et al., 2017): ternary stochastic gradients with one float32 scale."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from . import bitpack
from .base import (
    Codec,
    Payload,
    PayloadError,
    SymbolSpec,
    bucket_chunks,
    expect_buffer,
    expect_floats,
    expect_nbits,
    flat_input,
    require_rng,
    stochastic_floor,
)
from .registry import register

__all__ = ["TernGrad"]


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

    clip: float | None = None
    meta_fields = ("clip",)

    def __post_init__(self) -> None:
        if self.clip is not None and (isinstance(self.clip, bool) or not isinstance(
                self.clip, (int, float)) or not math.isfinite(self.clip) or self.clip <= 0):
            raise ValueError(f"clip must be a finite number > 0 or None, got {self.clip!r}")

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
        size = self.open_payload(p)
        expect_nbits(p, 2 * size + 32)
        packed = expect_buffer(p, "codes", "uint8", bitpack.packed_nbytes(size, 2))
        scale = expect_floats(p, "scale", 1)
        m = np.float32(scale[0])
        if m < 0:
            raise PayloadError("terngrad payload has a negative scale")
        if size and not bitpack.padding_is_zero(packed, 2, size):
            raise PayloadError("terngrad payload has non-zero padding bits")
        table = np.array([-m, 0.0, m, np.nan], dtype=np.float32)
        out = bitpack.unpack_to(packed, 2, size, table)
        if np.isnan(out).any():
            raise PayloadError("terngrad payload holds the invalid code 3")
        return out.reshape(p.shape)
