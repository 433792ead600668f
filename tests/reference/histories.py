"""Reference histories of three presets, recorded to show a refactor changes no behaviour.

``python -m tests.reference.histories --write`` records them into ``tests/reference/*.json``
(run from the project root with ``OMP_NUM_THREADS=1``); ``tests/test_reference_histories.py``
reruns the same scenarios and compares. Timing figures are dropped; everything else a
round reports (accuracy, loss, bytes, samples stored, the schedule's asks) is kept.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from dq_flower.cli import main as cli_main

HERE = Path(__file__).resolve().parent

#: name -> (compare arguments). Few rounds, in-process: seconds each, every strategy kind.
SCENARIOS: dict[str, list[str]] = {
    "digits-mlp": ["--preset", "digits-mlp", "--rounds", "5",
                   "--methods", "dq,qsgd,fedavg-qsgd2,ef-signsgd-tau5"],
    "digits-mlp-dirichlet": ["--preset", "digits-mlp", "--partition", "dirichlet",
                             "--rounds", "5", "--methods", "dq,topk,fedavg-topk"],
    "digits-upload-mode": ["--preset", "digits-upload-mode", "--rounds", "5"],
}

#: Per-round keys that measure time on this machine, not behaviour.
TIMING_KEYS = frozenset({"wall_s", "client_time_s", "server_compute_s", "server_time_s",
                         "clients"})


def run_scenario(name: str, out: Path) -> dict[str, list[dict[str, Any]]]:
    """Run scenario ``name`` in-process into ``out``; each method's history, timing dropped."""
    code = cli_main(["compare", *SCENARIOS[name], "--engine", "inprocess", "--quiet",
                     "--out", str(out)])
    if code != 0:
        raise RuntimeError(f"compare {name} exited {code}")
    runs = json.loads((out / "results.json").read_text())["runs"]
    return {run["label"]: [{k: v for k, v in row.items() if k not in TIMING_KEYS}
                           for row in run["history"]] for run in runs}


def differences(expected: Any, actual: Any, where: str = "", rel: float = 1e-9) -> list[str]:
    """Where ``actual`` differs from ``expected``: integers and strings exactly, floats to
    ``rel`` (the last bits of a float sum may differ between CPUs, nothing else may)."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        out = [f"{where}.{k}: missing" for k in expected if k not in actual]
        out += [f"{where}.{k}: unexpected" for k in actual if k not in expected]
        for key in expected.keys() & actual.keys():
            out += differences(expected[key], actual[key], f"{where}.{key}", rel)
        return out
    if isinstance(expected, list) and isinstance(actual, list):
        if len(expected) != len(actual):
            return [f"{where}: {len(actual)} entries, expected {len(expected)}"]
        return [d for i, (e, a) in enumerate(zip(expected, actual, strict=True))
                for d in differences(e, a, f"{where}[{i}]", rel)]
    if isinstance(expected, float) and isinstance(actual, (int, float)):
        if math.isclose(expected, actual, rel_tol=rel, abs_tol=1e-12):
            return []
    elif expected == actual and type(expected) is type(actual):
        return []
    return [f"{where}: {actual!r}, expected {expected!r}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--write", action="store_true", help="record the references")
    parser.add_argument("--work", default="/tmp/dq-reference-histories")
    args = parser.parse_args()
    for name in SCENARIOS:
        got = run_scenario(name, Path(args.work) / name)
        path = HERE / f"{name}.json"
        if args.write:
            path.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
            print(f"wrote {path}")
        else:
            diff = differences(json.loads(path.read_text()), got, name)
            print(f"{name}: {'identical' if not diff else chr(10).join(diff[:20])}")


if __name__ == "__main__":
    main()
