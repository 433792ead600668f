"""Stochastic against nearest rounding of DQ's samples, at equal uplink bytes.

Stochastic rounding is unbiased, but its noise does not compress; nearest rounding is
biased and compresses better. This script measures both where it matters, at the same
uplink bytes:

1. the bytes per sample of each rounding, from the package's own quantizer and lossless
   stage in messages of 64 samples (the first ``--probe`` training images);
2. for a byte budget, one DQ round per rounding through the in-process harness: every
   client uploads as many uniformly chosen samples as the budget buys at that rounding,
   the server trains on them to a plateau (the package's defaults), and the model is
   scored on the test set. Bytes are the measured uplink of that round.

    .venv/bin/python simulations/rounding.py --budget-kb 240 --out results/rounding.json
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np

from dq_flower.dq.config import DQConfig
from dq_flower.harness.client_app import app as client_app
from dq_flower.harness.inprocess import InProcessGrid
from dq_flower.harness.server_app import run_server
from dq_flower.harness.simulate import build_run_config
from dq_flower.harness.tasks.data import load_dataset_cached
from dq_flower.wire.dq_batch import quantizer_for


def bytes_per_sample(x: np.ndarray, stochastic: bool, bits: int, seed: int) -> float:
    """Payload bytes per sample of 64-sample messages (codes and ranges, coded)."""
    cfg = DQConfig(bits=bits, stochastic=stochastic)
    quantizer = quantizer_for(cfg, "sample", 1)
    rng = np.random.default_rng(seed)
    total = 0
    for start in range(0, x.shape[0], 64):
        total += quantizer.encode(x[start:start + 64], rng).nbits
    return total / 8 / x.shape[0]


def one_round(stochastic: bool, per_client: int, args: argparse.Namespace) -> dict:
    """One DQ round at the package's defaults, ``per_client`` samples from each client."""
    config = build_run_config("dq", dataset=args.dataset, model=args.model,
                              num_clients=args.clients, rounds=1, seed=args.seed,
                              budget=per_client, bits=args.bits, stochastic=stochastic,
                              data_dir=args.data_dir)
    t0 = time.perf_counter()
    result = run_server(InProcessGrid(client_app, args.clients), config)
    row = result.history[-1]
    return {"stochastic": stochastic, "samples": int(row["stored"]),
            "up_bytes": int(row["cum_up_bytes"]), "accuracy": float(row["accuracy"]),
            "server_steps": int(row["server_steps"]), "wall_s": time.perf_counter() - t0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="fmnist")
    parser.add_argument("--model", default="wide-cnn")
    parser.add_argument("--data-dir", default="")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--bits", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--probe", type=int, default=6400)
    parser.add_argument("--budget-kb", type=float, default=240.0)
    parser.add_argument("--out", default="results/rounding.json")
    args = parser.parse_args()
    ds = load_dataset_cached(args.dataset, args.data_dir or None, args.seed)
    probe = ds.train_x[:args.probe].reshape(min(args.probe, len(ds.train_x)), -1)
    per = {s: bytes_per_sample(probe, s, args.bits, args.seed) for s in (True, False)}
    for s, b in per.items():
        print(f"{'stochastic' if s else 'nearest'}: {b:.1f} B/sample "
              f"({8 * b / probe.shape[1]:.3f} b/coord)", flush=True)
    runs = []
    for s in (True, False):
        per_client = max(1, math.floor(args.budget_kb * 1000 / per[s] / args.clients))
        run = one_round(s, per_client, args)
        run["payload_bytes_per_sample"] = per[s]
        runs.append(run)
        print(json.dumps(run), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"args": vars(args), "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
