"""``simulate`` with a user's own model: an instance, its class, or a factory (under Ray).

The suite's one real Flower simulation of DQ (Ray backend, 2 clients, 2 rounds) is the
user model's below: it checks the engine's path (history keys, measured bytes, the adaptive
schedule's stored counts) as well as the model. The fixed schedule's stored counts are
checked in-process (``tests/dq/test_adaptive_schedule`` and the reference histories).
"""

from __future__ import annotations

import re

import cloudpickle
import pytest
import torch
from torch import nn

import dq_flower

from . import user_app


class DigitsNet(nn.Module):
    """A user's model for the 8x8 digits, defined outside the package."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))

    def forward(self, x):
        return self.body(x)


def test_simulate_trains_a_user_module_in_flowers_engine(monkeypatch):
    import sys

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers need not import it
    result = dq_flower.simulate(method="dq", dataset="digits", model=DigitsNet(),
                                num_clients=2, rounds=2, seed=1, budget=32, min_holdout_rows=2,
                                max_server_steps=200, max_server_epochs=1)
    assert result.history[-1]["accuracy"] > 0.6
    assert result.num_params == sum(p.numel() for p in DigitsNet().parameters())
    # the engine's path: DQ's history, bytes and adaptive schedule as in-process
    rows = result.history
    assert [r["round"] for r in rows] == [0, 1, 2]
    for key in ("accuracy", "loss", "up_bytes", "down_bytes", "cum_up_bytes",
                "cum_down_bytes", "wall_s"):
        assert key in rows[-1]
    assert rows[1]["up_bytes"] > 0 and rows[1]["down_bytes"] > 0
    assert rows[2]["cum_up_bytes"] == rows[1]["up_bytes"] + rows[2]["up_bytes"]
    # measured bytes cover the payload bits
    assert 8 * rows[1]["up_bytes"] >= rows[1]["up_payload_bits"] > 0
    # the first ask holds out 2 rows per class at 10%: 200 in all, then growth 2
    assert rows[1]["stored"] == 200 and rows[2]["stored"] == 400
    assert 0 < rows[1]["server_steps"] <= 200 and rows[1]["holdout_rows"] > 0
    assert rows[2]["accuracy"] > rows[0]["accuracy"]


def test_a_model_that_does_not_fit_the_data_fails_before_the_engine_starts():
    with pytest.raises(ValueError, match="does not accept samples"):
        dq_flower.simulate(method="dq", model=user_app.Net, num_clients=2, rounds=1)
    with pytest.raises(ValueError, match="unknown model 'nope'"):
        dq_flower.simulate(method="dq", model="nope", num_clients=2, rounds=1)
    with pytest.raises(FileNotFoundError):
        dq_flower.simulate(method="dq", dataset="npz:/nonexistent/file.npz", num_clients=2,
                           rounds=1)


class TrainsNowhere(DigitsNet):
    """A model that evaluates (no gradient) but fails wherever it trains: on every client."""

    def forward(self, x):
        if torch.is_grad_enabled():
            raise ValueError("this model cannot train here")
        return self.body(x)


@pytest.mark.slow
def test_simulate_raises_when_every_client_fails_naming_the_cause_last(monkeypatch):
    # Flower's simulation engine (30 s): each qsgd client computes a gradient and fails; the
    # run stops after max_failed_rounds and simulate() raises, its one line ending with the
    # cause (in-process: tests/faults/test_dropouts.py, tests/server/test_client_errors.py)
    import sys

    from dq_flower.server.common import ClientFailureError

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    with pytest.raises(ClientFailureError) as caught:
        dq_flower.simulate(method="qsgd", model=TrainsNowhere(), num_clients=2, rounds=3,
                           seed=0, max_failed_rounds=2)
    message = str(caught.value)
    assert "\n" not in message and message.startswith("[qsgd] every sampled client failed "
                                                      "for 2 consecutive rounds"), message
    assert re.search(r"; first client error, from node \d+ \(partition [01]\): ValueError: "
                     r"this model cannot train here$", message), message
