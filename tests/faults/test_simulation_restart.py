"""Kill a simulation with SIGKILL and start it again: it ends as an uninterrupted run ends.

Flower's simulation engine gives the restarted run new node ids and empty client contexts;
DQ keys its per-client state by the clients' identities (their partition ids) and tells
each client which of its rows the server holds, so the resumed run uploads, stores and
trains exactly as the uninterrupted one. Only the downlink of the first round after the
restart differs: the server cannot name the new node ids yet, so each gets the table of
every client's held set.
"""

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dq_flower.harness.checkpoint import load_latest
from dq_flower.harness.client_app import app as client_app
from dq_flower.harness.inprocess import InProcessGrid
from dq_flower.harness.server_app import run_server
from dq_flower.harness.simulate import build_run_config
from tests.faults.simulation_process import KNOBS

ROOT = Path(__file__).resolve().parents[2]
KILL_AFTER = 4
#: what changes: measured times, and the downlink from the round after the restart on
VOLATILE = {"wall_s", "server_time_s", "client_time_s", "server_compute_s", "clients"}
DOWNLINK = {"down_bytes", "cum_down_bytes", "held_set_bytes"}


def _run(workdir: Path, kill_after: int = 0) -> int:
    """Run tests/faults/simulation_process.py in its own session; its exit code.

    Whatever the run leaves behind in that session (Ray's processes) is killed after it.
    """
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.faults.simulation_process", str(workdir),
         str(kill_after)],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**os.environ, "OMP_NUM_THREADS": "1"}, start_new_session=True)
    try:
        return proc.wait(timeout=240)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


@pytest.mark.slow
def test_a_killed_simulation_restarts_with_new_node_ids_and_ends_identically(tmp_path):
    # the uninterrupted run, on the in-process grid: the same apps, run config and seeds
    knobs = dict(KNOBS)
    method = knobs.pop("method")
    config = build_run_config(method, **knobs, checkpoint_dir=str(tmp_path / "straight"))
    straight = run_server(InProcessGrid(client_app, KNOBS["num_clients"]), config).history

    work = tmp_path / "killed"
    assert _run(work, KILL_AFTER) == -signal.SIGKILL
    assert load_latest(work / "ckpt")["round"] == KILL_AFTER - 1
    assert _run(work) == 0  # the restart: new node ids, empty contexts, resumed server
    resumed = json.loads((work / "history.json").read_text())

    def rows(history, drop):
        return [{k: v for k, v in r.items() if k not in VOLATILE | drop} for r in history]

    assert [r["round"] for r in resumed] == list(range(KNOBS["rounds"] + 1))
    assert sum(r.get("rejected", 0) for r in resumed) == 0
    # accuracy, loss, uplink bytes and payload, store: as the uninterrupted run's
    assert rows(resumed, DOWNLINK) == rows(straight, DOWNLINK)
    # the downlink too, but from the first round the restarted run served
    assert rows(resumed[:KILL_AFTER], set()) == rows(straight[:KILL_AFTER], set())
    a, b = load_latest(tmp_path / "straight"), load_latest(work / "ckpt")
    assert b["strategy"]["store"]["node_table"].tolist() == [0, 1, 2, 3]  # one per client
    for key in ("codes", "ids", "node", "labels", "holdout"):
        np.testing.assert_array_equal(a["strategy"]["store"][key],
                                      b["strategy"]["store"][key])
    for name, value in a["arrays"].items():
        np.testing.assert_array_equal(value.numpy(), b["arrays"][name].numpy())
