"""Targets typed otherwise than the model reads them.

Class labels read as floats (``np.loadtxt`` reads a CSV's label column as 0., 1., 2.) for a
model with an output per class (the user's loss takes ``y.long()``), and integer targets
(counts, 0/1 labels as pandas gives them) for a model with one output (the user's loss
takes ``y.float()``): DQ's nodes sent them as they were typed, which the server's model
check refused, every reply of every round. Now the first such refusal asks every node to
type them for the model's outputs from the next round on (DQ), and the gradient
baselines' devices and federated evaluation retype them where their model is at hand.
Since, the first round's replies are retyped on the server as well (exactly: small whole
numbers), so their rows are stored, not asked again (a CSV's integer regression targets:
13,730 uplink bytes, now 8,574).
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from torch import nn

import dq_flower
from dq_flower.dq.server.federation import FederationData
from dq_flower.harness.inprocess import InProcessGrid
from dq_flower.wire.targets import model_targets
from tests.apps.cancer_binary import Net as OneLogit  # 30 -> 16 -> 1 logit


def test_targets_are_retyped_only_for_the_models_outputs():
    y = np.array([0.0, 1.0, 2.0, 1.0], dtype=np.float32)
    assert model_targets(y, 3).dtype == np.int64
    assert model_targets(y[:, None], 3).tolist() == [0, 1, 2, 1]  # (n, 1) too
    for outputs in (0, 1, 2):  # unknown, one output (a regression), too few classes
        assert model_targets(y, outputs) is y
    fractions = np.array([0.0, 0.5], dtype=np.float32)
    negative = np.array([-1.0, 1.0], dtype=np.float32)
    wide = np.zeros((4, 2), dtype=np.float32)  # two float targets a sample
    ints = np.array([0, 1])
    for other in (fractions, negative, wide, ints):
        assert model_targets(other, 5) is other
    counts = np.array([3, 0, 17])
    assert model_targets(counts, 1).dtype == np.float32 and model_targets(counts, 1)[2] == 17
    assert model_targets(counts, 0) is counts and model_targets(counts, 20) is counts
    assert model_targets(np.zeros((3, 2), dtype=np.int64), 1).shape == (3, 2)  # not (n,)


def test_the_ask_survives_a_checkpoint():
    data = FederationData()
    data.ask_model_targets(3)
    again = FederationData()
    again.load_state(data.state(), lambda spec: None)
    assert again.model_outputs == 3 and FederationData().model_outputs == 0


class TwoClass(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(30, 16), nn.ReLU(), nn.Linear(16, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def _csv_table() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Standardized breast-cancer rows and their labels, every column float as a CSV gives."""
    pytest.importorskip("sklearn")
    from sklearn.datasets import load_breast_cancer

    x, y = load_breast_cancer(return_X_y=True)
    x = ((x - x.mean(0)) / x.std(0)).astype(np.float32)
    y = y.astype(np.float32)
    return x[:450], y[:450], x[450:], y[450:].astype(np.int64)


def _accuracy(arrays: ArrayRecord, x: np.ndarray, y: np.ndarray) -> float:
    model = TwoClass()
    model.load_state_dict(arrays.to_torch_state_dict())
    with torch.no_grad():
        return float((model(torch.from_numpy(x)).argmax(1).numpy() == y).mean())


def test_dq_types_float_labels_as_classes_from_the_first_round(caplog):
    x, y, xt, yt = _csv_table()

    def train(msg, context):
        node = int(context.node_config["partition-id"])
        return dq_flower.client.dq_train(msg, context, (x[node::4], y[node::4]))

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        return MetricRecord({"accuracy": _accuracy(arrays, xt, yt)})

    model = TwoClass()
    strategy = dq_flower.DQStrategy(model, seed=0)
    with caplog.at_level(logging.INFO, logger="flwr"):
        result = strategy.start(grid=InProcessGrid(train, 4), num_rounds=3,
                                evaluate_fn=evaluate,
                                initial_arrays=ArrayRecord(model.state_dict()))
    assert not [r for r in caplog.records if r.levelno == logging.ERROR]  # not the model's
    rounds = [result.evaluate_metrics_serverapp[r] for r in (1, 2, 3)]
    # float targets typed as class labels on the server, then on the nodes (they were
    # refused in round 1, 0 rows stored)
    assert [r["rejected"] for r in rounds] == [0, 0, 0] and rounds[0]["stored"] > 0
    assert strategy.data.spec.target == "class" and strategy.data.model_outputs == 2
    assert rounds[-1]["accuracy"] > 0.9  # was 0.563 (where it started), every round


