"""A server that dies and resumes from an older checkpoint ends where an uninterrupted run
ends: same store, same history (bytes included), same model.

The crash is deterministic: the history callback raises right after round ``crash``
(before that round's checkpoint is written), so the resumed server restarts from the last
checkpoint, older than the rounds its clients already served. The clients keep their
state, as SuperNodes that outlive a server do.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from dq_flower.harness.checkpoint import load_latest
from dq_flower.harness.client_app import app as client_app
from dq_flower.harness.inprocess import InProcessGrid
from dq_flower.harness.server_app import run_server
from dq_flower.harness.simulate import build_run_config

ROUNDS = 8
VOLATILE = {"wall_s", "server_time_s", "client_time_s", "server_compute_s"}


class CrashError(Exception):
    pass


def _config(tmp_path, name, **knobs):
    return build_run_config("dq", num_clients=3, rounds=ROUNDS, seed=5, budget=40,
                            server_steps=6, min_holdout_rows=0,
                            checkpoint_dir=str(tmp_path / name), **knobs)


def _crash_after(crash):
    def on_round(row):
        if row["round"] == crash:
            raise CrashError
    return on_round


def _rows(history):
    """History rows without measured times (per-client entries keep their bytes only)."""
    out = []
    for row in history:
        # NaN (a round that trained nothing) compares unequal to itself: keep it as None
        kept = {k: None if isinstance(v, float) and math.isnan(v) else v
                for k, v in row.items() if k not in VOLATILE and k != "clients"}
        kept["clients"] = [entry[1:] for entry in row.get("clients", [])]
        out.append(kept)
    return out


@pytest.mark.parametrize(("every", "crash", "knobs"), [
    (1, 4, {}),
    (3, 5, {}),                       # resumes from round 3: rounds 4-5 were served before
    (3, 5, {"max_store_samples": 200, "store_eviction": "random"}),  # full from round 3
])
def test_resume_from_any_checkpoint_ends_like_an_uninterrupted_run(tmp_path, every, crash,
                                                                   knobs):
    straight = run_server(InProcessGrid(client_app, 3),
                          _config(tmp_path, "straight", checkpoint_every=every, **knobs))

    grid = InProcessGrid(client_app, 3)  # the clients survive the server
    config = _config(tmp_path, "crashed", checkpoint_every=every, **knobs)
    with pytest.raises(CrashError):
        run_server(grid, config, on_round=_crash_after(crash))
    resumed_from = load_latest(tmp_path / "crashed")["round"]
    assert resumed_from < crash  # the clients served rounds the checkpoint does not hold
    resumed = run_server(grid, config)

    assert _rows(resumed.history) == _rows(straight.history)
    a = load_latest(tmp_path / "straight")["strategy"]["store"]
    b = load_latest(tmp_path / "crashed")["strategy"]["store"]
    for key in ("codes", "labels", "ids", "node", "weights"):
        np.testing.assert_array_equal(a[key], b[key])
    np.testing.assert_array_equal(
        np.concatenate([v.reshape(-1) for v in load_latest(tmp_path / "straight")["arrays"]
                        .values()]),
        np.concatenate([v.reshape(-1) for v in load_latest(tmp_path / "crashed")["arrays"]
                        .values()]))


def test_a_second_reply_from_one_node_in_a_round_is_rejected():
    from dq_flower.dq.server.strategy import DQStrategy
    from dq_flower.harness.methods import client_task_config
    from dq_flower.harness.runtime import build_model, task_info
    from dq_flower.harness.task_config import TaskConfig

    task = TaskConfig(num_partitions=2, seed=1)
    strategy = DQStrategy(build_model(task, task_info(task)), seed=1, budget=8,
                          min_holdout_rows=0)
    grid = InProcessGrid(client_app, 2)
    replies = grid.send_and_receive(strategy.configure_train(
        1, None, client_task_config(task, "dq"), grid))
    _, metrics = strategy.aggregate_train(1, [*replies, replies[0]])
    assert metrics["rejected"] == 1 and metrics["stored"] == 16  # not 24 rows
