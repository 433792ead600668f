"""A model's statistics (BatchNorm's running means and variances) that one node sends.

One node of five, on scikit-learn's digits with a BatchNorm MLP, replies with statistics of
1e30 (finite, non-negative), NaN or a negative variance. Before, GradientStrategy kept the
replies' example-weighted mean (1e30: 9.4% against 89.9%) and ``CompressedUpdates`` passed
them to the inner strategy untouched (NaN dropped every round). Now a reply whose statistics
are not finite or hold a negative variance is rejected, and every element of the others is
bounded by what the majority and the broadcast held (:mod:`dq_flower.server.majority`).
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import FedAvg
from sklearn.datasets import load_digits
from torch import nn

import dq_flower
from dq_flower.harness.inprocess import InProcessGrid
from dq_flower.server.majority import robust_buffers, winsorize
from dq_flower.wire.model_buffers import BUFFERS_KEY, buffers_record
from tests.faults.digits_attack import wire

X, Y = load_digits(return_X_y=True)
X = (X / 16).astype(np.float32)
X_TEST, Y_TEST = X[1500:], Y[1500:]
NODES = 5


class BNNet(nn.Module):
    """A digits MLP with a BatchNorm layer (its running mean and variance travel)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(64, 64), nn.BatchNorm1d(64), nn.ReLU(),
                                  nn.Linear(64, 10))

    def forward(self, x):
        return self.body(x)


def _accuracy(state: dict) -> float:
    model = BNNet()
    model.load_state_dict(state)
    model.eval()
    with torch.no_grad():
        pred = model(torch.from_numpy(X_TEST)).argmax(1).numpy()
    return float((pred == Y_TEST).mean())


def _poison(stats: dict[str, np.ndarray], attack: str) -> dict[str, np.ndarray]:
    """``stats`` as the hostile node sends them."""
    if attack == "huge":
        return {k: np.full_like(v, 1e30) for k, v in stats.items()}
    if attack == "nan":
        return {k: np.full_like(v, np.nan) for k, v in stats.items()}
    return {k: (-np.abs(v) - 1 if k.endswith("running_var") else v) for k, v in stats.items()}


@pytest.fixture(autouse=True)
def _quiet():
    logging.getLogger("flwr").setLevel(logging.ERROR)
    yield
    logging.getLogger("flwr").setLevel(logging.INFO)


# ------------------------------------------------------------------ GradientStrategy
def _gradient_client(attack: str | None):
    def app(msg: Message, context: Context) -> Message:
        k = int(context.node_config["partition-id"])
        local = (X[k:1500:NODES], Y[k:1500:NODES])
        content = wire(dq_flower.client.gradient_train(msg, context, local,
                                                       model=BNNet()).content)
        if attack is not None and k == 0:
            stats = {n: a.numpy() for n, a in content[BUFFERS_KEY].items()}
            content[BUFFERS_KEY] = buffers_record(_poison(stats, attack))
        return Message(content, reply_to=msg)

    return app


def _gradient_run(attack: str | None, rounds: int = 30) -> tuple[float, list[dict]]:
    torch.manual_seed(0)
    model = BNNet()
    strategy = dq_flower.GradientStrategy(model, "identity", lr=0.5, seed=0, batch_size=64,
                                          momentum=0.0)
    result = strategy.start(grid=InProcessGrid(_gradient_client(attack), NODES),
                            initial_arrays=ArrayRecord(model.state_dict()), num_rounds=rounds)
    metrics = [dict(result.evaluate_metrics_serverapp[r]) for r in range(1, rounds + 1)]
    return _accuracy(result.arrays.to_torch_state_dict()), metrics


@pytest.mark.parametrize("attack", ["huge", "negative"])
def test_gradient_strategy_statistics_are_bounded_by_the_majority(attack):
    control, _ = _gradient_run(None)
    attacked, metrics = _gradient_run(attack)
    assert attacked >= control - 0.05, (attacked, control)
    if attack != "huge":  # refused with a reason, the round goes on with the others
        assert all(m["rejected"] == 1 and m["stepped"] == 1 for m in metrics)


# ------------------------------------------------------------------ CompressedUpdates
def _central(server_round: int, arrays: ArrayRecord) -> MetricRecord:
    return MetricRecord({"accuracy": _accuracy(arrays.to_torch_state_dict())})


def _fedavg_client(attack: str | None) -> ClientApp:
    """Flower's quickstart loop (SGD, one epoch) on the node's rows, under the mod."""
    app = ClientApp(mods=[dq_flower.compression_mod])

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        k = int(context.node_config["partition-id"])
        x, y = torch.from_numpy(X[k:1500:NODES]), torch.from_numpy(Y[k:1500:NODES])
        torch.manual_seed(k)
        model = BNNet()
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        opt = torch.optim.SGD(model.parameters(), lr=float(msg.content["config"]["lr"]))
        model.train()
        for idx in torch.randperm(len(y)).split(32):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
        state = {n: v.numpy() for n, v in model.state_dict().items()}
        if attack is not None and k == 0:
            stats = {n: v for n, v in state.items() if n.endswith(("running_mean", "running_var"))}
            state.update(_poison(stats, attack))
        arrays = ArrayRecord({n: torch.from_numpy(np.asarray(v)) for n, v in state.items()})
        metrics = MetricRecord({"num-examples": len(y)})
        return Message(RecordDict({"arrays": arrays, "metrics": metrics}), reply_to=msg)

    return app


def _fedavg_run(attack: str | None, rounds: int = 6) -> tuple[float, list[dict]]:
    torch.manual_seed(0)
    model = BNNet()
    strategy = dq_flower.CompressedUpdates(FedAvg(fraction_evaluate=0.0), codec="fp16")
    result = strategy.start(grid=InProcessGrid(_fedavg_client(attack), NODES),
                            initial_arrays=ArrayRecord(model.state_dict()), num_rounds=rounds,
                            train_config=ConfigRecord({"lr": 0.1}), evaluate_fn=_central)
    metrics = [dict(result.evaluate_metrics_serverapp[r]) for r in range(1, rounds + 1)]
    return metrics[-1]["accuracy"], metrics


@pytest.mark.parametrize("attack", ["huge", "nan", "negative"])
def test_compressed_updates_statistics_are_checked_and_bounded_by_the_majority(attack):
    control, _ = _fedavg_run(None)
    attacked, metrics = _fedavg_run(attack)
    assert attacked >= control - 0.05, (attacked, control)
    if attack != "huge":  # refused with a reason, every round goes on with the others
        assert all(m["rejected"] == 1 and m["replies"] == NODES - 1 for m in metrics)


def test_winsorize_bounds_each_element_by_the_middle_values_and_the_broadcast():
    values = [np.array([1.0, 5.0]), np.array([2.0, 6.0]), np.array([3.0, 7.0]),
              np.array([1e30, -1e30])]
    out = winsorize(values)  # four values: each clipped to the second lowest and highest
    assert [list(v) for v in out] == [[2, 5], [2, 6], [3, 6], [3, 5]]
    # two replies and the broadcast: the middle one of the three
    assert [list(v) for v in winsorize([np.array([1e30]), np.array([2.0])],
                                       np.array([1.0]))] == [[2.0], [2.0]]
    assert [list(v) for v in winsorize([np.array([1e30])])] == [[1e30]]  # nothing to bound
    means = robust_buffers([{"v": v} for v in values], [1, 1, 1, 1e9])
    assert np.all(np.abs(means["v"]) <= 7)
