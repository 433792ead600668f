"""Nodes whose asks bring nothing rest a doubling wait; an empty site that fills is asked.

A node that holds no row was asked every round, forever, as one never heard from (4 nodes,
one empty: from round 4 on each round sampled it alone for an empty reply), and a node
whose replies are refused (another feature count) re-sent its batch every round. Both now
rest 2, 4, 8, ... rounds after two fruitless asks, as a failing node does. Under
``upload-schedule = "all"`` a site that joined empty was never asked again (576 of 1,437
rows stored): a count that grows from none is data that grew.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import torch
from flwr.app import ArrayRecord
from sklearn.datasets import load_digits
from torch import nn

import dq_flower
from dq_flower.harness.inprocess import InProcessGrid

X, Y = load_digits(return_X_y=True)
X = (X / 16).astype(np.float32)
NODES = 4


def _run(rows, rounds, **knobs):
    """The strategy, its last round's metrics and the rounds each partition was asked."""
    asked: Counter = Counter()

    def train(msg, context):
        part = int(context.node_config["partition-id"])
        rnd = int(msg.content["config"]["server-round"])
        asked[part] += 1
        return dq_flower.client.dq_train(msg, context, rows(part, rnd))

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    strategy = dq_flower.DQStrategy(model, seed=0, num_classes=10, **knobs)
    result = strategy.start(grid=InProcessGrid(train, NODES), num_rounds=rounds,
                            initial_arrays=ArrayRecord(model.state_dict()))
    return strategy, result.evaluate_metrics_serverapp[rounds], asked


def _share(part: int) -> tuple[np.ndarray, np.ndarray]:
    return X[part:1400:NODES - 1], Y[part:1400:NODES - 1]


def test_a_node_holding_no_row_rests_between_asks():
    def rows(part, rnd):
        return _share(part) if part < 3 else (X[:0], Y[:0])

    _, metrics, asked = _run(rows, 10)
    assert metrics["stored"] > 0 and asked[3] <= 6, asked  # was asked in each of 10 rounds


def test_a_node_refused_every_round_rests_between_asks():
    def rows(part, rnd):
        x, y = _share(part) if part < 3 else (X[1400:1500, :32], Y[1400:1500])
        return x, y

    _, metrics, asked = _run(rows, 8, upload_schedule="fixed", budget=100)
    assert asked[3] <= 3 and asked[0] == 5, asked  # was asked, and refused, in all 8 rounds


def test_upload_all_asks_a_site_that_joined_empty_once_it_holds_rows():
    def rows(part, rnd):  # three late sites hold 100 rows each from round 3
        if part > 0:
            late = slice(1400 + 100 * part, 1500 + 100 * part)
            return (X[late], Y[late]) if rnd >= 3 else (X[:0], Y[:0])
        return X[:1400], Y[:1400]

    strategy, _, _ = _run(rows, 5, upload_schedule="all")
    sent = [strategy.data.sent[k][1] for k in (1, 2, 3)]
    assert min(sent) >= 95, sent  # was a probe's one site at a time, at doubling gaps
    # (a few rows of 100 may copy others at 2 bits: the copy screen keeps them out)


def test_the_round_line_says_what_upload_all_asks_and_no_gain_without_held_out_rows():
    from dq_flower.dq.server.round_metrics import schedule_text

    metrics = {"server-steps": 0, "next-ask": 0, "schedule-done": 0, "holdout-rows": 0,
               "upload-gain": 0.0, "upload-gain-stderr": 0.0}
    # was "..., gain +0.0000; next ask 0 samples" while every row left was asked for
    assert schedule_text(metrics, all_rows=True) == ", 0 server steps; next ask: every row left"
    assert schedule_text({**metrics, "holdout-rows": 40, "next-ask": 12}) == (
        ", 0 server steps, gain +0.0000; next ask 12 samples")
