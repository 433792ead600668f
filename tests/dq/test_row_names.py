"""A node's rows are named by their content, so data that changes between rounds is followed.

Rows were named by position: a node keeping a rolling window (a phone's last readings) had
its new rows taken for old ones the server held (a user's HAPT app stored 510 of the
2,449 windows its phones held, and said in its last rounds that every node had sent all),
and an honest reply after its data shrank was refused (its count below the rows held).
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import ArrayRecord, Context, RecordDict
from sklearn.datasets import load_digits
from torch import nn

import dq_flower
from dq_flower.harness.inprocess import InProcessGrid

X, Y = load_digits(return_X_y=True)
X = (X / 16).astype(np.float32)
WINDOW, SLIDE, ROUNDS = 60, 20, 6


def _names(context, x, y):
    from dq_flower.dq.client.sent import row_names

    return row_names(context, x, y)


def _context() -> Context:
    return Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})


def test_static_rows_are_named_by_their_positions_every_round():
    context, x, y = _context(), X[:50], Y[:50]
    for _ in range(2):
        names, named = _names(context, x, y)
        assert names.tolist() == list(range(50)) and named == 50


def test_rows_keep_their_names_in_any_order_and_new_rows_get_the_next():
    context = _context()
    _names(context, X[:30], Y[:30])
    order = np.random.default_rng(0).permutation(40)  # 10 new rows among the 30, shuffled
    names, named = _names(context, X[:40][order], Y[:40][order])
    assert named == 40
    assert names[order < 30].tolist() == order[order < 30].tolist()
    assert sorted(names[order >= 30].tolist()) == list(range(30, 40))


def test_a_row_and_its_copy_get_two_names_kept_in_order():
    context = _context()
    x, y = np.concatenate([X[:5], X[:2]]), np.concatenate([Y[:5], Y[:2]])
    assert _names(context, x, y)[0].tolist() == list(range(7))
    names, named = _names(context, x[::-1], y[::-1])  # the copies come first now
    assert named == 7 and sorted(names.tolist()) == list(range(7))
    assert _names(context, x, y)[0].tolist() == list(range(7))


def test_rows_that_leave_keep_their_names_from_the_others():
    context = _context()
    _names(context, X[:30], Y[:30])
    names, named = _names(context, X[10:40], Y[10:40])
    assert names.tolist() == list(range(10, 40)) and named == 40


def test_a_changed_label_makes_a_new_row():
    from dq_flower.dq.client.sent import row_hashes

    y = Y[:3].copy()
    first = row_hashes(X[:3], y)
    y[1] = (y[1] + 1) % 10
    assert (row_hashes(X[:3], y) != first).tolist() == [False, True, False]


def _window(partition: int, server_round: int) -> tuple[np.ndarray, np.ndarray]:
    """A node's last ``WINDOW`` readings: ``SLIDE`` new ones a round, the oldest gone."""
    mine = np.arange(partition, 800, 2)
    start = SLIDE * (server_round - 1)
    return X[mine[start:start + WINDOW]], Y[mine[start:start + WINDOW]]


def test_a_rolling_window_has_every_row_it_ever_held_stored_once():
    def train(msg, context):
        part = int(context.node_config["partition-id"])
        rnd = int(msg.content["config"]["server-round"])
        return dq_flower.client.dq_train(msg, context, _window(part, rnd))

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    strategy = dq_flower.DQStrategy(model, seed=0, num_classes=10)  # the adaptive schedule
    result = strategy.start(grid=InProcessGrid(train, 2),
                            initial_arrays=ArrayRecord(model.state_dict()), num_rounds=ROUNDS)
    stored = [result.evaluate_metrics_serverapp[r]["stored"] for r in range(1, ROUNDS + 1)]
    # by position: the first window's 120 rows, then "every node has uploaded all" for good
    assert stored[0] == 2 * WINDOW and stored[-1] >= 2 * WINDOW + 3 * SLIDE, stored
    assert sum(result.evaluate_metrics_serverapp[r]["rejected"] for r in range(1, ROUNDS + 1)) == 0


def test_an_honest_reply_after_the_data_shrank_is_taken():
    def train(msg, context):
        part = int(context.node_config["partition-id"])
        rnd = int(msg.content["config"]["server-round"])
        x, y = X[part:400:2], Y[part:400:2]
        return dq_flower.client.dq_train(msg, context, (x, y) if rnd == 1 else (x[:50], y[:50]))

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    strategy = dq_flower.DQStrategy(model, seed=0, num_classes=10, max_server_steps=100)
    result = strategy.start(grid=InProcessGrid(train, 2),
                            initial_arrays=ArrayRecord(model.state_dict()), num_rounds=5)
    metrics = [result.evaluate_metrics_serverapp[r] for r in range(1, 6)]
    assert [m["rejected"] for m in metrics] == [0] * 5  # the probe's reply of round 4 taken
    assert metrics[-1]["stored"] == 400


def test_rows_of_another_type_are_named_afresh():
    """Targets typed as the model reads them (float64 class indices as int64, the same bytes
    wide) or one input of several: positions again, not new names past the old."""
    context = _context()
    _names(context, X[:20], Y[:20].astype(np.float64))
    names, named = _names(context, X[:20], Y[:20].astype(np.int64))
    assert names.tolist() == list(range(20)) and named == 20
