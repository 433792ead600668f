"""The biased codecs for error feedback: ``topk`` (sparse) and ``powersgd`` (low rank).

Top-k sparsification: the ``k`` largest-magnitude coordinates, values as float32. Positions
go as sorted indices of ``ceil(log2 D)`` bits each, or as a ``D``-bit mask when
that is smaller; ``nbits = 32 k + min(k * ceil(log2 D), D)``. Biased: use it inside
:class:`~.ErrorFeedback`.

PowerSGD (Vogels et al., 2019): rank-``r`` factors by one warm-started power iteration.

``M`` is the input as ``(shape[0], prod(shape[1:]))``, or a vector as the ``shape`` hint or
the near-square ``(ceil(sqrt(D)), ceil(D / rows))`` matrix, zero-padded. With ``Q`` kept
from the last call on a matrix of that size (first: standard normal from ``rng``), the
encoder sends ``P = orth(M Q)`` and ``Q' = M^T P`` as float32 and keeps ``Q'``; the decoder
returns ``P Q'^T = P P^T M`` (``||M - P P^T M|| <= ||M||``). Matrices with ``r (rows + cols)
>= rows cols`` go as float32. ``nbits = 32 r (rows + cols)``, or ``32 D``. Biased: use it
inside :class:`~.ErrorFeedback`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dq_flower.config import knob

from . import bitpack
from .base import Codec, flat_input, int_param, require_rng
from .payload import (
    Payload,
    PayloadError,
    check_int,
    expect_floats,
    expect_nbits,
    expect_packed,
    meta_equal,
    open_payload,
)
from .registry import register

__all__ = ["TopK", "topk_indices", "PowerSGD", "matrix_shape"]


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


def _ratio(value: Any) -> Any:
    """``value`` if it is a number in (0, 1] (kept as given)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ValueError(f"ratio must be a number in (0, 1], got {value!r}")
    return value


