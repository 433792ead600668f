"""The comparison's plots: test accuracy against uplink bytes, rounds and time per link.

On the uplink plot a curve is the best accuracy reached within each byte budget.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dq_flower.compare.fmt import pct as _pct
from dq_flower.compare.links import LinkProfile, cumulative_times
from dq_flower.compare.summary import REFERENCE, is_failed

__all__ = ["write_plots", "label_log_axis"]


def label_log_axis(ax: Any) -> None:
    """Readable tick labels on a log x axis: a few plain ones where it spans under a decade."""
    from matplotlib.ticker import FuncFormatter, MaxNLocator, NullFormatter  # see write_plots

    lo, hi = ax.get_xlim()
    if lo > 0 and hi / lo < 10:
        ax.xaxis.set_major_locator(MaxNLocator(nbins=5))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.5g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())


def _time_series(rec: Mapping[str, Any], link: LinkProfile) -> list[dict[str, Any]]:
    """The run's rows with ``sim_s``, the simulated seconds on ``link`` (none if unknown)."""
    times = cumulative_times(rec["history"], link)
    if times is None:
        return []
    return [{**row, "sim_s": t} for row, t in zip(rec["history"], times, strict=True)]


def write_plots(results: Mapping[str, Any], out: Path) -> dict[str, Path]:
    """Accuracy against uplink bytes, rounds (and simulated time per link) as PNG (Agg)."""
    import matplotlib  # matplotlib: loaded when a plot is drawn

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt  # matplotlib: loaded when a plot is drawn

    runs = [r for r in results["runs"] if not is_failed(r) and r.get("history")]
    target = float(results["target_accuracy"])
    p = results["preset"]
    title = f"{p['name']}: {p['dataset']}, {p['model']}, {p['num_clients']} clients, " \
            f"{p['partition']}"
    cmap = plt.get_cmap("tab10")
    styles = ["-", "--", "-.", ":"]
    paths = {}
    figures: list[tuple[str, str, str, bool, LinkProfile | None]] = [
        ("accuracy_vs_uplink", "cum_up_bytes",
         "cumulative uplink bytes (all clients); best accuracy within each budget", True, None),
        ("accuracy_vs_rounds", "round", "server round", False, None),
    ]
    link: LinkProfile | None
    for link in (LinkProfile.from_json(x) for x in results.get("links") or []):
        if any(_time_series(rec, link) for rec in runs):
            figures.append((f"accuracy_vs_time_{link.name}", "sim_s",
                            f"simulated time (s) on {link.describe()}", True, link))
    for name, xkey, xlabel, logx, link in figures:
        fig, ax = plt.subplots(figsize=(8.5, 5.0), dpi=110)
        for i, rec in enumerate(runs):
            series = rec["history"] if link is None else _time_series(rec, link)
            rows = [r for r in series if (not logx or float(r[xkey]) > 0)
                    and not math.isnan(float(r["accuracy"]))]  # eval-every's skipped rounds
            if not rows:
                continue
            is_ref = rec["label"] == REFERENCE
            acc = [100 * float(r["accuracy"]) for r in rows]
            if name == "accuracy_vs_uplink":
                acc = list(itertools.accumulate(acc, max))
            ax.plot([float(r[xkey]) for r in rows], acc,
                    label=rec["label"], color="black" if is_ref else cmap(i % 10),
                    linestyle="-" if is_ref else styles[i % len(styles)],
                    linewidth=2.6 if is_ref else 1.4, zorder=3 if is_ref else 2)
        ax.axhline(100 * target, color="grey", linewidth=0.8, linestyle=":",
                   label=f"target {_pct(target)}")
        if logx:
            ax.set_xscale("log")
            label_log_axis(ax)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("test accuracy (%)")
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
        fig.tight_layout()
        path = out / f"{name}.png"
        fig.savefig(path)
        plt.close(fig)
        paths[name] = path
    return paths

