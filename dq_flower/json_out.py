"""Strict JSON for results files: NaN and infinities become ``null``, never ``NaN``."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

__all__ = ["jsonable", "strict_dumps"]


def jsonable(obj: Any) -> Any:
    """``obj`` with non-finite floats as ``None`` and numpy scalars as Python numbers."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalars
        return jsonable(obj.item())
    return obj


def strict_dumps(obj: Any, **kwargs: Any) -> str:
    """``json.dumps`` of :func:`jsonable` ``(obj)``, refusing anything that is not strict JSON."""
    return json.dumps(jsonable(obj), allow_nan=False, **kwargs)