@register("topk")
@dataclass(frozen=True)
class TopK(Codec):
    """Keep the ``ceil(ratio * D)`` (at least 1) largest-magnitude coordinates.

    Parameters
    ----------
    ratio : float
        Fraction of coordinates kept, in (0, 1].
    """

    ratio: float = knob(0.01, coerce=_ratio)
    biased = True

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
        """
        size = open_payload(p, self)
        k, mode, nbits = self.layout(size)
        meta_equal(p, "k", k)
        meta_equal(p, "mode", mode)
        expect_nbits(p, nbits)
        values = expect_floats(p, "values", k)
        width, count = (self.index_bits(size), k) if mode == "index" else (1, size)
        where = expect_packed(p, "where", width, count)
        if mode == "index":
            idx = bitpack.unpack_wide(where, width, k)
            if k and (idx[-1] >= size or (k > 1 and (np.diff(idx) <= 0).any())):
                raise PayloadError("topk indices must be strictly increasing and below D")
        else:
            idx = np.flatnonzero(np.unpackbits(where, count=size))
            if idx.size != k:
                raise PayloadError(f"topk mask marks {idx.size} coordinates, expected {k}")
        out = np.zeros(size, dtype=np.float32)
        out[idx] = values
        return out.reshape(p.shape)


def matrix_shape(shape: tuple[int, ...], hint: tuple[int, int] | None = None) -> tuple[int, int]:
    """The ``(rows, cols)`` matrix an array of ``shape`` is compressed as (see module doc)."""
    size = math.prod(shape)
    if len(shape) >= 2:
        return int(shape[0]), size // int(shape[0]) if shape[0] else 0
    if hint is not None:
        if hint[0] * hint[1] != size:
            raise ValueError(f"shape hint {hint} does not hold {size} elements")
        return int(hint[0]), int(hint[1])
    if size == 0:
        return 0, 0
    rows = math.isqrt(size - 1) + 1  # ceil(sqrt(size))
    return rows, -(-size // rows)


def _matrix_shape(shape: Any) -> tuple[int, int]:
    """``shape`` as a ``(rows, cols)`` pair of plain ints, or ``ValueError``."""
    if not isinstance(shape, (tuple, list)) or len(shape) != 2:
        raise ValueError(f"shape must be a (rows, cols) pair or None, got {shape!r}")
    return check_int(shape[0], "shape[0]", 1), check_int(shape[1], "shape[1]", 1)


@register("powersgd")
@dataclass(frozen=True)
class PowerSGD(Codec):
    """Rank-``rank`` PowerSGD with a warm start kept in this object (see module doc).

    Parameters
    ----------
    rank : int
        Rank of the approximation, 1 to 1024 (capped at ``min(rows, cols)``).
    shape : tuple of (int, int) or None
        Matrix shape for 1-D inputs of exactly ``rows * cols`` elements; None picks a
        near-square shape.
    """

    rank: int = int_param("rank", 2, 1, 1024)
    shape: tuple[int, int] | None = knob(None, coerce=_matrix_shape)
    _warm: dict = field(default_factory=dict, init=False, repr=False, compare=False, hash=False)
    biased = True

    def layout(self, shape: tuple[int, ...]) -> tuple[int, int, int, bool]:
        """Return ``(rows, cols, r, compressed)`` for an input of ``shape``."""
        rows, cols = matrix_shape(tuple(shape), self.shape if len(shape) < 2 else None)
        r = min(self.rank, rows, cols)
        compressed = r > 0 and r * (rows + cols) < rows * cols
        return rows, cols, r, compressed

    def nbits_for(self, shape: tuple[int, ...]) -> int:
        """Exact payload bits for an input of ``shape``."""
        rows, cols, r, compressed = self.layout(shape)
        return 32 * r * (rows + cols) if compressed else 32 * math.prod(shape)

    def state_dict(self) -> dict[str, np.ndarray]:
        """The warm-start factors, keyed ``"q/<rows>x<cols>x<r>"`` (float32 arrays)."""
        return {f"q/{r}x{c}x{k}": q.copy() for (r, c, k), q in self._warm.items()}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        """Restore factors saved by :meth:`state_dict` (replacing the current ones)."""
        warm = {}
        for key, value in state.items():
            try:
                rows, cols, r = (int(t) for t in key.removeprefix("q/").split("x"))
            except ValueError:
                raise ValueError(f"bad powersgd state key {key!r}") from None
            q = np.asarray(value, dtype=np.float32)
            if q.shape != (cols, r) or not np.isfinite(q).all():
                raise ValueError(f"powersgd state {key!r} must be a finite ({cols}, {r}) array")
            warm[(rows, cols, r)] = q.copy()
        self._warm.clear()
        self._warm.update(warm)

    def reset(self) -> None:
        """Forget the warm start."""
        self._warm.clear()

    def encode(self, x: np.ndarray, rng: np.random.Generator | None = None) -> Payload:
        """Compress ``x``; the first call per matrix size draws ``Q`` from ``rng``."""
        flat, shape = flat_input(x)
        rows, cols, r, compressed = self.layout(shape)
        meta = {"rows": rows, "cols": cols, "rank": r, "compressed": compressed}
        if not compressed:
            return self.payload(shape, {"values": flat.copy()}, 32 * flat.size, **meta)
        pad = rows * cols - flat.size  # zero-padded at the end
        m = (np.pad(flat, (0, pad)) if pad else flat).reshape(rows, cols)
        key = (rows, cols, r)
        q = self._warm.get(key)
        if q is None:
            q = require_rng(rng, self.name).standard_normal((cols, r)).astype(np.float32)
        with np.errstate(over="ignore", invalid="ignore"):
            mq = m @ q
            if not np.isfinite(mq).all():
                raise ValueError("powersgd factors overflow float32; rescale the input")
            p_mat, _ = np.linalg.qr(mq)
            p_mat = np.ascontiguousarray(p_mat, dtype=np.float32)
            q_new = np.ascontiguousarray(m.T @ p_mat, dtype=np.float32)
        if not np.isfinite(q_new).all():
            raise ValueError("powersgd factors overflow float32; rescale the input")
        self._warm[key] = q_new.copy()
        buffers = {"p": p_mat.reshape(-1), "q": q_new.reshape(-1)}
        return self.payload(shape, buffers, 32 * r * (rows + cols), **meta)

    def decode(self, p: Payload) -> np.ndarray:
        """Return ``P Q^T`` (cropped to ``D``), or the carried values; float32.

        Factors are checked against the declared shape before the product is formed; callers
        bound the declared size first (:meth:`Payload.expect_elements`). A 1-D shape that the
        ``shape`` hint cannot hold raises :class:`PayloadError`.
        """
        size = open_payload(p, self)
        try:
            rows, cols, r, compressed = self.layout(p.shape)
        except ValueError as exc:
            raise PayloadError(f"powersgd payload shape {list(p.shape)}: {exc}") from None
        for key, value in (("rows", rows), ("cols", cols), ("rank", r), ("compressed", compressed)):
            meta_equal(p, key, value)
        expect_nbits(p, self.nbits_for(p.shape))
        if not compressed:
            return expect_floats(p, "values", size).astype(np.float32, copy=True).reshape(p.shape)
        p_mat = expect_floats(p, "p", rows * r)
        q_mat = expect_floats(p, "q", cols * r)
        with np.errstate(over="ignore", invalid="ignore"):
            full = p_mat.reshape(rows, r) @ q_mat.reshape(cols, r).T
        if not np.isfinite(full).all():
            raise PayloadError("powersgd factors multiply to non-finite values")
        return np.ascontiguousarray(full.reshape(-1)[:size]).reshape(p.shape)
