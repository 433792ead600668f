"""The comparison's files: ``results.json``, ``results.csv``, ``summary.md`` and the plots.

:func:`write_reports` writes them all from the content of ``results.json``;
:func:`load_results` reads ``results.json`` back (``dq-flower report``, ``--resume``).
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dq_flower.compare.plots import write_plots
from dq_flower.compare.summary import run_summaries, summary_markdown
from dq_flower.json_out import strict_dumps

__all__ = ["RESULTS_FORMAT", "CSV_COLUMNS", "write_reports", "write_csv", "load_results"]

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
            for key, value in row.items():
                if value is None:
                    row[key] = math.nan
    return data

