"""Per-row affine ranges of the ``uniform`` quantizer: each row's minimum, scale and gain.

The gain is lowered where float32 rounding could carry a row's largest value past the top
code, so the encoder needs no clipping pass.
"""

from __future__ import annotations

import numpy as np

__all__ = ["affine_block", "safe_gain"]


def safe_gain(span: np.ndarray, gain: np.ndarray, bump: np.float32,
              limit: float | np.floating) -> np.ndarray:
    """Lower ``gain`` by a few ulps where ``fl(fl(span * gain) + bump) >= limit`` (float32).

    Rounding is monotone, so each row's largest value (``span`` above the minimum) bounds
    the others: no code exceeds the top level.
    """
    limit32 = np.float32(limit)
    for _ in range(64):
        bad = (span * gain + bump) >= limit32
        if not bad.any():
            return gain
        gain[bad] = np.nextafter(gain[bad], np.float32(0.0))
    raise AssertionError("gain adjustment did not converge")  # pragma: no cover


def affine_block(blk: np.ndarray, t: np.ndarray, lo: np.ndarray, scale: np.ndarray, top: int,
                 unit: float | np.floating, bump: float | np.floating) -> None:
    """Write ``(blk - min) * gain`` into ``t``, and each row's min and scale into ``lo``, ``scale``.

    ``gain = unit / scale``, lowered by :func:`safe_gain` below ``(top + 1) * unit``.
    """
    mn = blk.min(axis=1)
    mx = blk.max(axis=1)
    with np.errstate(over="ignore"):
        span = mx - mn
        sc32 = ((mx.astype(np.float64) - mn) / top).astype(np.float32)
        if not (np.isfinite(span).all() and np.isfinite(sc32 * np.float32(top)).all()):
            raise ValueError("a row's range exceeds float32; cannot quantize")
    # a positive range keeps a positive scale, even below float32's denormals
    sc32[(sc32 == 0) & (span > 0)] = np.finfo(np.float32).smallest_subnormal
    sc64 = sc32.astype(np.float64)
    gain64 = np.divide(float(unit), sc64, out=np.zeros(sc32.size), where=sc64 > 0)
    tiny = gain64 > 1e30  # scale far below float32's normal range: float64 rows
    gain = np.where(tiny, 0.0, gain64).astype(np.float32)
    gain = safe_gain(span, gain, np.float32(bump), (top + 1) * unit)
    np.subtract(blk, mn[:, None], out=t)
    t *= gain[:, None]
    if tiny.any():
        sub = np.flatnonzero(tiny)
        wide = (blk[sub].astype(np.float64) - mn[sub, None]) * gain64[sub, None]
        t[sub] = np.minimum(wide, float(top * unit))
    lo[...] = mn
    scale[...] = sc32
