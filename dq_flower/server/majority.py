"""What several nodes report of the same quantity, bounded by their majority.

A model's statistics (BatchNorm's running means and variances, any buffer), training losses
and evaluation metrics come from every node; no one node may set them. Each element is
clipped to the range its middle values span (:func:`winsorize`: the ``k``-th lowest to the
``k``-th highest, ``k = max(1, floor(TRIM * m))`` of ``m >= 3`` values), so any weighted
mean of the results lies within what the nodes other than the ``k`` most extreme each side
reported, whatever their weights. What the server sent counts as one more value where it
is given: with two replies the bound is then their median with the broadcast.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

__all__ = ["TRIM", "trimmed_count", "winsorize", "bounded_mean", "bounded_parts",
           "robust_buffers"]

#: Fraction of the values, each side, that may be extreme (hostile) without moving a bound.
TRIM = 0.25


def trimmed_count(m: int, trim: float = TRIM) -> int:
    """How many of ``m`` values each side lie outside the bounds (0 below three values)."""
    return max(1, int(math.floor(trim * m + 1e-9))) if m >= 3 else 0


def winsorize(values: Sequence[np.ndarray], reference: np.ndarray | None = None,
              trim: float = TRIM) -> list[np.ndarray]:
    """``values`` (one shape) clipped per element to the span of their middle values.

    ``reference`` (what the server sent) joins the values that set the span; the results
    are float64.
    """
    parts = [np.asarray(v, dtype=np.float64) for v in values]
    if not parts:
        return []
    voters = parts + ([np.asarray(reference, dtype=np.float64)] if reference is not None
                      else [])
    m = len(voters)
    k = trimmed_count(m, trim)
    if k == 0:
        return parts
    ordered = np.partition(np.stack(voters), (k, m - 1 - k), axis=0)
    low, high = ordered[k], ordered[m - 1 - k]
    return [np.clip(p, low, high) for p in parts]


def bounded_mean(values: Sequence[float], weights: Sequence[float],
                 trim: float = TRIM) -> float:
    """The ``weights``-weighted mean of ``values`` after :func:`winsorize` (NaN if none)."""
    if not values:
        return float("nan")
    clipped = winsorize([np.asarray(float(v)) for v in values], trim=trim)
    w = np.asarray(weights, dtype=np.float64)
    return float(np.dot(w, np.asarray(clipped, dtype=np.float64)) / w.sum())


def bounded_parts(parts: Sequence[Mapping[str, np.ndarray]],
                  sent: Mapping[str, np.ndarray] | None = None,
                  trim: float = TRIM) -> list[dict[str, np.ndarray]]:
    """Each of ``parts``, every array bounded by the others and ``sent`` (:func:`winsorize`).

    In each array's dtype (integers rounded); every part must hold the same names and
    shapes (checked where the replies were read).
    """
    out: list[dict[str, np.ndarray]] = [{} for _ in parts]
    for name, first in (parts[0].items() if parts else ()):
        ref = None if sent is None else sent.get(name)
        dtype = np.asarray(first).dtype
        for part, clipped in zip(out, winsorize([p[name] for p in parts], ref, trim),
                                 strict=True):
            part[name] = _as(clipped, dtype, np.shape(first))
    return out


def robust_buffers(parts: Sequence[Mapping[str, np.ndarray]], weights: Sequence[float],
                   sent: Mapping[str, np.ndarray] | None = None,
                   trim: float = TRIM) -> dict[str, np.ndarray]:
    """Each buffer's ``weights``-weighted mean over ``parts`` after :func:`winsorize`.

    ``sent``: the buffers the server sent (one more value that sets the bounds); the means
    are in each buffer's dtype (integers rounded).
    """
    w = np.asarray(weights, dtype=np.float64)
    w = w / w.sum()
    out: dict[str, np.ndarray] = {}
    for name, first in parts[0].items():
        ref = None if sent is None else sent.get(name)
        clipped = winsorize([p[name] for p in parts], ref, trim)
        mean = np.sum([wi * c for wi, c in zip(w, clipped, strict=True)], axis=0)
        out[name] = _as(mean, np.asarray(first).dtype, np.shape(first))
    return out


def _as(values: np.ndarray, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """``values`` (float64) in ``dtype`` and ``shape``; integers rounded."""
    if dtype.kind in "iub":
        values = np.rint(values)
    return np.asarray(values, dtype=dtype).reshape(shape)
