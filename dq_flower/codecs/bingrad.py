"""BinGrad and ORQ (Xu, Huo, Huang, 2020): per-bucket levels fitted to the data.

BinGrad: two MSE-optimal levels per bucket, 1 bit per coordinate.

Per bucket, levels ``b1 <= b2`` and threshold ``t`` meet the two-level Lloyd-Max conditions
``t = (b1 + b2) / 2``, ``b1 = E[v | v < t]``, ``b2 = E[v | v >= t]`` after ``iters``
iterations from ``t = 0`` (the sign partition, so the error never exceeds the scaled
sign's). Deterministic and biased: use it inside :class:`~.ErrorFeedback`.
``nbits = D + 64 * n_buckets``. :class:`SortedBuckets` (shared with ORQ) makes each
conditional mean a binary search and an 8-element partial sum over block prefix sums.

ORQ: unbiased multi-level quantization with data-optimal levels.

Per bucket, ``levels + 1`` values ``b_0 = min <= b_1 <= ... <= b_s = max``; a coordinate in
``[b_j, b_{j+1}]`` is rounded stochastically to one of the two (unbiased), with variance
``(b_{j+1} - v)(v - b_j)``. The total variance, as a function of one interior level ``b_j``
with its neighbours ``a = b_{j-1}`` and ``c = b_{j+1}`` fixed, is convex and piecewise linear
with slope ``sum_{a <= v < c} v - a * #[a, b_j) - c * #[b_j, c)`` (the optimality condition
``sum_{[a, b_j)} (v - a) = sum_{[b_j, c)} (c - v)`` sets it to zero), so
its minimiser is the sorted value at rank ``ceil((c #<c - a #<a - S) / (c - a))``. The
encoder starts from evenly spaced levels and runs ``iters`` coordinate sweeps ``j = 1 ..
s - 1`` over the sorted bucket; every update lowers the variance. Codes take
``ceil(log2(s + 1))`` bits; ``nbits = D * ceil(log2(s + 1)) + 32 * (s + 1) * n_buckets``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import bitpack
from .base import (
    BUCKET_RANGE,
    Codec,
    bucket_blocks,
    flat_input,
    int_param,
    n_buckets,
    random_u16,
    require_rng,
)
from .bitpack import bucket_chunks
from .payload import (
    Payload,
    PayloadError,
    expect_buffer,
    expect_floats,
    expect_packed,
    open_payload,
)
from .registry import register

__all__ = ["BinGrad", "ORQ", "SortedBuckets", "lloyd_max_2", "optimal_levels", "round_between"]

_SUB = 8  # elements per prefix-sum block
_SUB_RANGE = np.arange(_SUB)
#: Elements per block of buckets processed at once (sorting keeps temporaries in L3).
BLOCK_ELEMENTS = 1 << 20


class SortedBuckets:
    """The rows of float32 ``v`` ``(n_buckets, bucket)`` sorted, with prefix sums in blocks of 8."""

    def __init__(self, v: np.ndarray) -> None:
        self.sorted = np.sort(v, axis=1)
        self.nb, self.size = v.shape
        nsub = -(-self.size // _SUB)
        pad = nsub * _SUB - self.size
        padded = self.sorted if pad == 0 else np.pad(self.sorted, ((0, 0), (0, pad)))
        self._subs = padded.reshape(self.nb, nsub, _SUB)
        with np.errstate(over="ignore"):
            sums = np.einsum("ij->i", padded.reshape(-1, _SUB)).reshape(self.nb, nsub)
        if not np.isfinite(sums).all():  # float32 overflow of an 8-value sum: redo in float64
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
        size = open_payload(p, self, self.nbits_for)
        nb = n_buckets(size, self.bucket)
        packed = expect_packed(p, "bits", 1, size)
        levels = expect_floats(p, "levels", 2 * nb).reshape(nb, 2)
        if (levels[:, 0] > levels[:, 1]).any():
            raise PayloadError("bingrad payload has a bucket with b1 > b2")
        bits = np.unpackbits(packed, count=size).view(bool)
        out = np.empty(size, dtype=np.float32)
        for b0, b1, i0, i1 in bucket_blocks(size, self.bucket):
            # b2 * bit + b1 * (1 - bit): one term is an exact zero, so the result is exact.
            hit = bits[i0:i1].reshape(b1 - b0, -1)
            blk = out[i0:i1].reshape(b1 - b0, -1)
            np.multiply(hit, levels[b0:b1, 1:2], out=blk)
            blk += np.multiply(~hit, levels[b0:b1, 0:1], dtype=np.float32)
        return out.reshape(p.shape)


def optimal_levels(sb: SortedBuckets, levels: int, iters: int) -> np.ndarray:
    """Variance-optimal levels ``(n_buckets, levels + 1)`` float32 by coordinate sweeps.

    Each level keeps its rank in the sorted bucket, so an update needs one prefix sum.
    """
    low = sb.sorted[:, 0].astype(np.float64)
    high = sb.sorted[:, -1].astype(np.float64)
    frac = np.arange(levels + 1) / levels
    lv = (low[:, None] + (high - low)[:, None] * frac).astype(np.float32)
    lv[:, 0] = sb.sorted[:, 0]
    lv[:, -1] = sb.sorted[:, -1]
    if levels < 2 or not iters:
        return lv
    rank = sb.count_less(lv)
    below = sb.prefix(rank)  # sum of the values below each level
    for _ in range(iters):
        for j in range(1, levels):
            ia, ic = rank[:, j - 1], rank[:, j + 1]
            inside = below[:, j + 1] - below[:, j - 1]
            a64, c64 = lv[:, j - 1].astype(np.float64), lv[:, j + 1].astype(np.float64)
            ok = (ic > ia) & (c64 > a64)
            gap = np.where(ok, c64 - a64, 1.0)
            best = np.ceil((c64 * ic - a64 * ia - inside) / gap)
            best = np.clip(np.where(ok, best, 0), ia + 1, np.maximum(ic, ia + 1)).astype(np.int64)
            index = np.minimum(best - 1, sb.size - 1)
            lv[:, j] = np.where(ok, sb.at(index), lv[:, j])
            rank[:, j] = np.where(ok, index, rank[:, j])
            below[:, j] = sb.prefix(rank[:, j])
    return lv


def round_between(v: np.ndarray, lv: np.ndarray, rng: np.random.Generator,
                  out: np.ndarray) -> None:
    """Write into ``out`` the unbiased stochastic rounding of each row of ``v`` to its levels.

    Row ``i`` of ``v`` (float32) rounds to the indices of its levels ``lv[i]`` (sorted, ``s +
    1`` of them); ``out`` is uint8 of ``v``'s shape.
    """
    s = lv.shape[1] - 1
    width = v.shape[1]
    with np.errstate(over="ignore"):
        gaps = np.diff(lv, axis=1)
        inv = np.divide(np.float32(65536.0), gaps, out=np.zeros_like(gaps), where=gaps > 0)
    # Tiny gaps (2**16 / gap overflows) or huge ones (gap overflows): float64 sub-blocks.
    wide = not (np.isfinite(gaps).all() and np.isfinite(inv).all())
    # the rounding pass runs on cache-sized sub-blocks of buckets
    for c0, c1 in bucket_chunks(v.shape[0], width, 1 << 16):
        vc = v[c0:c1]
        lvc = lv[c0:c1]
        j = np.zeros(vc.shape, dtype=np.uint8)  # interval: interior levels <= v
        for k in range(1, s):
            j += vc >= lvc[:, k : k + 1]
        idx = j + (np.arange(c1 - c0, dtype=np.int64) * s)[:, None]
        # up = p * 2**16 for p = (v - b_j) / (b_{j+1} - b_j) in [0, 1]; with a 16-bit
        # uniform r, rounding up iff up + r >= 2**16 happens with probability p
        # (to 2**-16): stochastic rounding by one comparison, no clipping needed.
        if wide:
            lv64 = lvc.astype(np.float64)
            low = np.take(lv64[:, :-1].reshape(-1), idx)
            gap = np.take(np.diff(lv64, axis=1).reshape(-1), idx)
            frac = np.divide(vc - low, gap, out=np.zeros(vc.shape), where=gap > 0)
            up = (frac * 65536.0).astype(np.float32)
        else:
            up = vc - np.take(lvc[:, :-1].reshape(-1), idx)
            up *= np.take(inv[c0:c1].reshape(-1), idx)
        np.add(up, random_u16(rng, up.size).reshape(up.shape), out=up)
        j += up >= np.float32(65536.0)
        out[c0:c1] = j


@register("orq")
@dataclass(frozen=True)
class ORQ(Codec):
    """Unbiased stochastic rounding between per-bucket optimal levels (see module doc).

    Parameters
    ----------
    levels : int
        Number of intervals ``s`` (``s + 1`` level values), 1 to 255.
    bucket : int
        Coordinates per bucket; the last bucket may be shorter.
    iters : int
        Coordinate sweeps over the interior levels, 0 to 100 (0 keeps even spacing).
    """

    levels: int = int_param("levels", 3, 1, 255)
    bucket: int = int_param("bucket", 512, *BUCKET_RANGE)
    iters: int = int_param("iters", 2, 0, 100)
    meta_fields = ("levels", "bucket")

    @property
    def width(self) -> int:
        """Bits per coordinate, ``ceil(log2(levels + 1))``."""
        return self.levels.bit_length()

    def nbits_for(self, size: int) -> int:
        """Exact payload bits for ``size`` coordinates."""
        return size * self.width + 32 * (self.levels + 1) * n_buckets(size, self.bucket)

    def encode(self, x: np.ndarray, rng: np.random.Generator | None = None) -> Payload:
        """Round ``x`` (any shape) between each bucket's optimal levels, drawing from ``rng``."""
        flat, shape = flat_input(x)
        rng = require_rng(rng, self.name)
        size = flat.size
        codes = np.empty(size, dtype=np.uint8)
        table = np.empty((n_buckets(size, self.bucket), self.levels + 1), dtype=np.float32)
        for b0, b1, i0, i1 in bucket_blocks(size, self.bucket, BLOCK_ELEMENTS):
            v = flat[i0:i1].reshape(b1 - b0, -1)
            lv = optimal_levels(SortedBuckets(v), self.levels, self.iters)
            table[b0:b1] = lv
            round_between(v, lv, rng, codes[i0:i1].reshape(v.shape))
        buffers = {"codes": bitpack.pack(codes, self.width), "table": table.reshape(-1)}
        return self.payload(shape, buffers, self.nbits_for(size))

    def decode(self, p: Payload) -> np.ndarray:
        """Return each code's level value, float32 in the payload's shape."""
        size = open_payload(p, self, self.nbits_for)
        s = self.levels
        nb = n_buckets(size, self.bucket)
        packed = expect_buffer(p, "codes", "uint8", bitpack.packed_nbytes(size, self.width))
        table = expect_floats(p, "table", nb * (s + 1)).reshape(nb, s + 1)
        if (np.diff(table, axis=1) < 0).any():
            raise PayloadError("orq payload has decreasing levels")
        codes = bitpack.unpack(packed, self.width, size)
        if size and int(codes.max()) > s:
            raise PayloadError(f"orq payload has codes above levels = {s}")
        out = np.empty(size, dtype=np.float32)
        flat_table = table.reshape(-1)
        for b0, b1, i0, i1 in bucket_blocks(size, self.bucket):
            offsets = (np.arange(b0, b1, dtype=np.int64) * (s + 1))[:, None]
            idx = codes[i0:i1].reshape(b1 - b0, -1) + offsets
            np.take(flat_table, idx, out=out[i0:i1].reshape(b1 - b0, -1))
        return out.reshape(p.shape)
