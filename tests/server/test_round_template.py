"""Every strategy of the package is driven through one template and one protocol.

``aggregate_train`` is :class:`ServerFigures`'s template around ``aggregate_round``, itself
:class:`RoundPipeline`'s template (ledger, screen and decode, bound, aggregate and step)
whose hooks each strategy overrides: no method is replaced for the length of ``start``; under
``start`` the server's figures move to the ServerApp-side metrics, called directly the
hook's metrics come back whole. The harness drives Flower's own strategies through the
same protocol (:class:`FlowerStrategy`).
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import ArrayRecord, MetricRecord
from flwr.serverapp.strategy import FedAvg
from torch import nn

import dq_flower
from dq_flower.harness.inprocess import InProcessGrid
from dq_flower.harness.server_app import FlowerStrategy
from dq_flower.server.pipeline import RoundPipeline


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def _data(k: int):
    rng = np.random.default_rng(k)
    x = rng.normal(0, 1, (60, 4)).astype(np.float32)
    return x, (x[:, 0] > 0).astype(np.int64)


def _client(msg, context):
    return dq_flower.client.dq_train(msg, context, _data(context.node_config["partition-id"]))


def test_start_replaces_no_method_and_splits_the_figures():
    model = _model()
    strategy = dq_flower.DQStrategy(model, budget=20, server_steps=5,
                                    upload_schedule="fixed")
    seen = []

    def evaluate_fn(server_round, arrays):
        seen.append(("aggregate_train" in vars(strategy), strategy._figures_apart))
        return MetricRecord({"central": 1.0})

    result = strategy.start(grid=InProcessGrid(_client, 2),
                            initial_arrays=ArrayRecord(model.state_dict()), num_rounds=2,
                            evaluate_fn=evaluate_fn)
    assert seen and all(not replaced and apart for replaced, apart in seen)
    assert strategy.num_rounds == 2 and not strategy._figures_apart
    assert result.evaluate_metrics_serverapp[2]["stored"] == 2 * 2 * 20
    assert result.evaluate_metrics_serverapp[2]["central"] == 1.0
    # called directly (as the harness does), the hook's metrics come back whole
    assert "stored" in strategy.aggregate_train(3, [])[1]


def test_every_package_strategy_overrides_hooks_not_the_template():
    for name in ("DQStrategy", "GradientStrategy", "CompressedUpdates"):
        cls = getattr(dq_flower, name)
        assert issubclass(cls, RoundPipeline), name
        own = set(vars(cls))
        assert not own & {"aggregate_train", "aggregate_round"}, f"{name} replaces the template"
        assert {"decode_reply", "bound", "aggregate_and_step"} <= own, name


def test_flowers_own_strategy_is_driven_through_the_adapter():
    inner = FedAvg()
    wrapped = FlowerStrategy(inner)
    assert not wrapped.finished and not wrapped.watches_failures
    assert wrapped.state_dict() == {} and wrapped.round_figures(1) == {}
    wrapped.load_state_dict({})
    calls = []
    inner.aggregate_train = lambda rnd, replies: calls.append(rnd) or (None, None)
    assert wrapped.aggregate_train(4, []) == (None, None) and calls == [4]
