"""The comparison's files: ``results.json``, ``results.csv``, ``summary.md`` and the plots.

:func:`write_reports` writes them all from the content of ``results.json``;
:func:`load_results` reads ``results.json`` back (``dq-flower report``, ``--resume``). The
plots show test accuracy against uplink bytes (a curve is the best accuracy reached within
each byte budget), rounds and simulated time per link.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dq_flower.compare.fmt import pct
from dq_flower.compare.links import LinkProfile, cumulative_times
from dq_flower.compare.summary import REFERENCE, is_failed, run_summaries, summary_markdown
from dq_flower.json_out import strict_dumps

__all__ = ["RESULTS_FORMAT", "CSV_COLUMNS", "write_reports", "write_csv", "load_results",
           "write_plots", "label_log_axis"]

#: The ``format`` field of ``results.json``.
RESULTS_FORMAT = "dq-flower-compare/1"
#: Leading columns of ``results.csv`` (the methods' own metrics follow, sorted).
CSV_COLUMNS = ("label", "method", "round", "accuracy", "loss", "up_bytes", "down_bytes",
               "cum_up_bytes", "cum_down_bytes", "wall_s")


def write_reports(results: Mapping[str, Any], out_dir: str | os.PathLike[str]) -> dict[str, Path]:
    """Write ``results.json``, ``results.csv``, ``summary.md`` and the plots; name -> path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "results.json", "csv": out / "results.csv",
             "summary": out / "summary.md"}
    data = dict(results)
    data["summaries"] = run_summaries(results)
    tmp = paths["json"].with_suffix(".json.tmp")  # atomic: a kill never leaves half a file
    tmp.write_text(strict_dumps(data, indent=1))
    os.replace(tmp, paths["json"])
    write_csv(results, paths["csv"])
    paths["summary"].write_text(summary_markdown(results))
    paths.update(write_plots(results, out))
    return paths


def write_csv(results: Mapping[str, Any], path: Path) -> Path:
    """One row per method and round: :data:`CSV_COLUMNS`, then the methods' scalar metrics."""
    extras = sorted({k for rec in results["runs"] for row in rec.get("history") or []
                     for k, v in row.items() if not isinstance(v, (list, dict))}
                    - set(CSV_COLUMNS))
    columns = [*CSV_COLUMNS, *extras]
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns, restval="", extrasaction="ignore")
        writer.writeheader()
        for rec in results["runs"]:
            for row in rec.get("history") or []:  # a failed run has no rows
                writer.writerow({"label": rec["label"], "method": rec["method"], **row})
    return path


def load_results(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read ``results.json`` (a file or the folder holding it)."""
    p = Path(path)
    if p.is_dir():
        p = p / "results.json"
    if not p.is_file():
        raise FileNotFoundError(f"no results.json at {p}")
    data = json.loads(p.read_text())
    if data.get("format") != RESULTS_FORMAT:
        raise ValueError(f"{p} is not a dq-flower compare result (format "
                         f"{data.get('format')!r})")
    for record in [*(data.get("runs") or []), *(data.get("pending") or [])]:
        for row in record.get("history") or []:
            # results.json writes a non-finite number (a round that was not evaluated)
            # as null: read it back as the nan it was
            row.update({key: math.nan for key, value in row.items() if value is None})
    return data


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
            xs = [float(r[xkey]) for r in rows]
            ax.plot(xs, acc, label=rec["label"], color="black" if is_ref else cmap(i % 10),
                    linestyle="-" if is_ref else styles[i % len(styles)],
                    linewidth=2.6 if is_ref else 1.4, zorder=3 if is_ref else 2,
                    # a run at one abscissa (one upload of every row) is a point, not a line
                    marker="o" if len(set(xs)) == 1 else None)
        ax.axhline(100 * target, color="grey", linewidth=0.8, linestyle=":",
                   label=f"target {pct(target)}")
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

