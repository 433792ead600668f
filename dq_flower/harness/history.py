"""Per-round history of a run: accuracy, loss, bytes per direction (and cumulative), time."""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dq_flower.json_out import strict_dumps

__all__ = ["RunResult", "HISTORY_KEYS"]

#: Keys every history row has.
HISTORY_KEYS = ("round", "accuracy", "loss", "up_bytes", "down_bytes", "cum_up_bytes",
                "cum_down_bytes", "wall_s")


@dataclass
class RunResult:
    """Outcome of one run of one method.

    Attributes
    ----------
    method : str
        Method name.
    config : dict
        The run config (hyphenated keys) with the method's knobs as the run used them (a
        method's own defaults in, "not set" spellings resolved).
    history : list of dict
        One row per round (round 0 is the initial model): at least :data:`HISTORY_KEYS`,
        plus the strategy's per-round metrics (``up_payload_bits``, ``selected``, ...).
    num_params : int
        Model dimension D.
    data_dim : int
        Data dimension d.
    """

    method: str
    config: dict[str, Any]
    history: list[dict[str, Any]] = field(default_factory=list)
    num_params: int = 0
    data_dim: int = 0

    @property
    def final_accuracy(self) -> float:
        """Test accuracy after the last round."""
        return float(self.history[-1]["accuracy"]) if self.history else float("nan")

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {"method": self.method, "config": self.config, "num_params": self.num_params,
                "data_dim": self.data_dim, "history": self.history}

    def save(self, path: str | Path) -> Path:
        """Write JSON (``.json``) or CSV (``.csv``) by suffix."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix == ".csv":
            keys = sorted({k for row in self.history for k, v in row.items()
                           if not isinstance(v, (list, dict))},  # per-client lists: JSON only
                          key=lambda k: (k not in HISTORY_KEYS, k))
            with path.open("w", newline="") as fh:
                writer = csv.DictWriter(fh, fieldnames=["method", *keys])
                writer.writeheader()
                for row in self.history:
                    writer.writerow({"method": self.method,
                                     **{k: v for k, v in row.items() if k in keys}})
        else:
            path.write_text(strict_dumps(self.to_json(), indent=1))
        return path

    @classmethod
    def load(cls, path: str | Path) -> RunResult:
        """Read a JSON file written by :meth:`save` (``null`` in a history row reads as nan)."""
        data = json.loads(Path(path).read_text())
        for row in data["history"]:  # null: a non-finite number (strict JSON)
            row.update({k: math.nan for k in HISTORY_KEYS if k in row and row[k] is None})
        return cls(data["method"], data["config"], data["history"], data["num_params"],
                   data["data_dim"])
