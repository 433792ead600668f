"""A site that joins empty: its first replies hold no row, its later ones hold its rows.

A node that answered with no row was counted as having sent every row, and once the others
had sent theirs the schedule stopped ("every node has uploaded all its samples"); its
probes for grown data went to one node at a time at widening gaps, and in a 30-round run
never came back to it (a site holding the only 8s and 9s: 75.3% where 92.2% with it from
the start). A client that held no row is asked as one never heard from.
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import ArrayRecord, MetricRecord
from sklearn.datasets import load_digits
from torch import nn

import dq_flower
from dq_flower.harness.inprocess import InProcessGrid

X, Y = load_digits(return_X_y=True)
X = (X / 16).astype(np.float32)
X_TRAIN, Y_TRAIN, X_TEST, Y_TEST = X[:1400], Y[:1400], X[1400:], Y[1400:]
JOIN = 3  # the late site's first round with rows


def _rows(partition: int, server_round: int) -> tuple[np.ndarray, np.ndarray]:
    late = Y_TRAIN >= 8  # the late site holds every 8 and 9, the others the rest
    mine = np.flatnonzero(late if partition == 4 else ~late)
    if partition != 4:
        mine = mine[partition::4]
    elif server_round < JOIN:
        mine = mine[:0]
    return X_TRAIN[mine], Y_TRAIN[mine]


def _accuracy(server_round: int, arrays: ArrayRecord) -> MetricRecord:
    model = _net()
    model.load_state_dict(arrays.to_torch_state_dict())
    with torch.no_grad():
        pred = model(torch.from_numpy(X_TEST)).argmax(1).numpy()
    return MetricRecord({"accuracy": float((pred == Y_TEST).mean())})


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))


def test_a_site_that_joins_empty_is_asked_for_its_rows_once_it_holds_them():
    def train(msg, context):
        part = int(context.node_config["partition-id"])
        rnd = int(msg.content["config"]["server-round"])
        return dq_flower.client.dq_train(msg, context, _rows(part, rnd))

    model = _net()
    result = dq_flower.DQStrategy(model, seed=0, num_classes=10).start(
        grid=InProcessGrid(train, 5), initial_arrays=ArrayRecord(model.state_dict()),
        num_rounds=6, evaluate_fn=_accuracy)
    final = result.evaluate_metrics_serverapp[6]
    late_rows = int((Y_TRAIN >= 8).sum())
    assert final["stored"] >= late_rows  # its rows were asked for (none stored before)
    assert final["accuracy"] > 0.85  # 8s and 9s learned (at most 0.8 without them)
