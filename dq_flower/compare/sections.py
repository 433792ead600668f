"""Sections of ``summary.md`` beyond the main table: time on links, step sizes, verdict notes.

Functions of the content of ``results.json`` (and the per-run statistics) alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

from dq_flower.compare.fmt import fmt_seconds, fmt_value, pct
from dq_flower.compare.grids import describe_axes, step_axes
from dq_flower.compare.links import LinkProfile

__all__ = ["time_table", "step_size_lines", "verdict_extras", "tuning_of", "links_of"]


def links_of(results: Mapping[str, Any]) -> list[LinkProfile]:
    """The link profiles of ``results``."""
    return [LinkProfile.from_json(x) for x in results.get("links") or []]


def time_table(results: Mapping[str, Any], stats: Sequence[Mapping[str, Any]]) -> list[str]:
    """The "Time on links" table: simulated time to the target per link profile."""
    links = links_of(results)
    ok = [s for s in stats if s["status"] == "ok"]
    if not links or not any(s["total_time"].get(link.name) is not None
                            for s in ok for link in links):
        return []
    target = pct(float(results["target_accuracy"]))
    lines = ["## Time on links", "",
             f"Simulated time to reach {target} on each link (nothing sleeps): per round, "
             "the slowest sampled client's measured compute plus its measured downlink and "
             "uplink bytes over the link, one round trip of latency, and the server's "
             "measured compute; \"not reached\" gives the time of the whole run. Links: "
             + "; ".join(link.describe() for link in links) + ".", "",
             "| method | " + " | ".join(link.name for link in links) + " |",
             "|---|" + "---:|" * len(links)]
    for s in stats:
        cells = []
        for link in links:
            total = s["total_time"].get(link.name)
            hit = s["time_to_target"].get(link.name)
            if s["status"] != "ok" or total is None:
                cells.append("-")
            elif hit is not None:
                cells.append(fmt_seconds(hit))
            else:
                cells.append(f"not reached ({fmt_seconds(total)})")
        lines.append(f"| {s['label']} | " + " | ".join(cells) + " |")
    return lines + [""]


def tuning_of(results: Mapping[str, Any], label: str) -> Mapping[str, Any] | None:
    """The tuning record of run ``label`` (``results["preset"]["tuning"]``), if any."""
    tuning = (results.get("preset") or {}).get("tuning") or {}
    record = tuning.get(label)
    return record if isinstance(record, Mapping) else None


def _used(config: Mapping[str, Any], keys: Sequence[str]) -> str:
    return ", ".join(f"{k} {fmt_value(config.get(k))}" for k in keys)


def _split_text(scenario: Mapping[str, Any]) -> str:
    """``iid`` or ``dirichlet (alpha 0.1)``; empty when ``scenario`` does not say."""
    partition = scenario.get("partition")
    if not partition:
        return ""
    if partition == "dirichlet":
        alpha = scenario.get("dirichlet-alpha", scenario.get("dirichlet_alpha"))
        return f"dirichlet (alpha {fmt_value(alpha)})"
    return str(partition)


def step_size_lines(results: Mapping[str, Any]) -> list[str]:
    """The "Step sizes" section: what each run used and, if tuned, the grid and scores."""
    lines = ["## Step sizes", ""]
    tuned_any = False
    for rec in results["runs"]:
        config = rec.get("config") or {}
        axes = step_axes(str(rec.get("family")), config)
        if not axes:
            continue
        record = tuning_of(results, rec["label"])
        used = _used(config, list(axes))
        if record is None:
            lines.append(f"- {rec['label']}: {used} (default, not tuned)")
            continue
        tuned_any = True
        choice = record.get("choice") or {}
        if record.get("shared-from"):
            lines.append(f"- {rec['label']}: {used}, as tuned for {record['shared-from']} "
                         "(the same local training; not tuned separately)")
            continue
        grid = record.get("axes") or {k: [] for k in choice}
        scores = ", ".join(
            "failed" if sc.get("failed") else pct(float(sc.get("accuracy", float("nan"))))
            for sc in record.get("scores") or [])
        text = f"- {rec['label']}: {used}, tuned over {describe_axes(grid)}"
        text += f" (validation accuracy {scores})" if scores else ""
        edge = [k for k, v in choice.items() if grid.get(k) and len(grid[k]) > 1
                and v in (grid[k][0], grid[k][-1])]
        if record.get("extensions"):
            text += (f"; the grid was extended {record['extensions']} time(s) beyond the "
                     "edge the best point sat on")
        if edge:
            text += "; at the edge of the grid (" + ", ".join(edge) + ")"
        tuned_on = _split_text(record)
        if tuned_on and tuned_on != _split_text(results.get("preset") or {}):
            text += (f"; **tuned on the {tuned_on} split, used unchanged on this run's "
                     f"{_split_text(results.get('preset') or {})}**")
        mismatch = [k for k, v in choice.items() if config.get(k) != v]
        if mismatch:
            text += "; **the tuned " + ", ".join(
                f"{k} {fmt_value(choice[k])}" for k in mismatch) + " was overridden**"
        lines.append(text)
    if len(lines) == 2:
        return []
    if tuned_any:
        some = cast(Mapping[str, Any],  # the first run's tuning that is not None
                    next(tuning_of(results, r["label"]) for r in results["runs"]
                         if tuning_of(results, r["label"]) is not None))
        held = pct(float(some.get("validation-fraction", 0)))
        lines += ["", f"Tuning ran each grid point for {some.get('rounds')} rounds, trained "
                  f"on the training rows minus a held-out {held} of them (drawn by the "
                  "seed) and scored on those held-out rows: the test "
                  "set was never read. The choice is the best final validation accuracy; "
                  "ties go to fewer uplink bytes. While the best point sat at the edge of "
                  "an axis, the axis was extended by one value beyond it (at most twice by "
                  "default)."]
    return lines + [""]


def verdict_extras(results: Mapping[str, Any], stats: Sequence[Mapping[str, Any]]) -> list[str]:
    """Verdict lines on unstable runs and on the fastest method to the target per link."""
    out: list[str] = []
    unstable = [s for s in stats if s["status"] == "ok" and s.get("unstable")]
    if unstable:
        out.append("- **Unstable** (final accuracy more than 5 points below its best): "
                   + ", ".join(f"{s['label']} (final {pct(s['final_accuracy'])}, best "
                               f"{pct(s['best_accuracy'])})" for s in unstable) + ".")
    target = pct(float(results["target_accuracy"]))
    for link in links_of(results):
        reached = [(s["time_to_target"][link.name], s["label"]) for s in stats
                   if s["status"] == "ok" and s["time_to_target"].get(link.name) is not None]
        if reached:
            t, label = min(reached)
            out.append(f"- Fastest to {target} on {link.name}: {label} "
                       f"({fmt_seconds(t)} simulated).")
    return out
