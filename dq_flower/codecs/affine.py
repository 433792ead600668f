"""The data quantizer's kernels: the per-row affine map and the counter-based dither hash.

Tabular rows are first mapped feature by feature into ``[0, 1]`` (:func:`normalise` by
their client's :func:`feature_ranges`; :func:`denormalise` on both ends after decoding),
linearly or, for heavy-tailed columns (:func:`log_scales`), in the log domain.

:class:`~dq_flower.codecs.uniform.Uniform` maps each row to ``(x - min) * gain`` with
:func:`affine_block`; its subtractive dither draws ``u`` for any flat position from a
splitmix64 hash of ``(seed, position)`` (:func:`dither_offsets`), so the decoder, and the
server's store, compute any row's offsets alone.
"""

from __future__ import annotations

import numpy as np

__all__ = ["dither_u16", "dither_offsets", "safe_gain", "affine_block", "feature_ranges",
           "normalise", "denormalise", "mixed_scales", "SCALE_ROWS", "log_scales", "LOG_ROWS"]

#: Rows of a node's data :func:`mixed_scales` looks at (evenly spaced), at most.
SCALE_ROWS = 512
#: Rows of a node's data :func:`log_scales` looks at (evenly spaced), at most.
LOG_ROWS = 4096
#: Rows above a feature's minimum :func:`log_scales` needs to measure its bulk.
LOG_MIN_ROWS = 16
#: How far past its bulk (the upper quartile above the minimum) a heavy tail reaches.
LOG_TAIL = 10.0

_M1 = np.uint64(0x9E3779B97F4A7C15)
_M2 = np.uint64(0xBF58476D1CE4E5B9)
_M3 = np.uint64(0x94D049BB133111EB)


def dither_u16(seed: int, start: int, count: int) -> np.ndarray:
    """16-bit dither values for flat positions ``start .. start + count - 1``."""
    first, last = start // 4, (start + count + 3) // 4
    z = np.arange(first, last, dtype=np.uint64)
    z += np.uint64((seed * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) % (1 << 64))
    z *= _M1
    z ^= z >> np.uint64(30)
    z *= _M2
    z ^= z >> np.uint64(27)
    z *= _M3
    z ^= z >> np.uint64(31)
    off = start - 4 * first
    return z.astype("<u8").view(np.uint16)[off : off + count]


def dither_offsets(seed: int, start: int, count: int) -> np.ndarray:
    """Float32 dither offsets ``u = r / 2**16`` in (0, 1) of positions ``start ..``.

    The encoder rounds ``t + u`` down and the decoder adds ``1/2 - u`` back.
    """
    r = dither_u16(int(seed), int(start), int(count))
    return r.astype(np.float32) * np.float32(1.0 / 65536.0)


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


