"""A model with parameters the user froze (``requires_grad=False``: transfer learning).

The server's model check, DQ's server steps and the gradient baselines took the gradient
of every parameter, so a frozen backbone made every DQ reply "unable to train" (refused,
every round). Frozen parameters now get zero gradients, no optimizer group, and keep
their values.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, MetricRecord
from torch import nn

import dq_flower
from dq_flower.harness.inprocess import InProcessGrid
from dq_flower.model_ops import weighted_loss_grad
from dq_flower.server.common import decay_groups
from tests.apps.runner import docs_text


class FrozenBackbone(nn.Module):
    """A fixed feature layer (as if pretrained, frozen) and a trainable head."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.backbone = nn.Sequential(nn.Linear(64, 128), nn.ReLU())
        for p in self.backbone.parameters():
            p.requires_grad = False
        self.head = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))


def _digits() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    pytest.importorskip("sklearn")
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = (x / 16).astype(np.float32)
    return x[:1200], y[:1200], x[1200:], y[1200:]


def _accuracy(model: nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    with torch.no_grad():
        return float((model(torch.from_numpy(x)).argmax(1).numpy() == y).mean())


def test_a_frozen_parameter_gets_a_zero_gradient_and_no_optimizer_group():
    model = FrozenBackbone()
    x = np.random.default_rng(0).random((8, 64), dtype=np.float32)
    loss, grad = weighted_loss_grad(model, x, np.arange(8) % 10, np.full(8, 1 / 8))
    frozen = sum(p.numel() for p in model.backbone.parameters())
    assert np.isfinite(loss) and grad.size == frozen + 1290
    assert not grad[:frozen].any() and grad[frozen:].any()
    grouped = [p for g in decay_groups(model, 5e-4) for p in g["params"]]
    assert {id(p) for p in grouped} == {id(p) for p in model.head.parameters()}


def test_dq_trains_the_head_and_leaves_the_frozen_backbone_as_it_was():
    x, y, xt, yt = _digits()

    def train(msg, context):
        node = int(context.node_config["partition-id"])
        return dq_flower.client.dq_train(msg, context, (x[node::4], y[node::4]))

    model = FrozenBackbone()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        return MetricRecord({"accuracy": 0.0})  # DQ adds its round's counts to it

    strategy = dq_flower.DQStrategy(model, seed=0)
    result = strategy.start(grid=InProcessGrid(train, 4), num_rounds=2, evaluate_fn=evaluate,
                            initial_arrays=ArrayRecord(model.state_dict()))
    trained = FrozenBackbone()
    trained.load_state_dict(result.arrays.to_torch_state_dict())
    after = trained.state_dict()
    for name in ("backbone.0.weight", "backbone.0.bias"):
        assert torch.equal(after[name], before[name]), name
    assert not torch.equal(after["head.weight"], before["head.weight"])
    rounds = [result.evaluate_metrics_serverapp[r] for r in (1, 2)]
    assert [m["rejected"] for m in rounds] == [0, 0]  # were every reply, every round
    assert rounds[-1]["stored"] > 0
    assert _accuracy(trained, xt, yt) > 0.85  # every reply refused left it at 0.1


def test_a_gradient_baseline_leaves_the_frozen_backbone_as_it_was():
    x, y, xt, yt = _digits()

    def train(msg, context):
        node = int(context.node_config["partition-id"])
        return dq_flower.client.gradient_train(msg, context, (x[node::4], y[node::4]),
                                               model=FrozenBackbone())

    model = FrozenBackbone()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    strategy = dq_flower.GradientStrategy(model, codec="qsgd", lr=0.1, seed=0)
    result = strategy.start(grid=InProcessGrid(train, 4), num_rounds=20,
                            initial_arrays=ArrayRecord(model.state_dict()))
    trained = FrozenBackbone()
    trained.load_state_dict(result.arrays.to_torch_state_dict())
    assert torch.equal(trained.state_dict()["backbone.0.weight"], before["backbone.0.weight"])
    assert _accuracy(trained, xt, yt) > 0.5


def test_the_figures_the_user_app_page_quotes():
    pytest.importorskip("sklearn")
    from tests.apps.test_zoo import runs  # the zoo's runs, made once per session

    fedavg, dq = runs("digits_frozen")["fedavg"], runs("digits_frozen")["dq"]
    page = docs_text("experiments", "user-apps.md")
    quoted = (f"DQ ends at {dq.final:.2%} with {dq.up_bytes:,} B against FedAvg's "
              f"{fedavg.final:.2%} with {fedavg.up_bytes:,} B")
    assert quoted in page, quoted


def test_signsgds_sign_step_leaves_the_frozen_backbone_as_it_was_at_both_ends():
    x, y, xt, yt = _digits()

    def train(msg, context):
        node = int(context.node_config["partition-id"])
        return dq_flower.client.gradient_train(msg, context, (x[node::4], y[node::4]),
                                               model=FrozenBackbone())

    model = FrozenBackbone()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    # majority vote with the sign downlink: every node applies the same steps to its copy
    # (the model's CRC is checked), and a vote counts a frozen coordinate's zero as +1
    strategy = dq_flower.GradientStrategy(model, codec="sign", lr=0.005, seed=0,
                                          weight_decay=1e-3)
    result = strategy.start(grid=InProcessGrid(train, 4), num_rounds=15,
                            initial_arrays=ArrayRecord(model.state_dict()))
    trained = FrozenBackbone()
    trained.load_state_dict(result.arrays.to_torch_state_dict())
    assert torch.equal(trained.state_dict()["backbone.0.weight"], before["backbone.0.weight"])
    assert not torch.equal(trained.state_dict()["head.weight"], before["head.weight"])
    assert _accuracy(trained, xt, yt) > 0.3
