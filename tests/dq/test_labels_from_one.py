"""Class labels counted from 1 (HAPT's activities 1 to 6 for 6 outputs).

The user's own training reads ``cross_entropy(out, y - 1)``; DQ's server refused every reply
of every round ("label 10 is out of range (10 classes)") and the run ended at its start. A
round whose labels run from 1 up to the model's outputs now reads them as counted from 1,
says so once, and asks the nodes for ``y - 1`` (:func:`dq_flower.wire.targets.label_base`);
the nodes' federated evaluation reads them so too. DQ only: the gradient baselines type each
node's labels alone.
"""

from __future__ import annotations

import logging
import types

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
from sklearn.datasets import load_digits
from torch import nn

from dq_flower.client import evaluate
from dq_flower.harness.inprocess import InProcessGrid
from dq_flower.wire.targets import LABEL_BASE_KEY, label_base, model_targets
from tests.apps.runner import run_app


def test_labels_from_one_up_to_the_outputs_are_told_apart():
    assert label_base([np.arange(1, 7), np.array([2, 3])], 6) == 1
    assert label_base([np.arange(1.0, 7.0)], 6) == 1  # a CSV's labels read as floats
    assert label_base([np.arange(0, 6)], 6) == 0  # counted from 0
    assert label_base([np.arange(1, 6)], 6) == 0  # the top label unseen: no evidence
    assert label_base([np.arange(0, 7)], 6) == 0  # seven labels for six outputs: refused later
    assert label_base([np.arange(1, 7)], 1) == 0  # one output: a regression of counts
    assert label_base([np.array([1.5, 6.0])], 6) == 0


def test_a_node_takes_the_base_from_its_labels_or_says_why_it_cannot():
    typed = model_targets(np.array([1, 6, 3]), 6, 1)
    assert typed.dtype == np.int64 and typed.tolist() == [0, 5, 2]
    assert model_targets(np.array([1.0, 6.0]), 6, 1).tolist() == [0, 5]
    with pytest.raises(ValueError, match="counted from 1 .* holds 0"):
        model_targets(np.array([0, 6]), 6, 1)


def _one_based_digits() -> types.ModuleType:
    d = load_digits()
    order = np.random.default_rng(0).permutation(len(d.target))
    x = (d.data[order] / 16).astype(np.float32)
    y = d.target[order].astype(np.int64) + 1
    app = types.ModuleType("onebased")
    app.NAME, app.NUM_NODES, app.ROUNDS = "onebased", 4, 3

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.body = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))

        def forward(self, t):
            return self.body(t)

    def score(model, xs, ys):
        with torch.no_grad():
            return float(((model(torch.as_tensor(xs)).argmax(1).numpy() + 1) == ys).mean())

    app.Net, app.score, app.local_train = Net, score, None
    app.load_local_data = lambda pid: (x[pid:1400:4], y[pid:1400:4])
    app.test_set = lambda: (x[1400:], y[1400:])
    return app


def test_dq_trains_on_labels_counted_from_one_and_says_so_once(caplog):
    caplog.set_level(logging.WARNING)
    run = run_app(_one_based_digits(), "dq")
    said = [r.getMessage() for r in caplog.records if "counted from 1" in r.getMessage()]
    assert len(said) == 1 and "labels run from 1 to 10" in said[0], said
    # measured: 0.977 after round 1; before, every reply refused and 0.025 (the start)
    assert run.scores[1] > 0.9 and run.final > 0.9, run.scores


def test_the_nodes_evaluation_reads_labels_counted_from_one():
    InProcessGrid(lambda m, c: m, 1)  # acts as the server: messages can be built here
    model = nn.Linear(3, 3, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.eye(3) * 5)
    rows = (np.eye(3, dtype=np.float32)[[0, 1, 2, 1]], np.array([1, 2, 3, 2]))
    content = RecordDict({"arrays": ArrayRecord(model.state_dict()),
                          "config": ConfigRecord({"server-round": 1, LABEL_BASE_KEY: 1})})
    msg = Message(content, dst_node_id=5, message_type=MessageType.EVALUATE)
    msg.metadata.__dict__["_message_id"] = "e1"
    ctx = Context(run_id=1, node_id=5, node_config={}, state=RecordDict(), run_config={})
    reply = evaluate(msg, ctx, rows, model=model)
    assert reply.content["metrics"]["eval-acc"] == 1.0


def test_the_strategy_tells_the_evaluating_nodes():
    from dq_flower import DQStrategy

    strategy = DQStrategy(nn.Linear(4, 3))
    assert strategy.evaluate_config() == {}
    strategy.data.ask_model_targets(3, 1)
    assert strategy.evaluate_config() == {LABEL_BASE_KEY: 1}
