"""Many simulated clients in Flower's simulation engine (Ray): time per round, server memory.

The run of ``benchmarks/many_clients.py`` (Fashion-MNIST's training rows, or
``--dataset``'s, tiled to ``--rows`` rows, split IID over ``--clients`` clients,
``--sampled`` of them drawn each round, the MLP), but in Flower's simulation engine: one
SuperNode per client registered in Flower's in-memory link state, the clients run by Ray's
workers, the ServerApp in this process. Prints, per round, the clients that replied, the
samples stored (DQ) and the uplink, the accuracy and the round's wall time; then the
server process's resident memory once every node has registered (round 0) and at its
peak, and the resident memory of Ray's processes.

``--sizes 10000,30000,100000`` runs one child process per size and method (peak memory
is per process) and prints the figures side by side with the memory per registered client:
the least-squares slope of the peak against the number of clients.

    OMP_NUM_THREADS=1 RAY_TMPDIR=/tmp/rt FLWR_HOME=/tmp/fh .venv/bin/python \\
        benchmarks/many_clients_simulation.py [--clients 100000] [--methods dq,qsgd]
        [--sizes 10000,30000,100000] [--rows 240000] [--sampled 100] [--rounds 4]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from many_clients import tiled_fmnist  # noqa: E402

from dq_flower.harness.simulate import simulate  # noqa: E402

MB = 1024 * 1024


def _status_kb(key: str, pid: str = "self") -> int:
    """A ``/proc/<pid>/status`` memory line (``VmRSS``, ``VmHWM``) in kB; 0 where gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        return 0
    return 0


def descendants_rss_mb() -> float:
    """Resident memory of this process's descendants (Ray's GCS, raylet and workers), MB."""
    parent: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1]
                                              .split()[1])
            except (OSError, IndexError, ValueError):
                continue
    mine, frontier = set(), {os.getpid()}
    while frontier:
        frontier = {pid for pid, ppid in parent.items() if ppid in frontier} - mine
        mine |= frontier
    return sum(_status_kb("VmRSS", str(pid)) for pid in mine) / 1024


def run_one(method: str, clients: int, rows: int, sampled: int, rounds: int,
            data_dir: str | None, dataset: str = "fmnist") -> dict[str, Any]:
    """One run in Flower's simulation engine; its per-round rows and memory figures."""
    with tempfile.TemporaryDirectory() as tmp:
        dataset = tiled_fmnist(rows, data_dir, Path(tmp), dataset)
        before_mb = _status_kb("VmRSS") / 1024
        t0 = time.perf_counter()
        rounds_out: list[dict[str, Any]] = []
        marks = {"ready_mb": 0.0, "ready_s": 0.0, "workers_mb": 0.0}
        last = [t0]

        def on_round(row: dict[str, Any]) -> None:
            now = time.perf_counter()
            if row["round"] == 0:  # every node registered, the model evaluated once
                marks.update(ready_mb=_status_kb("VmRSS") / 1024, ready_s=now - t0)
            else:
                marks["workers_mb"] = max(marks["workers_mb"], descendants_rss_mb())
                rounds_out.append({
                    "round": row["round"], "replies": int(row.get("replies", 0) or 0),
                    "selected": int(row.get("selected", 0) or 0),
                    "stored": int(row.get("stored", 0) or 0),
                    "next_ask": int(row.get("next_ask", 0) or 0),
                    "store_bytes": int(row.get("store_bytes", 0) or 0),
                    "up_bytes": int(row["up_bytes"]), "accuracy": float(row["accuracy"]),
                    "wall_s": now - last[0], "rss_mb": _status_kb("VmRSS") / 1024})
                print(f"  {method} round {row['round']}: {rounds_out[-1]}", flush=True)
            last[0] = now

        simulate(method, dataset, "mlp", num_clients=clients, rounds=rounds, seed=0,
                 fraction_train=sampled / clients, on_round=on_round)
        total_s = time.perf_counter() - t0
    return {"method": method, "clients": clients, "rows": rows, "sampled": sampled,
            "rounds": rounds_out, "before_mb": before_mb, "total_s": total_s,
            "peak_mb": _status_kb("VmHWM") / 1024, **marks}


