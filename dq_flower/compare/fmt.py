"""Number formatting shared by the summary, its sections and the plots."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["fmt_bytes", "fmt_ratio", "pct", "fmt_seconds", "time_cell", "fmt_value",
           "is_failed"]


def fmt_bytes(n: float | None) -> str:
    """``1234567`` -> ``"1.23 MB"`` (decimal units)."""
    if n is None:
        return "-"
    n = float(n)
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}" if n / scale < 100 else f"{n / scale:.0f} {unit}"
    return f"{n:.0f} B"


def fmt_ratio(x: float) -> str:
    """``2.5`` -> ``"2.5x"``; ``1234`` -> ``"1,234x"``."""
    return f"{x:.3g}x" if x < 100 else f"{x:,.0f}x"


def pct(x: float) -> str:
    """A fraction as a percentage with one decimal (``"-"`` for NaN)."""
    return "-" if x != x else f"{100 * x:.1f}%"


def fmt_seconds(s: float | None) -> str:
    """Seconds, readable: ``"0.42 s"``, ``"12.3 s"``, ``"2.1 min"``, ``"3.4 h"``, ``"41 days"``."""
    if s is None:
        return "-"
    if s >= 3 * 86400:
        return f"{s / 86400:,.3g} days" if s < 1000 * 86400 else f"{s / 86400:,.0f} days"
    if s >= 7200:
        return f"{s / 3600:.3g} h"
    if s >= 120:
        return f"{s / 60:.3g} min"
    return f"{s:.3g} s"


def time_cell(to_target: float | None, total: float | None) -> str:
    """Seconds to the target, else ``not reached (<the whole run>)``, ``-`` without times."""
    if to_target is not None:
        return fmt_seconds(to_target)
    return "-" if total is None else f"not reached ({fmt_seconds(total)})"


def fmt_value(v: object) -> str:
    """A knob value as it reads best (``0.03``, ``1e-05``, ``True``)."""
    return f"{v:g}" if isinstance(v, float) else str(v)


def is_failed(record: Mapping[str, Any]) -> bool:
    """Whether a run record says ``"failed": true`` or (older records) a status but ``ok``."""
    return bool(record.get("failed")) or record.get("status", "ok") != "ok"
