"""DQ's adaptive schedule under partial participation over a large population.

Fashion-MNIST's training rows tiled to ``--rows`` rows (default 240,000) are split IID over
``--clients`` simulated clients (default 100,000: about 2.4 rows each) and ``--sampled``
of them (default 100) are drawn each round; the MLP is trained by DQ at its defaults on
the package's in-process grid (the same strategy and client code as Flower's simulation
engine, without Ray's per-node processes). Most nodes a round samples are new to the
server, and most it knows have sent every row they hold: the run shows whether the asks
still reach the nodes sampled. Prints, per round, the samples stored, the next ask, the
uplink, the test accuracy and the round's wall time, and the server's peak memory.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/many_clients.py [--clients 100000]
        [--rows 240000] [--sampled 100] [--rounds 4] [--data-dir DIR]
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")

from dq_flower.harness.client_app import app as client_app  # noqa: E402
from dq_flower.harness.inprocess import InProcessGrid  # noqa: E402
from dq_flower.harness.server_app import run_server  # noqa: E402
from dq_flower.harness.simulate import build_run_config  # noqa: E402
from dq_flower.harness.tasks.data import load_dataset  # noqa: E402


def tiled_fmnist(rows: int, data_dir: str | None, folder: Path, name: str = "fmnist") -> str:
    """An ``npz:`` data set of Fashion-MNIST's (or ``name``'s) training rows tiled to ``rows``."""
    data = load_dataset(name, data_dir=data_dir)
    reps = -(-rows // len(data.train_y))
    x = np.concatenate([data.train_x] * reps)[:rows]
    y = np.concatenate([data.train_y] * reps)[:rows]
    path = folder / f"{name}-tiled.npz"
    np.savez(path, x_train=x, y_train=y, x_test=data.test_x[:2000],
             y_test=data.test_y[:2000], num_classes=10)
    return f"npz:{path}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=100_000)
    parser.add_argument("--rows", type=int, default=240_000)
    parser.add_argument("--sampled", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--data-dir", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        dataset = tiled_fmnist(args.rows, args.data_dir, Path(tmp))
        config = build_run_config("dq", dataset=dataset, model="mlp",
                                  num_clients=args.clients, rounds=args.rounds, seed=0,
                                  fraction_train=args.sampled / args.clients)
        t0 = time.perf_counter()
        grid = InProcessGrid(client_app, args.clients)
        print(f"{args.clients:,} clients, {args.rows:,} rows, {args.sampled} sampled a "
              f"round; grid built in {time.perf_counter() - t0:.1f} s")
        print("| round | sampled nodes asked | new samples | stored | next ask | uplink B | "
              "accuracy | wall s |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|")
        last = [time.perf_counter(), 0]

        def on_round(row: dict) -> None:
            if row["round"] == 0:
                last[0] = time.perf_counter()
                return
            asked = len(grid.sent) - last[1]
            last[1] = len(grid.sent)
            now = time.perf_counter()
            print(f"| {row['round']} | {asked} | {row.get('selected', 0)} | "
                  f"{row.get('stored', 0)} | {row.get('next_ask', 0)} | {row['up_bytes']} | "
                  f"{row['accuracy']:.3f} | {now - last[0]:.1f} |", flush=True)
            last[0] = now

        run_server(grid, config, on_round=on_round)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak memory of the process (server and in-process clients): {peak_mb:,.0f} MB")


if __name__ == "__main__":
    sys.exit(main())
