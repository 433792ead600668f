"""Models as users write them: ``model.double()``, a forward that returns a tuple or a dict.

Each had every DQ reply refused by the server's model check, every round (float32 samples
into float64 weights: "mat1 and mat2 must have the same dtype"; a tuple or a dict: "the
model returned tuple"), so DQ stayed where it started.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, MetricRecord
from torch import nn

import dq_flower
from dq_flower.harness.inprocess import InProcessGrid
from dq_flower.model_ops import float_dtype, model_input, model_output


class Double(nn.Module):
    """An MLP in float64, as a user gets it after ``model.double()`` for numpy's float64."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10)).double()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class WithFeatures(nn.Module):
    """Returns ``(logits, features)``; the user's loss reads the first."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.features = nn.Sequential(nn.Linear(64, 32), nn.ReLU())
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = self.features(x)
        return self.head(z), z


class WithDict(WithFeatures):
    """Returns ``{"logits": ..., "embedding": ...}``; the user's loss reads ``logits``."""

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:  # type: ignore[override]
        logits, z = super().forward(x)
        return {"embedding": z, "logits": logits}


def test_samples_reach_the_model_in_its_own_float_dtype():
    assert float_dtype(Double()) == torch.float64 and float_dtype(nn.Linear(2, 2)) == torch.float32
    rows = np.zeros((2, 64), dtype=np.float32)
    assert model_input(rows, torch.device("cpu"), False, torch.float64).dtype == torch.float64
    ids = np.zeros((2, 5), dtype=np.int64)  # ids stay int64 whatever the model's dtype
    assert model_input(ids, torch.device("cpu"), False, torch.float64).dtype == torch.int64


def test_a_tuple_output_is_read_by_its_first_tensor_a_dict_by_its_logits():
    logits, features = torch.ones(2, 3), torch.zeros(2, 5)
    assert model_output((logits, features)) is logits
    assert model_output({"embedding": features, "logits": logits}) is logits
    assert model_output({"out": logits, "aux": features}) is logits  # torchvision's segmenters
    assert model_output({"scores": logits, "note": "a string"}) is logits  # its only tensor
    with pytest.raises(TypeError, match=r"a dict with keys \['features', 'scores'\]"):
        model_output({"scores": logits, "features": features})


@pytest.mark.parametrize("net", [Double, WithFeatures, WithDict])
def test_dq_trains_such_a_model_at_its_defaults(net):
    pytest.importorskip("sklearn")
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = (x / 16).astype(np.float32)
    xt, yt = torch.from_numpy(x[1200:]).to(float_dtype(net())), y[1200:]

    def train(msg, context):
        node = int(context.node_config["partition-id"])
        return dq_flower.client.dq_train(msg, context, (x[:1200][node::4], y[:1200][node::4]))

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        model = net()
        model.load_state_dict(arrays.to_torch_state_dict())
        with torch.no_grad():
            hits = model_output(model(xt)).argmax(1).numpy() == yt
        return MetricRecord({"accuracy": float(hits.mean())})

    model = net()
    result = dq_flower.DQStrategy(model, seed=0).start(
        grid=InProcessGrid(train, 4), num_rounds=2, evaluate_fn=evaluate,
        initial_arrays=ArrayRecord(model.state_dict()))
    rounds = [result.evaluate_metrics_serverapp[r] for r in (1, 2)]
    assert [m["rejected"] for m in rounds] == [0, 0]  # were every reply, every round
    assert rounds[-1]["accuracy"] > 0.85


class DictOut(nn.Module):
    """Returns a dict of two unnamed tensors, which no loss reads: the model is at fault."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> dict:
        return {"scores": self.body(x), "features": x}


def test_every_node_refused_the_same_way_names_the_model_once_a_round(caplog):
    rng = np.random.default_rng(0)
    x, y = rng.random((200, 64), dtype=np.float32), rng.integers(0, 10, 200)

    def train(msg, context):
        node = int(context.node_config["partition-id"])
        return dq_flower.client.dq_train(msg, context, (x[node::4], y[node::4]))

    model = DictOut()
    with caplog.at_level(logging.INFO, logger="flwr"):
        dq_flower.DQStrategy(model, seed=0).start(
            grid=InProcessGrid(train, 4), num_rounds=2,
            initial_arrays=ArrayRecord(model.state_dict()))
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    blamed = "the model (or loss_fn) the strategy was given"
    assert len(errors) == 2 and all(blamed in e for e in errors)
    assert "the model returned a dict with keys" in errors[0]


def test_a_gradient_baseline_steps_a_float64_model():
    """The server's step assigned float32 gradients to float64 weights and the run crashed."""
    pytest.importorskip("sklearn")
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = (x / 16).astype(np.float64)

    def train(msg, context):
        node = int(context.node_config["partition-id"])
        return dq_flower.client.gradient_train(msg, context, (x[:1200][node::4],
                                                              y[:1200][node::4]), model=Double())

    model = Double()
    result = dq_flower.GradientStrategy(model, codec="qsgd", lr=0.1, seed=0).start(
        grid=InProcessGrid(train, 4), num_rounds=15, initial_arrays=ArrayRecord(model.state_dict()))
    trained = Double()
    trained.load_state_dict(result.arrays.to_torch_state_dict())
    assert all(v.dtype == torch.float64 for v in trained.state_dict().values())
    with torch.no_grad():
        hits = trained(torch.from_numpy(x[1200:])).argmax(1).numpy() == y[1200:]
    assert hits.mean() > 0.4  # chance: 0.1
