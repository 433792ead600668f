"""BinGrad (Xu, Huo, Huang, 2020): two MSE-optimal levels per bucket, 1 bit per coordinate.

Per bucket, levels ``b1 <= b2`` and threshold ``t`` meet the two-level Lloyd-Max conditions
``t = (b1 + b2) / 2``, ``b1 = E[v | v < t]``, ``b2 = E[v | v >= t]`` after ``iters``
iterations from ``t = 0`` (the sign partition, so the error never exceeds the scaled
sign's). Deterministic and biased: use it inside :class:`~.ErrorFeedback`.
``nbits = D + 64 * n_buckets``. :class:`SortedBuckets` (shared with :mod:`~.orq`) makes each
conditional mean a binary search and a 32-element partial sum over block prefix sums.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import bitpack
from .base import (
    BUCKET_RANGE,
    Codec,
    Payload,
    PayloadError,
    bucket_blocks,
    expect_buffer,
    expect_floats,
    flat_input,
    n_buckets,
)
from .kernels import int_param
from .registry import register

__all__ = ["BinGrad", "SortedBuckets", "lloyd_max_2"]

_SUB = 8  # elements per prefix-sum block
_SUB_RANGE = np.arange(_SUB)
#: Elements per block of buckets processed at once (sorting keeps temporaries in L3).
BLOCK_ELEMENTS = 1 << 20


class SortedBuckets:
    """The rows of ``v`` (buckets) sorted, with prefix sums in blocks of 32.

    Parameters
    ----------
    v : numpy.ndarray
        Float32 array ``(n_buckets, bucket)``.
    """

    def __init__(self, v: np.ndarray) -> None:
        self.sorted = np.sort(v, axis=1)
        self.nb, self.size = v.shape
        nsub = -(-self.size // _SUB)
        pad = nsub * _SUB - self.size
        padded = self.sorted if pad == 0 else np.pad(self.sorted, ((0, 0), (0, pad)))
        self._subs = padded.reshape(self.nb, nsub, _SUB)
        with np.errstate(over="ignore"):
            sums = np.einsum("ij->i", padded.reshape(-1, _SUB)).reshape(self.nb, nsub)
        if not np.isfinite(sums).all():  # float32 overflow of a 32-value sum: redo in float64
            sums = padded.reshape(-1, _SUB).sum(axis=1, dtype=np.float64).reshape(self.nb, nsub)
        self._cum = np.zeros((self.nb, nsub + 1), dtype=np.float64)
        self._cum[:, 1:] = sums
        np.add.accumulate(self._cum, axis=1, out=self._cum)  # in place: faster than cumsum
        self._nsub = nsub
        self.rows = np.arange(self.nb)
        self._base = self.rows * self.size

    def count_less(self, t: np.ndarray) -> np.ndarray:
        """Per bucket, the number of values ``< t`` (float32 comparison), by binary search.

        ``t`` has shape ``(n_buckets,)`` or ``(n_buckets, m)`` (``m`` thresholds per bucket).
        """
        t = np.asarray(t, dtype=np.float32)
        base = self._base - 1 if t.ndim == 1 else self._base[:, None] - 1
        flat = self.sorted.reshape(-1)
        pos = np.zeros(t.shape, dtype=np.int64)
        step = 1 << (self.size.bit_length() - 1)
        while step:  # branchless binary search: grow the count bit by bit, ~log2(bucket) steps
            cand = pos + step
            ok = np.take(flat, base + np.minimum(cand, self.size)) < t
            ok &= cand <= self.size
            pos = np.where(ok, cand, pos)
            step >>= 1
        return pos

    def prefix(self, k: np.ndarray) -> np.ndarray:
        """Per bucket, the float64 sum of its ``k`` smallest values (``0 <= k <= bucket``).

        ``k`` has shape ``(n_buckets,)`` or ``(n_buckets, m)``.
        """
        k = np.asarray(k)
        rows = self.rows if k.ndim == 1 else self.rows[:, None]
        block, rest = np.divmod(k, _SUB)
        part = self._subs[rows, np.minimum(block, self._nsub - 1)]
        part = np.where(rest[..., None] > _SUB_RANGE, part, np.float32(0.0))
        # einsum sums short rows far faster than ndarray.sum along a length-8 axis
        return self._cum[rows, block] + np.einsum("...k->...", part)

    def at(self, k: np.ndarray) -> np.ndarray:
        """Per bucket, the ``k``-th smallest value (0-based)."""
        return np.take(self.sorted.reshape(-1), self._base + k)


def lloyd_max_2(sb: SortedBuckets, iters: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Two-level Lloyd-Max per bucket from ``t = 0``; returns float32 ``(t, b1, b2)``."""
    size = sb.size
    total = sb.prefix(np.full(sb.nb, size))
    t = np.zeros(sb.nb, dtype=np.float32)

    def means(t32: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        below = sb.count_less(t32)
        low_sum = sb.prefix(below)
        above = size - below
        b1 = np.divide(low_sum, below, out=np.zeros(sb.nb), where=below > 0)
        b2 = np.divide(total - low_sum, above, out=np.zeros(sb.nb), where=above > 0)
        b1 = np.where(below > 0, b1, b2)  # one side empty: a single level, the mean
        b2 = np.where(above > 0, b2, b1)
        return b1, b2

    for _ in range(iters):
        b1, b2 = means(t)
        t = ((b1 + b2) / 2).astype(np.float32)
    b1, b2 = means(t)
    b2_32 = b2.astype(np.float32)
    # b1 < t <= b2 holds exactly; the minimum only guards against float rounding.
    return t, np.minimum(b1.astype(np.float32), b2_32), b2_32


@register("bingrad")
@dataclass(frozen=True)
class BinGrad(Codec):
    """Binary quantizer with per-bucket Lloyd-Max levels (see module doc).

    Parameters
    ----------
    bucket : int
        Coordinates per bucket; the last bucket may be shorter.
    iters : int
        Lloyd-Max iterations from ``t = 0``, 1 to 100.
    """

    bucket: int = int_param("bucket", 512, *BUCKET_RANGE)
    iters: int = int_param("iters", 3, 1, 100)
    biased = True
    meta_fields = ("bucket", "iters")

    def nbits_for(self, size: int) -> int:
        """Exact payload bits for ``size`` coordinates."""
        return size + 64 * n_buckets(size, self.bucket)

    def encode(self, x: np.ndarray, rng: np.random.Generator | None = None) -> Payload:
        """Send ``v >= t`` per coordinate and ``(b1, b2)`` per bucket; deterministic."""
        flat, shape = flat_input(x)
        size = flat.size
        bits = np.empty(size, dtype=bool)
        levels = np.empty((n_buckets(size, self.bucket), 2), dtype=np.float32)
        for b0, b1, i0, i1 in bucket_blocks(size, self.bucket, BLOCK_ELEMENTS):
            v = flat[i0:i1].reshape(b1 - b0, -1)
            t, low, high = lloyd_max_2(SortedBuckets(v), self.iters)
            np.greater_equal(v, t[:, None], out=bits[i0:i1].reshape(b1 - b0, -1))
            levels[b0:b1, 0] = low
            levels[b0:b1, 1] = high
        buffers: dict[str, np.ndarray] = {"bits": np.packbits(bits), "levels": levels.reshape(-1)}
        return self.payload(shape, buffers, self.nbits_for(size))

    def decode(self, p: Payload) -> np.ndarray:
        """Return ``b2`` where the bit is set, else ``b1``; float32 in the payload's shape."""
        size = self.open_payload(p, self.nbits_for)
        nb = n_buckets(size, self.bucket)
        packed = expect_buffer(p, "bits", "uint8", bitpack.packed_nbytes(size, 1))
        levels = expect_floats(p, "levels", 2 * nb)
        levels = levels.reshape(nb, 2)
        if (levels[:, 0] > levels[:, 1]).any():
            raise PayloadError("bingrad payload has a bucket with b1 > b2")
        if size and not bitpack.padding_is_zero(packed, 1, size):
            raise PayloadError("bingrad payload has non-zero padding bits")
        bits = np.unpackbits(packed, count=size).view(bool)
        out = np.empty(size, dtype=np.float32)
        for b0, b1, i0, i1 in bucket_blocks(size, self.bucket):
            # b2 * bit + b1 * (1 - bit): one term is an exact zero, so the result is exact.
            hit = bits[i0:i1].reshape(b1 - b0, -1)
            blk = out[i0:i1].reshape(b1 - b0, -1)
            np.multiply(hit, levels[b0:b1, 1:2], out=blk)
            blk += np.multiply(~hit, levels[b0:b1, 0:1], dtype=np.float32)
        return out.reshape(p.shape)
