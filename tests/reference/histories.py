"""Reference histories of three presets, recorded to show a refactor changes no behaviour.

``python -m tests.reference.histories --write`` records them into
``tests/reference/<machine kind>/*.json`` (run from the project root with
``OMP_NUM_THREADS=1``); ``tests/test_reference_histories.py`` reruns the same scenarios and
compares. Timing figures are dropped; everything else a round reports (accuracy, loss,
bytes, samples stored, the schedule's asks) is kept.

PyTorch's CPU kernels differ between processors (AVX2 or AVX-512 code paths, the vendor's
BLAS paths), so the last bits of a float sum, and with them a coded update's size, differ
too: a history is exact only on the kind of machine that recorded it
(:func:`machine_kind`). ``first-recorded/`` holds the histories recorded before the
package's layers were reorganised, on the machine of that time (DQ's rows since re-recorded
on an AMD AVX-512 machine, where an exhausted schedule began to probe); on a kind of
machine with no references of its own the test compares with them at :data:`LOOSE`
tolerances.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from dq_flower.cli import main as cli_main

HERE = Path(__file__).resolve().parent
#: The histories recorded before the layers were reorganised (the kind of machine unknown).
FIRST = HERE / "first-recorded"
#: Tolerances against another kind of machine's references: final accuracy (absolute) and
#: total uplink bytes (relative) per method; the rounds run and the methods exactly.
LOOSE = {"accuracy": 0.05, "cum_up_bytes": 0.10}

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


def machine_kind() -> str:
    """``<machine>-<PyTorch CPU capability>-<CPU vendor>[-family<n>]``.

    E.g. ``x86_64-AVX512-AuthenticAMD-family26``: the math libraries pick kernels by the
    processor's generation too (two AMD EPYC generations, both AVX-512, differed in the
    last bits of a loss and so in a compressed broadcast's bytes).
    """
    import platform

    import torch  # PyTorch: deferred to when a kind is asked for

    found: dict[str, str] = {}
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("vendor_id", "CPU implementer", "cpu family"):
                found.setdefault(key.strip(), value.strip().replace(" ", ""))
    vendor = found.get("vendor_id", found.get("CPU implementer", "unknown"))
    family = f"-family{found['cpu family']}" if "cpu family" in found else ""
    return f"{platform.machine()}-{torch.backends.cpu.get_cpu_capability()}-{vendor}{family}"


def reference_folder() -> Path:
    """This kind of machine's references (which may not exist yet)."""
    return HERE / machine_kind()


def loose_differences(expected: dict[str, list[dict[str, Any]]],
                      actual: dict[str, list[dict[str, Any]]], where: str = "") -> list[str]:
    """Where ``actual`` differs from another machine's ``expected`` beyond :data:`LOOSE`."""
    if set(expected) != set(actual):
        return [f"{where}: methods {sorted(actual)}, expected {sorted(expected)}"]
    out = []
    for label, rows in expected.items():
        got = actual[label]
        if len(got) != len(rows):
            out.append(f"{where}.{label}: {len(got)} rounds, expected {len(rows)}")
            continue
        acc, want = float(got[-1]["accuracy"]), float(rows[-1]["accuracy"])
        if not abs(acc - want) <= LOOSE["accuracy"]:
            out.append(f"{where}.{label}: final accuracy {acc:.4f}, expected {want:.4f}")
        up, want_up = float(got[-1]["cum_up_bytes"]), float(rows[-1]["cum_up_bytes"])
        if not abs(up - want_up) <= LOOSE["cum_up_bytes"] * want_up:
            out.append(f"{where}.{label}: uplink {up:.0f} B, expected {want_up:.0f} B")
    return out


def compare_with_references(name: str, got: dict[str, list[dict[str, Any]]]) -> list[str]:
    """This machine kind's exact differences, else the loose ones from the first record."""
    own = reference_folder() / f"{name}.json"
    if own.exists():
        return differences(json.loads(own.read_text()), got, name)
    return loose_differences(json.loads((FIRST / f"{name}.json").read_text()), got, name)


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
    folder = reference_folder()
    print(f"machine kind {folder.name}: " + ("exact references" if folder.is_dir() else
                                             "none recorded; loose comparison"))
    for name in SCENARIOS:
        got = run_scenario(name, Path(args.work) / name)
        if args.write:
            folder.mkdir(exist_ok=True)
            path = folder / f"{name}.json"
            path.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
            print(f"wrote {path}")
        else:
            diff = compare_with_references(name, got)
            print(f"{name}: {'identical' if not diff else chr(10).join(diff[:20])}")


if __name__ == "__main__":
    main()
