"""A large honest site's count is taken once it has sent rows to back it.

A count over 100 times the lower median node's is taken down (a claim of 2**31 rows), and
a site of 1,200 rows beside four of 9 was counted as 900: once 900 of its rows were in,
the schedule took it for exhausted and its last 300 rows were never asked for. A count up
to twice the rows the site has sent is now taken as it is.
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import ArrayRecord
from sklearn.datasets import load_digits
from torch import nn

import dq_flower
from dq_flower.harness.inprocess import InProcessGrid

X, Y = load_digits(return_X_y=True)
X = (X / 16).astype(np.float32)


def test_a_large_sites_rows_are_all_asked_for():
    def train(msg, context):
        part = int(context.node_config["partition-id"])
        rows = slice(0, 1200) if part == 0 else slice(1200 + 9 * part, 1209 + 9 * part)
        return dq_flower.client.dq_train(msg, context, (X[rows], Y[rows]))

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    strategy = dq_flower.DQStrategy(model, seed=0, num_classes=10, upload_schedule="fixed",
                                    budget=300, server_steps=5)
    result = strategy.start(grid=InProcessGrid(train, 5), num_rounds=6,
                            initial_arrays=ArrayRecord(model.state_dict()))
    assert strategy.data.sent[0] == [1200, 1200]  # was [900, 900]: exhausted by its count
    assert result.evaluate_metrics_serverapp[6]["stored"] == 1200 + 4 * 9


def test_a_large_sites_count_taken_down_by_a_moving_bound_is_no_growth():
    # the bound on a large site's count moves with the others' counts and the rows it has
    # sent; a site reporting 5,000 rows every round was taken for a growing stream each time
    # it moved, and every exhausted node was asked again each round (60 stores, one of 5,000)
    from dq_flower.dq.server.federation import FederationData
    from dq_flower.dq.server.validation import count_claim

    data = FederationData()
    for sent, medians in ((0, [13] * 9), (18, [13] * 4 + [14] * 6), (36, [15] * 12)):
        counted, why = count_claim(5000, [5000, *medians], sent)
        assert why is not None and counted < 5000
        data.record_sent(101, counted, 18, claimed=5000)
    assert data.grown == 0  # was 200: 1,300 -> 1,400 -> 1,500
    data.record_sent(101, 1500, 0, claimed=5060)  # the site's data did grow
    assert data.grown == 60
