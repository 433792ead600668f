"""A DQ server run as its own process, for the kill-and-resume test.

Usage: python -m tests.faults.server_process WORKDIR ROUNDS
Clients run in-process but keep their state in WORKDIR/nodes (like SuperNodes that
survive the server); the server checkpoints every round into WORKDIR/ckpt and, when done,
writes the final flat model to WORKDIR/final.npy and the store size to WORKDIR/stored.txt.
"""

import sys
from pathlib import Path

import numpy as np

from dq_flower.harness.client_app import app as client_app
from dq_flower.harness.inprocess import InProcessGrid
from dq_flower.harness.server_app import run_server
from dq_flower.harness.simulate import build_run_config


def main(workdir: str, rounds: int) -> None:
    work = Path(workdir)
    cfg = build_run_config("dq", num_clients=3, rounds=rounds, seed=4, budget=24,
                           server_steps=30, compensation="ef-sign",
                           checkpoint_dir=str(work / "ckpt"))
    grid = InProcessGrid(client_app, 3, state_dir=str(work / "nodes"))
    result = run_server(grid, cfg)
    from dq_flower.harness.checkpoint import load_latest

    state = load_latest(work / "ckpt")
    flat = np.concatenate([v.reshape(-1).numpy() for v in state["arrays"].values()])
    np.save(work / "final.npy", flat)
    (work / "stored.txt").write_text(str(result.history[-1]["stored"]))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
