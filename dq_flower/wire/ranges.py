"""A node's feature ranges as they travel (the ``feature-ranges`` record of a data reply).

``2 * d`` raw float32, each feature's ``lo`` then its ``span``; where some feature is
log-coded (:func:`~dq_flower.codecs.affine.log_scales`), one bit per feature
(``log-features``) and the flagged features' scales (``log-scales``, float32) besides.
"""

from __future__ import annotations

import numpy as np
from flwr.app import ArrayRecord

from dq_flower.codecs import PayloadError
from dq_flower.codecs.payload import raw_array, read_raw

__all__ = ["ranges_record", "ranges_from_record"]

_WHAT = "feature-ranges"


def ranges_record(lo: np.ndarray, span: np.ndarray, scale: np.ndarray | None = None
                  ) -> ArrayRecord:
    """The record of ``(lo, span)`` and, where some ``scale`` is positive, the log flags."""
    arrays = {"ranges": raw_array(np.concatenate([lo, span]).astype(np.float32))}
    if scale is not None and (scale > 0).any():
        arrays.update({"log-features": raw_array(np.packbits(scale > 0)),
                       "log-scales": raw_array(scale[scale > 0].astype(np.float32))})
    return ArrayRecord(arrays)


def ranges_from_record(record: ArrayRecord, dim: int) -> tuple[np.ndarray, ...]:
    """``(lo, span)``, or ``(lo, span, scale)`` with log-coded features, else PayloadError.

    Finite values, positive spans; flags of ``dim`` features, one at least, the padding
    bits clear; one finite positive scale per flag; no other array.
    """
    if extra := set(record) - {"ranges", "log-features", "log-scales"}:
        raise PayloadError(f"feature ranges carry an unknown array {min(extra)[:40]!r}")
    values = read_raw(record, "ranges", "float32", 8 * dim, _WHAT)
    if values.size != 2 * dim:
        raise PayloadError(f"feature ranges hold {values.size} values, expected {2 * dim}")
    lo, span = values[:dim].copy(), values[dim:].copy()
    if not (np.isfinite(lo).all() and np.isfinite(span).all()) or (span <= 0).any():
        raise PayloadError("feature ranges must be finite with positive spans")
    if not {"log-features", "log-scales"} & set(record):
        return lo, span
    flags = read_raw(record, "log-features", "uint8", dim // 8 + 8, _WHAT)
    bits = np.unpackbits(flags)
    logged = bits[:dim].astype(bool)
    if flags.size != (dim + 7) // 8 or bits[dim:].any() or not logged.any():
        raise PayloadError(f"'log-features' must be {dim} flags, one set at least, "
                           f"in {(dim + 7) // 8} bytes (padding clear)")
    scales = read_raw(record, "log-scales", "float32", 4 * dim, _WHAT)
    if scales.size != logged.sum() or not (np.isfinite(scales) & (scales > 0)).all():
        raise PayloadError(f"'log-scales' must be {int(logged.sum())} finite positive values, "
                           "one per log-coded feature")
    scale = np.zeros(dim, np.float32)
    scale[logged] = scales
    return lo, span, scale
