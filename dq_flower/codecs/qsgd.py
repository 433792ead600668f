"""QSGD (Alistarh et al., 2017): per-bucket norm and stochastic levels, unbiased."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from . import bitpack
from .base import (
    BUCKET_RANGE,
    Codec,
    SymbolSpec,
    bucket_blocks,
    flat_input,
    int_param,
    n_buckets,
    require_rng,
    stochastic_floor,
)
from .payload import Payload, PayloadError, expect_buffer, expect_floats, open_payload
from .registry import register

__all__ = ["QSGD", "bucket_norms", "qsgd_variance_bound"]


def bucket_norms(v: np.ndarray) -> np.ndarray:
    """Euclidean norm of each row of ``v`` (float32), without float32 overflow or underflow.

    Rows whose float32 sum of squares overflows or may have underflowed are recomputed in
    float64; a rounded norm is then nudged up so that it never falls below the true one.
    """
    with np.errstate(over="ignore", invalid="ignore"):
        sq = np.einsum("ij,ij->i", v, v)
    redo = ~np.isfinite(sq) | (sq < 1e-30)
    norms = np.sqrt(sq)
    if redo.any():
        sub = np.flatnonzero(redo)
        wide = v[sub].astype(np.float64)
        exact = np.sqrt(np.einsum("ij,ij->i", wide, wide))
        with np.errstate(over="ignore"):
            rounded = exact.astype(np.float32)
        if not np.isfinite(rounded).all():
            raise ValueError("a bucket's norm exceeds float32; rescale the input")
        low = rounded < exact
        rounded[low] = np.nextafter(rounded[low], np.float32(np.inf))
        norms[sub] = rounded
    return norms


@register("qsgd")
@dataclass(frozen=True)
class QSGD(Codec):
    """QSGD with ``levels`` (``s``) levels per sign and one float32 norm per bucket.

    Per bucket ``v`` with norm ``n = ||v||_2``, coordinate ``i`` is sent as
    ``sign(v_i) * l_i`` with ``l_i`` the stochastic rounding of ``s * |v_i| / n`` to an
    integer in ``0..s``, coded as ``l_i * sign + s`` in ``ceil(log2(2s + 1))`` bits; the decoder
    returns ``n * sign * l_i / s``. Unbiased; per bucket of ``d`` coordinates the variance is
    at most ``min(d / s**2, sqrt(d) / s) * ||v||**2``. ``nbits = D * ceil(log2(2s + 1)) +
    32 * n_buckets``.

    Parameters
    ----------
    levels : int
        Quantization levels ``s`` per sign, 1 to 127 (default 7: 15 values, 4-bit codes).
    bucket : int
        Coordinates per bucket (each gets its own norm; default 128); the last bucket may
        be shorter. With the defaults the variance is at most ``1.6 ||v||**2``.
    """

    levels: int = int_param("levels", 7, 1, 127)
    bucket: int = int_param("bucket", 128, *BUCKET_RANGE)
    meta_fields = ("levels", "bucket")

    @property
    def width(self) -> int:
        """Bits per coordinate, ``ceil(log2(2 * levels + 1))``."""
        return (2 * self.levels).bit_length()

    def nbits_for(self, size: int) -> int:
        """Exact payload bits for ``size`` coordinates."""
        return size * self.width + 32 * n_buckets(size, self.bucket)

    def symbol_spec(self) -> SymbolSpec:
        """The codes ``0 .. 2 s`` (``s`` is level 0) in ``codes``; the norms beside them."""
        return SymbolSpec("codes", self.width, 2 * self.levels + 1, ("norms",))

    def encode(self, x: np.ndarray, rng: np.random.Generator | None = None) -> Payload:
        """Quantize ``x`` (any shape) bucket by bucket; ``rng`` drives the rounding."""
        flat, shape = flat_input(x)
        rng = require_rng(rng, self.name)
        s = self.levels
        size = flat.size
        codes = np.empty(size, dtype=np.uint8)
        norms = np.empty(n_buckets(size, self.bucket), dtype=np.float32)
        for b0, b1, i0, i1 in bucket_blocks(size, self.bucket):
            v = flat[i0:i1].reshape(b1 - b0, -1)
            n = bucket_norms(v)
            gain64 = np.divide(float(s), n.astype(np.float64), out=np.zeros(n.size), where=n > 0)
            # s + sign(v) * round_stochastic(s |v| / n) has the law of
            # round_stochastic(s + s v / n): one rounding of a value in [0, 2s].
            if (gain64 > 1e30).any():  # tiny norms: s / n overflows float32
                a = (v.astype(np.float64) * gain64[:, None]).astype(np.float32)
            else:
                a = v * gain64.astype(np.float32)[:, None]
            a += np.float32(s)
            codes[i0:i1] = stochastic_floor(a, rng, 2 * s).reshape(-1)
            norms[b0:b1] = n
        buffers = {"codes": bitpack.pack(codes, self.width), "norms": norms}
        return self.payload(shape, buffers, self.nbits_for(size))

    def decode(self, p: Payload) -> np.ndarray:
        """Return ``norm * (code - s) / s`` per coordinate, float32 in the payload's shape."""
        size = open_payload(p, self, self.nbits_for)
        packed = expect_buffer(p, "codes", "uint8", bitpack.packed_nbytes(size, self.width))
        norms = expect_floats(p, "norms", n_buckets(size, self.bucket))
        if (norms < 0).any():
            raise PayloadError("qsgd payload has negative norms")
        codes = bitpack.unpack(packed, self.width, size)
        if size and int(codes.max()) > 2 * self.levels:
            raise PayloadError(f"qsgd payload has codes above 2 * levels = {2 * self.levels}")
        out = np.empty(size, dtype=np.float32)
        step = norms / np.float32(self.levels)
        for b0, b1, i0, i1 in bucket_blocks(size, self.bucket):
            blk = out[i0:i1].reshape(b1 - b0, -1)
            blk[...] = codes[i0:i1].reshape(b1 - b0, -1)
            blk -= np.float32(self.levels)
            blk *= step[b0:b1, None]
        return out.reshape(p.shape)


def qsgd_variance_bound(v: np.ndarray, levels: int, bucket: int) -> float:
    """QSGD's bound on ``E||Q(v) - v||**2``: per bucket ``min(d/s**2, sqrt(d)/s) ||v_b||**2``."""
    flat = np.asarray(v, dtype=np.float64).reshape(-1)
    total = 0.0
    for start in range(0, flat.size, bucket):
        part = flat[start : start + bucket]
        d = part.size
        total += min(d / levels**2, math.sqrt(d) / levels) * float(part @ part)
    return total
