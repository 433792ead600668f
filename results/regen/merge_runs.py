"""Add the finished runs of other compare folders to one folder's results.json.

Usage: python results/regen/merge_runs.py OUT SRC [SRC ...]

Each SRC's finished runs go into OUT's ``pending`` list (a run of the same label in OUT
is replaced), so that ``dq-flower compare --out OUT --resume`` with the union of the
methods and the same ``--set`` flags reuses every one of them (its run config must be
identical) and writes one summary. Nothing is rerun or edited.
"""

import json
import sys
from pathlib import Path


def main(out: str, sources: list[str]) -> None:
    path = Path(out) / "results.json"
    data = json.loads(path.read_text())
    merged = {r["label"]: r for r in [*data.get("runs", []), *data.get("pending", [])]}
    for src in sources:
        other = json.loads((Path(src) / "results.json").read_text())
        if other.get("engine") != data.get("engine"):
            raise SystemExit(f"{src}: engine {other.get('engine')!r}, not {data.get('engine')!r}")
        for run in other.get("runs", []):
            if not run.get("failed"):
                merged[run["label"]] = run
                print(f"{src}: {run['label']}")
    data["pending"] = list(merged.values())
    data["runs"] = []
    path.write_text(json.dumps(data, indent=1))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