def test_one_node_with_float_labels_beside_integer_ones_joins_from_round_1():
    x, y, xt, yt = _csv_table()

    def train(msg, context):
        node = int(context.node_config["partition-id"])
        labels = y[node::4] if node == 0 else y[node::4].astype(np.int64)  # node 0: np.loadtxt
        return dq_flower.client.dq_train(msg, context, (x[node::4], labels))

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        return MetricRecord({"accuracy": _accuracy(arrays, xt, yt)})

    model = TwoClass()
    strategy = dq_flower.DQStrategy(model, seed=0)
    result = strategy.start(grid=InProcessGrid(train, 4), num_rounds=3, evaluate_fn=evaluate,
                            initial_arrays=ArrayRecord(model.state_dict()))
    rounds = [result.evaluate_metrics_serverapp[r] for r in (1, 2, 3)]
    # its labels typed as classes on the server, then asked so (refused in round 1 by the
    # spec the others agreed on; before that, every round, its rows never stored)
    assert [r["rejected"] for r in rounds] == [0, 0, 0]
    assert strategy.data.model_outputs == 2 and strategy.data.spec.target == "class"
    assert len(strategy.data.ranges) == 4  # every node's rows stored (per-feature ranges)
    assert rounds[-1]["accuracy"] > 0.9


def test_a_spec_that_differs_only_by_retypable_targets_asks_for_them():
    from dq_flower.wire.dq_batch import DataSpec
    from dq_flower.wire.targets import retypes_to

    assert retypes_to("binary", "class", 2) and retypes_to("float", "class", 3)
    assert retypes_to("class", "float", 1) and retypes_to("class", "binary", 1)
    assert not retypes_to("class", "float", 2) and not retypes_to("float", "class", 1)
    assert not retypes_to("tokens", "class", 2) and not retypes_to("binary", "class", 0)
    data = FederationData()
    data.spec = DataSpec((30,), "class")
    data.retype_if(DataSpec((29,), "binary"), 2)  # another shape: no ask
    data.retype_if(DataSpec((30,), "binary", target_dim=1), 1)  # one output: no class labels
    assert data.model_outputs == 0
    data.retype_if(DataSpec((30,), "binary"), 2)
    assert data.model_outputs == 2


def test_a_gradient_baseline_reads_float_labels_as_classes():
    x, y, xt, yt = _csv_table()

    def train(msg, context):
        node = int(context.node_config["partition-id"])
        return dq_flower.client.gradient_train(msg, context, (x[node::4], y[node::4]),
                                               model=TwoClass())

    model = TwoClass()
    result = dq_flower.GradientStrategy(model, codec="qsgd", lr=0.1, seed=0).start(
        grid=InProcessGrid(train, 4), num_rounds=10,
        initial_arrays=ArrayRecord(model.state_dict()))
    assert _accuracy(result.arrays, xt, yt) > 0.9


def test_federated_evaluation_scores_float_labels_as_classes():
    x, y, _, _ = _csv_table()
    InProcessGrid(lambda m, c: m, 1)  # acts as the server: messages can be built here
    model = TwoClass()
    content = RecordDict({"arrays": ArrayRecord(model.state_dict()),
                          "config": ConfigRecord({"server-round": 1})})
    msg = Message(content, dst_node_id=5, message_type=MessageType.EVALUATE)
    msg.metadata.__dict__["_message_id"] = "e1"
    ctx = Context(run_id=1, node_id=5, node_config={}, state=RecordDict(), run_config={})
    as_floats = dq_flower.client.evaluate(msg, ctx, (x, y), model=model)
    as_labels = dq_flower.client.evaluate(msg, ctx, (x, y.astype(np.int64)), model=model)
    assert dict(as_floats.content["metrics"]) == dict(as_labels.content["metrics"])
    assert "eval-acc" in as_floats.content["metrics"]


def test_dq_types_integer_labels_of_a_one_logit_model_as_floats_from_round_1():
    x, y, xt, yt = _csv_table()
    labels = y.astype(np.int64)  # 0/1 as pandas gives them; the user's BCE takes y.float()

    def train(msg, context):
        node = int(context.node_config["partition-id"])
        return dq_flower.client.dq_train(msg, context, (x[node::4], labels[node::4]))

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        model = OneLogit()
        model.load_state_dict(arrays.to_torch_state_dict())
        with torch.no_grad():
            hits = (model(torch.from_numpy(xt)) > 0).numpy() == yt.astype(bool)
        return MetricRecord({"accuracy": float(hits.mean())})

    model = OneLogit()
    strategy = dq_flower.DQStrategy(model, seed=0)
    result = strategy.start(grid=InProcessGrid(train, 4), num_rounds=3, evaluate_fn=evaluate,
                            initial_arrays=ArrayRecord(model.state_dict()))
    rounds = [result.evaluate_metrics_serverapp[r] for r in (1, 2, 3)]
    assert rounds[0]["rejected"] == 0 and rounds[0]["stored"] > 0  # were refused, 4 of 4
    assert strategy.data.spec.target == "binary" and strategy.data.model_outputs == 1
    assert rounds[-1]["accuracy"] > 0.9
