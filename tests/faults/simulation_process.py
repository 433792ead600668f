"""A ``dq_flower.simulate`` run as its own process, for the simulation restart test.

Usage: python -m tests.faults.simulation_process WORKDIR [KILL_AFTER]

Runs DQ on the digits (4 clients, 5 rounds, the fixed upload schedule) in Flower's simulation
engine, checkpointing every round into WORKDIR/ckpt. With KILL_AFTER = k > 0 the process
sends itself SIGKILL as soon as round k's history row exists, before round k's checkpoint
is written. Run again with the same WORKDIR, the simulation restarts: new node ids, empty
client contexts, and the server resumes from its checkpoint. A run that ends writes its
history to WORKDIR/history.json.
"""

import json
import os
import signal
import sys
from pathlib import Path

import dq_flower

#: the fixed schedule (each client sends its budget every round), so that all 5 rounds run
KNOBS = dict(method="dq", dataset="digits", model="mlp", num_clients=4, rounds=5, seed=0,
             budget=64, bits=2, upload_schedule="fixed")


def main(workdir: str, kill_after: int = 0) -> None:
    work = Path(workdir)

    def on_round(row: dict) -> None:
        if kill_after and row["round"] == kill_after:
            os.kill(os.getpid(), signal.SIGKILL)

    result = dq_flower.simulate(**KNOBS, checkpoint_dir=str(work / "ckpt"),
                                checkpoint_every=1, on_round=on_round)
    (work / "history.json").write_text(json.dumps(result.history))


if __name__ == "__main__":
    main(sys.argv[1], *map(int, sys.argv[2:3]))
