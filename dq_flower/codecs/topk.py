"""Top-k sparsification: the ``k`` largest-magnitude coordinates, values as float32.

Positions go as sorted indices of ``ceil(log2 D)`` bits each, or as a ``D``-bit mask when
that is smaller; ``nbits = 32 k + min(k * ceil(log2 D), D)``. Biased: use it inside
:class:`~.ErrorFeedback`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from . import bitpack
from .base import (
    Codec,
    Payload,
    PayloadError,
    expect_buffer,
    expect_floats,
    expect_nbits,
    flat_input,
    meta_equal,
)
from .registry import register

__all__ = ["TopK", "topk_indices"]


def topk_indices(mag: np.ndarray, k: int) -> np.ndarray:
    """Sorted indices of the ``k`` largest entries of ``mag`` (exact; ties broken arbitrarily).

    Large inputs: a strided sample's threshold picks candidates for ``np.argpartition``
    (the full array where the sample was unlucky).
    """
    n = mag.size
    if k >= n:
        return np.arange(n, dtype=np.int64)
    if k <= 0:
        return np.zeros(0, dtype=np.int64)
    if n > (1 << 20):
        sample = mag[:: max(1, n // (1 << 16))]
        want = min(sample.size, int(1.25 * k * sample.size / n) + 32)
        threshold = np.partition(sample, sample.size - want)[sample.size - want]
        cand = np.flatnonzero(mag >= threshold)
        if k <= cand.size <= max(4 * k, 1 << 16):
            part = np.argpartition(mag[cand], cand.size - k)[cand.size - k :]
            return np.sort(cand[part])
    return np.sort(np.argpartition(mag, n - k)[n - k :]).astype(np.int64)


@register("topk")
@dataclass(frozen=True)
class TopK(Codec):
    """Keep the ``ceil(ratio * D)`` (at least 1) largest-magnitude coordinates.

    Parameters
    ----------
    ratio : float
        Fraction of coordinates kept, in (0, 1].
    """

    ratio: float = 0.01
    biased = True

    def __post_init__(self) -> None:
        if (isinstance(self.ratio, bool) or not isinstance(self.ratio, (int, float))
                or not 0 < self.ratio <= 1):
            raise ValueError(f"ratio must be a number in (0, 1], got {self.ratio!r}")

    def k_for(self, size: int) -> int:
        """Number of coordinates kept out of ``size``."""
        if size == 0:
            return 0
        return min(size, max(1, math.ceil(self.ratio * size - 1e-9)))

    @staticmethod
    def index_bits(size: int) -> int:
        """Bits per index, ``ceil(log2(size))``, at least 1."""
        return max(1, (size - 1).bit_length())

    def layout(self, size: int) -> tuple[int, str, int]:
        """Return ``(k, "index" or "mask", nbits)`` for ``size`` coordinates."""
        k = self.k_for(size)
        index_cost = k * self.index_bits(size)
        mode = "index" if index_cost < size else "mask"
        return k, mode, 32 * k + min(index_cost, size)

    def encode(self, x: np.ndarray, rng: np.random.Generator | None = None) -> Payload:
        """Select the top-k coordinates of ``x`` (any shape); deterministic."""
        flat, shape = flat_input(x)
        size = flat.size
        k, mode, nbits = self.layout(size)
        idx = topk_indices(np.abs(flat), k)
        values = flat[idx].astype(np.float32)
        if mode == "index":
            where = bitpack.pack_wide(idx, self.index_bits(size))
        else:
            mask = np.zeros(size, dtype=bool)
            mask[idx] = True
            where = np.packbits(mask)
        return self.payload(shape, {"values": values, "where": where}, nbits, k=k, mode=mode)

    def decode(self, p: Payload) -> np.ndarray:
        """Scatter the values back, zeros elsewhere; float32 in the payload's shape.

        Buffers are checked against the declared shape before the output is allocated; callers
        bound the declared size first (:meth:`Payload.expect_elements`).

        Raises
        ------
        PayloadError
            On any inconsistency between the header, the buffers and this codec.
        """
        size = self.open_payload(p)
        k, mode, nbits = self.layout(size)
        meta_equal(p, "k", k)
        meta_equal(p, "mode", mode)
        expect_nbits(p, nbits)
        values = expect_floats(p, "values", k)
        if mode == "index":
            width = self.index_bits(size)
            where = expect_buffer(p, "where", "uint8", bitpack.packed_nbytes(k, width))
            if k and not bitpack.padding_is_zero(where, width, k):
                raise PayloadError("topk payload has non-zero padding bits")
            idx = bitpack.unpack_wide(where, width, k)
            if k and (idx[-1] >= size or (k > 1 and (np.diff(idx) <= 0).any())):
                raise PayloadError("topk indices must be strictly increasing and below D")
        else:
            where = expect_buffer(p, "where", "uint8", bitpack.packed_nbytes(size, 1))
            if size and not bitpack.padding_is_zero(where, 1, size):
                raise PayloadError("topk payload has non-zero padding bits")
            idx = np.flatnonzero(np.unpackbits(where, count=size))
            if idx.size != k:
                raise PayloadError(f"topk mask marks {idx.size} coordinates, expected {k}")
        out = np.zeros(size, dtype=np.float32)
        out[idx] = values
        return out.reshape(p.shape)
