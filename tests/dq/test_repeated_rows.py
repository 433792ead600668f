"""A node's exact repeats of a row are not offered (DQ only).

A node whose 400 rows were each repeated ten times sent the copies round after round, and
the server dropped them on arrival as copies: 62,463 uplink bytes where the copies unsent
take 35,469 (a scratch app, in-process; upload-all 31,062 -> 24,846 B).
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import ArrayRecord
from sklearn.datasets import load_digits
from torch import nn

import dq_flower
from dq_flower.dq.client.sent import repeated_rows
from dq_flower.harness.inprocess import InProcessGrid

X, Y = load_digits(return_X_y=True)
X = (X / 16).astype(np.float32)


def test_repeats_are_the_copies_after_the_first():
    x = np.array([[1, 2], [3, 4], [1, 2], [1, 2], [1, 2]], np.float32)
    y = np.array([0, 1, 0, 0, 1])
    assert repeated_rows(x, y).tolist() == [False, False, True, True, False]


def test_a_node_of_repeated_rows_sends_each_once_and_counts_it_once():
    def rows(part):
        if part == 0:
            return np.tile(X[:40], (5, 1)), np.tile(Y[:40], 5)
        return X[40 + 40 * part:80 + 40 * part], Y[40 + 40 * part:80 + 40 * part]

    def train(msg, context):
        return dq_flower.client.dq_train(msg, context, rows(int(
            context.node_config["partition-id"])))

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    strategy = dq_flower.DQStrategy(model, seed=0, upload_schedule="all")
    strategy.start(grid=InProcessGrid(train, 3), num_rounds=3,
                   initial_arrays=ArrayRecord(model.state_dict()))
    assert strategy.data.sent[0] == [40, 40]  # 200 rows held, 40 of them distinct: sent once
    assert strategy.data.stored == 120
