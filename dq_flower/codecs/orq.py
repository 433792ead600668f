"""ORQ (Xu, Huo, Huang, 2020): unbiased multi-level quantization with data-optimal levels.

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
    Payload,
    PayloadError,
    bucket_blocks,
    bucket_chunks,
    expect_buffer,
    expect_floats,
    flat_input,
    n_buckets,
    random_u16,
    require_rng,
)
from .bingrad import BLOCK_ELEMENTS, SortedBuckets
from .kernels import int_param
from .registry import register

__all__ = ["ORQ", "optimal_levels", "round_between"]


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
        size = self.open_payload(p, self.nbits_for)
        s = self.levels
        nb = n_buckets(size, self.bucket)
        packed = expect_buffer(p, "codes", "uint8", bitpack.packed_nbytes(size, self.width))
        table = expect_floats(p, "table", nb * (s + 1))
        table = table.reshape(nb, s + 1)
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
