"""Float targets of unlike scales standardised inside the server's training (DQ only).

Three targets a row on scales about 1, 100 and 10,000 (``tests/apps/multiscale_targets``,
MSE on raw targets): the probe's one Adam step, sized from the spread over all targets,
threw the rate about (its error 26.5 spreads against the price's 0.10); DQ ended at 9.36,
FedAvg at 2.68. The server now trains the last layer's rows in their targets' spreads and
writes them back for raw targets: 0.139 (each target 0.19, 0.15 and 0.08).
"""

from __future__ import annotations

import logging

import numpy as np
import torch
from torch import nn

import dq_flower.dq.server.output_scale as output_scale
from dq_flower.dq.server.output_scale import OutputScale, last_linear
from tests.apps import multiscale_targets
from tests.apps.runner import run_app


def _rows(n: int = 400) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(0, 1, (n, 8)).astype(np.float32)
    z = x @ rng.normal(0, 1, (8, 3))
    return x, (z * [1.0, 100.0, 10000.0] + [0.0, 500.0, 200000.0]).astype(np.float32)


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))


def test_only_targets_of_unlike_scales_from_a_last_linear_layer_are_standardised():
    x, y = _rows()
    assert OutputScale().decide(_net(), x, y)
    assert not OutputScale().decide(_net(), x, y[:, :1])  # one target: as before
    assert not OutputScale().decide(_net(), x, y[:, [0, 0, 0]] * 1000)  # one scale
    squashed = nn.Sequential(_net(), nn.Sigmoid())
    assert last_linear(squashed, torch.from_numpy(x)) is None
    assert not OutputScale().decide(squashed, x, y)  # no Linear hands its outputs on


def test_a_fit_layer_keeps_its_function_and_the_model_predicts_raw_targets():
    x, y = _rows()
    fit, xt = _net(), torch.from_numpy(x)
    mean, std = torch.from_numpy(y.mean(0)), torch.from_numpy(y.std(0, ddof=1))
    with torch.no_grad():  # a last layer fit for raw targets
        fit[2].weight.mul_(std[:, None])
        fit[2].bias.mul_(std).add_(mean)
    scale = OutputScale()
    assert scale.decide(fit, x, y) and not scale.fresh_start
    before = fit(xt).detach()
    with scale.standardised(fit, (x, y)) as layer:
        assert layer is fit[2]
        assert torch.allclose(fit(xt).detach(), before, rtol=1e-4, atol=1e-2)
        assert torch.allclose(layer.weight, _net()[2].weight, rtol=1e-3, atol=1e-5)
    assert torch.allclose(fit(xt).detach(), before, rtol=1e-4, atol=1e-2)


def test_an_unfit_layer_starts_as_for_standardised_targets_and_is_written_back():
    x, y = _rows()
    model, xt = _net(), torch.from_numpy(x)
    scale = OutputScale()
    assert scale.decide(model, x, y) and scale.fresh_start
    with scale.standardised(model, (x, y)):
        inside = model(xt).detach()
        start = _net()(xt).detach() * torch.from_numpy(scale.std).float() + torch.from_numpy(
            scale.mean).float()
        assert torch.allclose(inside, start, rtol=1e-4, atol=1e-1)
    assert torch.allclose(model(xt).detach(), inside, rtol=1e-4, atol=1e-1)
    again = OutputScale()
    again.load_state(scale.state())
    assert again.decided and np.array_equal(again.std, scale.std) and not again.fresh_start


def test_dq_learns_targets_of_scales_1_to_10000_under_the_users_raw_mse(caplog, monkeypatch):
    with caplog.at_level(logging.INFO, logger="flwr"):
        scaled = run_app(multiscale_targets, "dq", 3)
    assert "the server trains the model's last layer for them standardised" in caplog.text
    assert scaled.final < 0.2, scaled.scores
    monkeypatch.setattr(output_scale.OutputScale, "spreads",  # as before: one step
                        staticmethod(lambda values, layer: None))
    raw = run_app(multiscale_targets, "dq", 3)
    assert raw.final > 5 * scaled.final, (raw.scores, scaled.scores)
