"""A server run as its own process, for the kill-and-resume test.

Usage: python -m tests.faults.server_process WORKDIR ROUNDS [METHOD] [EVERY] [KILL_AFTER]

Clients run in-process but keep their state in WORKDIR/nodes (like SuperNodes that
survive the server); the server checkpoints every EVERY rounds (default 1) into
WORKDIR/ckpt. With KILL_AFTER = k > 0 the process sends itself SIGKILL as soon as round k's
history row exists, before round k's checkpoint is written: a deterministic crash point
that makes the resumed run replay the rounds after its last checkpoint (rounds its clients
already served). Without it the run ends normally and writes the history (WORKDIR/history.json),
the final flat model (WORKDIR/final.npy) and, for DQ, the store size (WORKDIR/stored.txt).
"""

import json
import os
import signal
import sys
from pathlib import Path

import numpy as np

from dq_flower.harness.checkpoint import load_latest
from dq_flower.harness.client_app import app as client_app
from dq_flower.harness.inprocess import InProcessGrid
from dq_flower.harness.server_app import run_server
from dq_flower.harness.simulate import build_run_config

KNOBS = {
    "dq": dict(budget=24, server_steps=30, compensation="ef-sign", upload_schedule="fixed"),
    "ef-signsgd": {},
}


def main(workdir: str, rounds: int, method: str = "dq", every: int = 1,
         kill_after: int = 0) -> None:
    work = Path(workdir)
    cfg = build_run_config(method, num_clients=3, rounds=rounds, seed=4,
                           checkpoint_dir=str(work / "ckpt"), checkpoint_every=every,
                           **KNOBS[method])
    grid = InProcessGrid(client_app, 3, state_dir=str(work / "nodes"))

    def on_round(row: dict) -> None:
        if row["round"] == kill_after:
            os.kill(os.getpid(), signal.SIGKILL)

    result = run_server(grid, cfg, on_round=on_round if kill_after else None)
    state = load_latest(work / "ckpt")
    flat = np.concatenate([v.reshape(-1).numpy() for v in state["arrays"].values()])
    np.save(work / "final.npy", flat)
    (work / "history.json").write_text(json.dumps(result.history))
    if "stored" in result.history[-1]:
        (work / "stored.txt").write_text(str(result.history[-1]["stored"]))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), *sys.argv[3:4], *map(int, sys.argv[4:6]))
