"""``simulate`` with a user's own model: an instance, its class, or a factory (under Ray)."""

from __future__ import annotations

import cloudpickle
import pytest
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
    result = dq_flower.simulate(method="dq", model=DigitsNet(), num_clients=2, rounds=2,
                                seed=0, budget=64, server_steps=20)
    assert result.history[-1]["accuracy"] > 0.6
    assert result.num_params == sum(p.numel() for p in DigitsNet().parameters())


def test_a_model_that_does_not_fit_the_data_fails_before_the_engine_starts():
    with pytest.raises(ValueError, match="does not accept samples"):
        dq_flower.simulate(method="dq", model=user_app.Net, num_clients=2, rounds=1)
    with pytest.raises(ValueError, match="unknown model 'nope'"):
        dq_flower.simulate(method="dq", model="nope", num_clients=2, rounds=1)
    with pytest.raises(FileNotFoundError):
        dq_flower.simulate(method="dq", dataset="npz:/nonexistent/file.npz", num_clients=2,
                           rounds=1)
