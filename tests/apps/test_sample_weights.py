"""``TensorDataset(x, y, sample_weight)`` for a model of one input (``sample_weights.py``)."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from dq_flower.data_input import as_inputs
from dq_flower.dq.server.federation import FederationData
from dq_flower.model_inputs import one_input_reason, positional_inputs
from tests.apps import sample_weights
from tests.apps.runner import docs_text, run_app


class TwoInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(3, 2), nn.Linear(1, 2)

    def forward(self, num: torch.Tensor, cat: torch.Tensor) -> torch.Tensor:
        return self.a(num) + self.b(cat.float()[:, None])


class AnyInputs(nn.Module):
    def forward(self, *parts: torch.Tensor) -> torch.Tensor:
        return parts[0]


def test_a_model_s_positional_inputs_are_read_from_its_forward():
    assert positional_inputs(nn.Linear(3, 2)) == 1
    assert positional_inputs(nn.Sequential(nn.Linear(3, 2))) == 1
    assert positional_inputs(TwoInputs()) == 2
    assert positional_inputs(AnyInputs()) is None
    assert one_input_reason(nn.Linear(3, 2), ("f3", "i")) is not None
    assert one_input_reason(TwoInputs(), ("f3", "i")) is None  # its two inputs: not this
    assert one_input_reason(nn.Linear(3, 2), ()) is None


def test_a_tensor_dataset_of_three_tensors_is_x_y_when_the_server_asks_so():
    x, y = torch.rand(6, 3), torch.arange(6) % 2
    w = torch.tensor([2.0, 1, 2, 1, 2, 1])
    loader = DataLoader(TensorDataset(x, y, w), batch_size=4)
    xa, ya, parts = as_inputs(loader)  # not asked: two inputs and a float target
    assert parts == ("f3", "i") and ya.dtype == np.float32 and xa.shape == (6, 4)
    xa, ya, parts = as_inputs(loader, one_input=True)
    assert parts == () and np.array_equal(xa, x.numpy()) and np.array_equal(ya, y.numpy())


def test_the_ask_is_kept_in_the_federation_s_state():
    data = FederationData()
    data.ask_one_input()
    again = FederationData()
    again.load_state(data.state(), lambda spec: None)
    assert again.one_input


@pytest.fixture(scope="module")
def runs():
    return run_app(sample_weights, "fedavg"), run_app(sample_weights, "dq")


def test_dq_refuses_round_1_with_the_reason_then_trains_on_x_y(runs, caplog):
    fedavg, dq = runs
    assert dq.up_by_round[1] > 0 and dq.scores[1] == dq.scores[0]  # refused, untrained
    assert dq.final > fedavg.final - 0.02 and dq.up_bytes < fedavg.up_bytes / 5


def test_the_reason_names_the_sample_weights(caplog):
    with caplog.at_level(logging.WARNING, logger="flwr"):
        run_app(sample_weights, "dq", rounds=1)
    assert "TensorDataset(x, y, sample_weight)" in caplog.text
    assert "the model (or loss_fn) the strategy was given" not in caplog.text  # not blamed


def test_the_plugin_page_quotes_today_s_figures(runs):
    fedavg, dq = runs
    quoted = (f"DQ reached {dq.final:.1%} with {dq.up_bytes:,} uplink bytes (round 1's "
              f"{dq.up_by_round[1]:,} refused), FedAvg with the weighted loss "
              f"{fedavg.final:.1%} with {fedavg.up_bytes:,}")
    assert quoted in docs_text("plugin.md"), quoted
