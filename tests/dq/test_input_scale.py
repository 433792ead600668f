"""A raw table's columns standardised inside the server's training (DQ only).

A 20-class table with five columns in thousands and five in hundredths (10 nodes,
Dirichlet(0.3), an MLP; a scratch app): DQ 9.2% and FedAvg 7.0% (Adam on every row
centrally: 11%); house prices from raw columns: DQ 60,345 dollars mean absolute error,
FedAvg 500,416. The server now trains the model's first layer on standardised columns
and writes its weights back for raw ones: 91.8% and 23,719 dollars (a linear fit's noise
is about 24,000).
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, MetricRecord
from torch import nn

import dq_flower
import dq_flower.dq.server.input_scale as input_scale
from dq_flower.dq.server.input_scale import InputScale, first_linear
from dq_flower.harness.inprocess import InProcessGrid


def _table(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` rows of 8 classes: three columns in thousands and three in hundredths."""
    pytest.importorskip("sklearn")
    from sklearn.datasets import make_classification

    x, y = make_classification(n_samples=n, n_features=8, n_informative=6, n_redundant=0,
                               n_classes=8, n_clusters_per_class=1, class_sep=1.5,
                               random_state=seed)
    x[:, :3] = x[:, :3] * 800 + 2000
    x[:, 3:6] = x[:, 3:6] * 0.01
    return x.astype(np.float32), y.astype(np.int64)


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.f = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.f(x)


def test_only_raw_columns_of_other_scales_read_by_an_unfit_first_layer_are_standardised():
    x, _ = _table(400, 0)
    assert InputScale().decide(Mlp(), x)
    z = (x - x.mean(0)) / x.std(0)
    assert not InputScale().decide(Mlp(), z)  # standardised already
    lags = np.random.default_rng(0).normal(2000, 300, (400, 8)).astype(np.float32)
    assert not InputScale().decide(Mlp(), lags)  # one kind of column, however large
    normed = nn.Sequential(nn.BatchNorm1d(8), nn.Linear(8, 8))
    assert not InputScale().decide(normed, x)  # the model normalises first: no Linear on x
    assert first_linear(Mlp(), torch.from_numpy(x[:4])) is not None


def test_a_layer_fit_for_raw_columns_trains_on_them_standardised_keeping_its_function():
    # spreads 100 times apart make a step that suits one column thousands of times too large
    # for another, whatever the layer's outputs: SGD on a price beside one-hot columns
    # (outputs of a few units) ended at 45.6% where FedAvg reached 73.2% (now 68.9%)
    x, _ = _table(400, 0)
    fit = Mlp()
    with torch.no_grad():
        fit.f[0].weight.div_(torch.from_numpy(x.std(0)))  # a layer fit for raw columns
        fit.f[0].bias.sub_(fit.f[0].weight @ torch.from_numpy(x.mean(0)))
    scale, xt = InputScale(), torch.from_numpy(x)
    assert scale.decide(fit, x) and not scale.fresh_start
    before = fit(xt).detach()
    with scale.standardised(fit, x) as layer:
        assert layer is fit.f[0]
        assert torch.allclose(fit(xt).detach(), before, rtol=1e-4, atol=1e-4)
        # inside, the layer holds W * std: the weights it was fit from, for standardised rows
        assert torch.allclose(layer.weight, Mlp().f[0].weight, rtol=1e-2)  # std: n-1 or n
    assert torch.allclose(fit(xt).detach(), before, rtol=1e-4, atol=1e-4)


def test_a_phase_on_standardised_columns_hands_back_the_same_function():
    x, _ = _table(200, 1)
    model, xt = Mlp(), torch.from_numpy(x)
    scale = InputScale()
    assert scale.decide(model, x) and scale.fresh_start
    before = model(xt).detach()
    with scale.standardised(model, x):  # first phase: the initial weights as standardised
        inside = model(xt).detach()
        z = (xt - xt.mean(0)) / xt.std(0)  # the spreads as the server measures them
        assert torch.allclose(inside, Mlp()(z), atol=1e-5)  # the user's start, standardised
    after = model(xt).detach()
    assert torch.allclose(after, inside, rtol=1e-4, atol=1e-4)  # written back for raw rows
    assert not torch.allclose(after, before)
    with scale.standardised(model, x):  # later phases: the same function throughout
        assert torch.allclose(model(xt).detach(), after, rtol=1e-4, atol=1e-4)
    assert torch.allclose(model(xt).detach(), after, rtol=1e-4, atol=1e-4)
    again = InputScale()
    again.load_state(scale.state())
    assert again.decided and np.array_equal(again.std, scale.std) and not again.fresh_start


def _run(parts, xt, yt) -> float:
    def train(msg, context):
        return dq_flower.client.dq_train(msg, context,
                                         parts[int(context.node_config["partition-id"])])

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        net = Mlp()
        net.load_state_dict(arrays.to_torch_state_dict())
        with torch.no_grad():
            return MetricRecord({"accuracy": float(
                (net(torch.from_numpy(xt)).argmax(1).numpy() == yt).mean())})

    model = Mlp()
    result = dq_flower.DQStrategy(model, seed=0).start(
        grid=InProcessGrid(train, len(parts)), num_rounds=3, evaluate_fn=evaluate,
        initial_arrays=ArrayRecord(model.state_dict()))
    return float(result.evaluate_metrics_serverapp[3]["accuracy"])


def test_dq_learns_a_raw_table_of_columns_in_thousands_and_hundredths(caplog, monkeypatch):
    x, y = _table(2400, 2)
    parts = [(x[i:2000:5], y[i:2000:5]) for i in range(5)]
    with caplog.at_level(logging.INFO, logger="flwr"):
        standardised = _run(parts, x[2000:], y[2000:])
    assert "the server trains the model's first layer on them standardised" in caplog.text
    monkeypatch.setattr(input_scale, "SPREAD_RATIO", float("inf"))  # as before: raw
    raw = _run(parts, x[2000:], y[2000:])
    assert standardised > 0.8 and standardised > raw + 0.2