def feature_ranges(x: np.ndarray, whole_levels: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Per-feature ``(lo, span)`` (float32) of flat rows; a constant feature has span 1.

    ``whole_levels`` (the codes' levels, 0: off): a feature of whole numbers spanning
    fewer than that many values gets the span ``whole_levels - 1``, one code per whole
    number, so its values are coded exactly (label-encoded categories).
    """
    if x.shape[0] == 0:
        return np.zeros(x.shape[1], np.float32), np.ones(x.shape[1], np.float32)
    lo = x.min(axis=0).astype(np.float32)
    span = (x.max(axis=0) - lo).astype(np.float32)
    if whole_levels >= 2:
        whole = (x == np.rint(x)).all(axis=0) & (span < whole_levels)
        span[whole] = np.float32(whole_levels - 1)
    span[~(span > 0)] = np.float32(1.0)
    return lo, span


def log_scales(x: np.ndarray, lo: np.ndarray, span: np.ndarray, levels: int
               ) -> np.ndarray | None:
    """Per-feature scales ``s`` of log coding (0: linear); ``None`` where no feature has one.

    A feature is heavy-tailed where the interquartile range of its rows above its minimum
    (its bulk) is below one step ``span / (levels - 1)`` of a uniform code, so that most rows
    would share a level, its range reaches past :data:`LOG_TAIL` times the bulk's upper
    quartile, and coding ``log1p((x - lo) / s)`` (``s``: the lower quartile) spreads the
    bulk over more levels: a long tail above a bulk near the minimum (amounts, incomes,
    balances, durations), not a column skewed within one order of magnitude (pixels,
    measurements, exponential waits).
    """
    rows = np.asarray(x, dtype=np.float64)[:: max(1, x.shape[0] // LOG_ROWS)]
    above = rows - lo.astype(np.float64)
    above[~(above > 0)] = np.nan
    enough = (above > 0).sum(axis=0) >= LOG_MIN_ROWS
    if not enough.any():
        return None
    q25, q75 = np.zeros(rows.shape[1]), np.zeros(rows.shape[1])
    q25[enough], q75[enough] = np.nanquantile(above[:, enough], [0.25, 0.75], axis=0)
    scale, wide = q25.astype(np.float32).astype(np.float64), span.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        uniform = (q75 - q25) / wide * (levels - 1)
        logged = ((np.log1p(q75 / scale) - np.log1p(q25 / scale))
                  / np.log1p(wide / scale) * (levels - 1))
    tail = wide > LOG_TAIL * q75
    use = enough & (scale > 0) & tail & (uniform < 1) & (logged > uniform)
    return np.where(use, scale, 0.0).astype(np.float32) if use.any() else None


def _logged(scale: np.ndarray | None) -> tuple[np.ndarray, np.ndarray] | None:
    """The log-coded features' indices and float64 scales, or ``None``."""
    if scale is None or not (scale > 0).any():
        return None
    at = np.flatnonzero(scale > 0)
    return at, scale[at].astype(np.float64)


def normalise(x: np.ndarray, lo: np.ndarray, span: np.ndarray,
              scale: np.ndarray | None = None) -> np.ndarray:
    """Rows mapped into ``[0, 1]`` feature by feature (float32).

    A feature of positive ``scale`` ``s`` maps to ``log1p((x - lo) / s) / log1p(span / s)``
    (rows below ``lo``, of data grown since, to 0).
    """
    out = ((x - lo) / span).astype(np.float32)
    if (logged := _logged(scale)) is not None:
        at, s = logged
        above = np.maximum(x[:, at].astype(np.float64) - lo[at], 0.0) / s
        out[:, at] = np.log1p(above) / np.log1p(span[at] / s)
    return out


def denormalise(xn: np.ndarray, lo: np.ndarray, span: np.ndarray,
                scale: np.ndarray | None = None) -> np.ndarray:
    """Inverse of :func:`normalise`: ``lo + xn * span`` in float32 (both ends use this).

    A log-coded feature: ``lo + s * expm1(xn * log1p(span / s))``, no clipping. A dithered
    code is unbiased in the log domain, so its value is not in raw units: ``x - lo + s`` is
    scaled by ``exp(e)`` for a uniform ``e`` within half a log step ``a``, on average by
    ``sinh(a) / a`` (1.8 % for a step of 1/15 over ``log1p(span / s) = 10``).
    """
    out = (lo + xn * span).astype(np.float32)
    if (logged := _logged(scale)) is not None:
        at, s = logged
        out[:, at] = lo[at] + s * np.expm1(xn[:, at] * np.log1p(span[at] / s))
    return out


def mixed_scales(x: np.ndarray, bits: int) -> bool:
    """Whether one range a sample would lose coordinates of these rows ``(n, d)``.

    A coordinate is lost where its spread over the rows (1st to 99th percentile) is below
    half a ``bits``-bit step of the median row's own range: sensor channels in other units
    beside one in thousands. True where at least a quarter of the varying coordinates are
    (images: 4 to 8 % of their pixels, the faint edges; a window of 16 sensors in units from
    hundredths to thousands: 89 %; accelerometer and gyroscope channels: none).
    """
    rows = np.asarray(x, dtype=np.float64)[:: max(1, x.shape[0] // SCALE_ROWS)]
    if rows.shape[0] < 2:
        return False
    low, high = np.quantile(rows, [0.01, 0.99], axis=0)
    spread = high - low
    step = float(np.median(rows.max(axis=1) - rows.min(axis=1))) / (2 ** bits - 1)
    varying = spread > 0
    return bool(varying.any() and (spread[varying] < step / 2).mean() >= 0.25)