def report(runs: list[dict[str, Any]]) -> None:
    """The runs side by side, and the memory per registered client of each method."""
    print("| method | clients | nodes registered, s | median s/round | samples stored per "
          "round | rounds storing | server RSS at round 0, MB | peak, MB | Ray processes, MB "
          "| total s |")
    print("|---|---:|---:|---:|---|---:|---:|---:|---:|---:|")
    for r in runs:
        per_round = [x["wall_s"] for x in r["rounds"]]
        new = [x["selected"] for x in r["rounds"]]
        stored = "-" if r["method"] != "dq" else ", ".join(str(n) for n in new)
        storing = "-" if r["method"] != "dq" else f"{sum(n > 0 for n in new)}/{len(new)}"
        print(f"| {r['method']} | {r['clients']:,} | {r['ready_s']:.0f} | "
              f"{statistics.median(per_round):.1f} | {stored} | {storing} | "
              f"{r['ready_mb']:,.0f} | {r['peak_mb']:,.0f} | {r['workers_mb']:,.0f} | "
              f"{r['total_s']:.0f} |")
    for method in dict.fromkeys(r["method"] for r in runs):
        pts = [(r["clients"], r["peak_mb"]) for r in runs if r["method"] == method]
        if len(pts) < 2:
            continue
        mx = statistics.fmean(n for n, _ in pts)
        my = statistics.fmean(m for _, m in pts)
        slope = (sum((n - mx) * (m - my) for n, m in pts)
                 / sum((n - mx) ** 2 for n, _ in pts))  # MB per client
        print(f"{method}: server peak RSS grows by {slope * MB / 1024:,.1f} kB per registered "
              f"client (least squares over {len(pts)} sizes; "
              f"{slope * 1_000_000 / 1024:,.1f} GB per million clients)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=100_000)
    parser.add_argument("--sizes", default="",
                        help="comma-separated client counts, one child process each")
    parser.add_argument("--methods", default="dq,qsgd")
    parser.add_argument("--rows", type=int, default=240_000)
    parser.add_argument("--sampled", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--dataset", default="fmnist", help="the data set tiled (fmnist, digits)")
    parser.add_argument("--json", default="", help="write this run's figures here (one run)")
    args = parser.parse_args()
    methods = [m for m in args.methods.split(",") if m]
    sizes = [int(s) for s in args.sizes.split(",") if s] or [args.clients]
    if args.sampled < 1 or any(n < args.sampled for n in sizes):
        raise SystemExit("sampled: must be >= 1 and at most the number of clients")
    if args.json or (len(sizes) == 1 and len(methods) == 1):
        run = run_one(methods[0], sizes[0], args.rows, args.sampled, args.rounds,
                      args.data_dir, args.dataset)
        if args.json:
            Path(args.json).write_text(json.dumps(run))
        report([run])
        return
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for clients in sizes:
            for method in methods:
                out = Path(tmp) / f"{method}-{clients}.json"
                cmd = [sys.executable, __file__, "--clients", str(clients), "--methods", method,
                       "--rows", str(args.rows), "--sampled", str(args.sampled),
                       "--rounds", str(args.rounds), "--dataset", args.dataset,
                       "--json", str(out)]
                if args.data_dir:
                    cmd += ["--data-dir", args.data_dir]
                print(f"$ {' '.join(cmd[1:])}", flush=True)
                subprocess.run(cmd, check=True)
                runs.append(json.loads(out.read_text()))
    report(runs)
    if any(math.isnan(x["accuracy"]) for r in runs for x in r["rounds"]):
        print("(accuracy nan: a round without central evaluation)")


if __name__ == "__main__":
    sys.exit(main())
