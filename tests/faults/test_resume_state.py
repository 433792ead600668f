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


# ---------------------------------------------------------------- resumes that are refused
def _short(folder, method="dq", rounds=3, seed=5, **knobs):
    """A short run on ``folder``'s checkpoint: DQ at 2 bits, fixed uploads."""
    if method == "dq":
        knobs = {"budget": 40, "server_steps": 6, "min_holdout_rows": 0,
                 "upload_schedule": "fixed", "bits": 2, **knobs}
    return build_run_config(method, num_clients=3, rounds=rounds, seed=seed,
                            checkpoint_dir=str(folder), **knobs)


@pytest.fixture(scope="module")
def dq_run(tmp_path_factory):
    """The checkpoint folder of a 2-round DQ run (rounds 1 and 2 saved): copy it to use it."""
    folder = tmp_path_factory.mktemp("dq") / "ckpt"
    run_server(InProcessGrid(client_app, 3), _short(folder, rounds=2))
    return folder


def _copy(dq_run, tmp_path):
    import shutil

    return shutil.copytree(dq_run, tmp_path / "ckpt")


def _files(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.mark.parametrize(("method", "knobs", "says"), [
    ("fedavg", {}, "method: .*'dq'.*'fedavg'"),  # it once overwrote DQ's store with nothing
    ("qsgd", {}, "method: .*'dq'.*'qsgd'"),  # it once raised KeyError: 'version'
    ("dq", {"bits": 4}, "bits: .*2.*4"),  # once: every later reply failed store insertion
    ("dq", {"dither": True}, "dither: .*False.*True"),
    ("dq", {"ranges": "feature"}, "ranges: .*'sample'.*'feature'"),
    ("dq", {"model": "logreg"}, "model: .*'mlp'.*'logreg'"),
    ("dq", {"seed": 6}, "seed: .*5.*6"),  # once blamed a held-out secret nobody set
])
def test_a_resume_under_another_method_or_row_layout_is_refused_before_any_round(
        dq_run, tmp_path, method, knobs, says):
    folder = _copy(dq_run, tmp_path)
    before, rows = _files(folder), []
    with pytest.raises(ValueError, match=says) as refused:
        run_server(InProcessGrid(client_app, 3), _short(folder, method, **knobs),
                   on_round=rows.append)
    assert str(folder / "server-state.pt") in str(refused.value)
    assert "secret" not in str(refused.value)
    assert rows == [] and _files(folder) == before  # nothing ran, nothing was written


def test_knobs_that_leave_the_stored_rows_as_they_are_may_change_on_resume(dq_run, tmp_path):
    folder = _copy(dq_run, tmp_path)
    resumed = run_server(InProcessGrid(client_app, 3),
                         _short(folder, rounds=4, server_steps=10, max_store_samples=100,
                                ranges="channel"))  # one-channel images: the same ranges
    assert [r["round"] for r in resumed.history] == [0, 1, 2, 3, 4]
    assert [r["rejected"] for r in resumed.history[3:]] == [0, 0]
    assert [r["stored"] for r in resumed.history[3:]] == [100, 100]


def test_an_unreadable_checkpoint_resumes_from_the_one_before_and_keeps_both(
        dq_run, tmp_path, caplog):
    folder = _copy(dq_run, tmp_path)
    newest = folder / "server-state.pt"
    corrupt = newest.read_bytes()[:1000]  # truncated
    newest.write_bytes(corrupt)
    resumed = run_server(InProcessGrid(client_app, 3), _short(folder, rounds=3))
    assert f"{newest} cannot be read" in caplog.text
    assert "resuming from server-state.prev.pt, of round 1" in caplog.text
    assert [r["round"] for r in resumed.history] == [0, 1, 2, 3]
    assert load_latest(folder)["round"] == 3
    # the unreadable file is kept aside, not overwritten; the one before is round 2's
    assert (folder / "server-state.unreadable.pt").read_bytes() == corrupt
    import torch

    assert torch.load(folder / "server-state.prev.pt", weights_only=False)["round"] == 2


def test_a_plugin_dq_strategy_refuses_a_checkpoint_of_another_row_layout():
    import torch

    from dq_flower import DQStrategy
    from dq_flower.wire.dq_batch import DataSpec

    def strategy(**knobs):
        model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))
        return DQStrategy(model, data_spec=DataSpec((1, 8, 8), "class", 1), **knobs)

    state = strategy(bits=2).state_dict()
    with pytest.raises(ValueError, match="^bits: .* 2.* 4"):
        strategy(bits=4).load_state_dict(state)
    strategy(bits=2, server_steps=3, max_store_samples=10).load_state_dict(state)


def test_a_run_on_the_users_arrays_resumes_though_each_start_writes_them_to_a_new_file(
        tmp_path):
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    arrays = ((x / 16).astype(np.float32)[:600], y[:600])
    for rounds in (1, 2):  # each config names another temporary npz: file
        resumed = run_server(InProcessGrid(client_app, 3),
                             _short(tmp_path / "ckpt", rounds=rounds, dataset=arrays))
    assert [r["round"] for r in resumed.history] == [0, 1, 2]
