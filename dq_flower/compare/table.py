"""The main table of ``summary.md``: one row per method, its payload, accuracy and bytes.

Functions of the content of ``results.json`` (and the per-run statistics) alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dq_flower.compare.fmt import fmt_bytes
from dq_flower.compare.fmt import fmt_ratio as _fmt_ratio
from dq_flower.compare.fmt import pct as _pct

__all__ = ["table_lines"]


def _fmt_unit(u: Mapping[str, Any]) -> str:
    if u["unit"] == "sample":
        conf = f", {u['configured_bits']} b quantizer" if u.get("configured_bits") else ""
        data = f"{u['bits']:,.0f} b/sample ({u['bits_per_coord']:.2f} b/coord{conf})"
        if not u.get("gradient_rounds"):
            return data
        grad = (f"{u['gradient_bits_per_coord']:.3g} b/coord in {u['gradient_rounds']} "
                f"gradient round{'s' if u['gradient_rounds'] > 1 else ''}")
        return grad if u["bits"] != u["bits"] else f"{data}; {grad}"
    if u["unit"] == "coord (wire)":
        return f"{u['bits']:.2f} b/coord (float32, wire)"
    raw = u.get("raw_bits_per_coord")
    if raw is not None and raw == raw and abs(raw - u["bits"]) > 1e-9 * max(1.0, raw):
        return f"{u['bits']:.3g} b/coord ({raw:.3g} before coding)"
    return f"{u['bits']:.3g} b/coord"


def _high_cell(stats: Mapping[str, Any]) -> str:
    """Uplink bytes to the higher target, or 'not reached'."""
    up = stats.get("up_bytes_to_high")
    return fmt_bytes(up) if up is not None else "not reached"


def _ratio_cell(stats: Mapping[str, Any], ref: Mapping[str, Any] | None) -> str:
    """Uplink bytes to target of a method divided by the reference's (DQ's)."""
    if ref is None or ref.get("up_bytes_to_target") is None or stats["status"] != "ok":
        return "n/a"
    base = max(1, int(ref["up_bytes_to_target"]))
    if stats["up_bytes_to_target"] is not None:
        return _fmt_ratio(stats["up_bytes_to_target"] / base)
    return f"> {_fmt_ratio(stats['total_up_bytes'] / base)} (not reached)"


def _header(ref_label: str, target: float, high: float) -> list[str]:
    """The table's header and alignment lines (a column for the higher target if set)."""
    return [
        f"| method | D | d | uplink payload | coder | rounds | final acc | best acc "
        f"| rounds to {_pct(target)} "
        f"| uplink to {_pct(target)} | uplink vs {ref_label} "
        + (f"| uplink to {_pct(high)} " if high else "")
        + "| total uplink | total downlink | wall s |",
        "|---|---:|---:|---|---|---:|---:|---:|---:|---:|---:|" + ("---:|" if high else "")
        + "---:|---:|---:|",
    ]


def _row(rec: Mapping[str, Any], s: Mapping[str, Any], ref: Mapping[str, Any] | None,
         high: float) -> str:
    """One method's row."""
    if s["status"] != "ok" or "uplink" not in s:  # failed, or no round recorded
        what = "failed" if s["status"] != "ok" else "no rounds"
        return (f"| {rec['label']} | - | - | - | - | - | {what} | - | - | - | n/a | - "
                + ("| - " if high else "") + f"| - | {s['wall_s']:.1f} |")
    reached = s["rounds_to_target"] is not None
    final = _pct(s["final_accuracy"]) + (" **unstable**" if s.get("unstable") else "")
    return (
        f"| {rec['label']} | {rec['num_params']:,} | {rec['data_dim']:,} | "
        f"{_fmt_unit(s['uplink'])} | {s.get('coder', 'none')} | {s['rounds']}"
        f"{' (ended early)' if s.get('ended_early') else ''} | {final} | "
        f"{_pct(s['best_accuracy'])} | "
        f"{s['rounds_to_target'] if reached else 'not reached'} | "
        f"{fmt_bytes(s['up_bytes_to_target']) if reached else 'not reached'} | "
        f"{_ratio_cell(s, ref)} | "
        + (f"{_high_cell(s)} | " if high else "")
        + f"{fmt_bytes(s['total_up_bytes'])} | "
        f"{fmt_bytes(s['total_down_bytes'])} | {s['wall_s']:.1f} |")


def table_lines(runs: Sequence[Mapping[str, Any]], stats: Sequence[Mapping[str, Any]],
                ref_label: str, ref: Mapping[str, Any] | None, target: float,
                high: float) -> list[str]:
    """The per-method table; ratios of uplink bytes to ``ref``, ``ref_label``'s statistics."""
    return [*_header(ref_label, target, high),
            *(_row(rec, s, ref, high) for rec, s in zip(runs, stats, strict=True))]
