"""Rows with missing values (NaN) for a model that reads them as 0 (``torch.nan_to_num(x)``).

A node's rows holding a NaN were left out (DQ quantizes values): a clinic table whose lab
columns are missing for 25-40% of patients, more often for the healthy ones, lost 70% of
its rows, and those kept were the sick: DQ 64.6% where FedAvg, whose model reads the NaN
values as 0, reached 80.7%. The server now probes its model once (NaN values against 0,
seeded) and, where it reads them alike, asks the nodes to send NaN values as 0.
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import ArrayRecord
from torch import nn
from torch.utils.data import TensorDataset

import dq_flower
from dq_flower.data_input import as_inputs
from dq_flower.harness.inprocess import InProcessGrid
from dq_flower.model_inputs import input_asks, reads_nan_as_zero


class FillsZero(nn.Module):
    """``torch.nan_to_num(x)`` first: a missing value reads as 0."""

    def __init__(self, width: int = 6) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(width, 16), nn.ReLU(), nn.Linear(16, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(torch.nan_to_num(x))


class ReadsMask(FillsZero):
    """Also reads where values are missing: NaN is not 0 to it."""

    def __init__(self) -> None:
        super().__init__(12)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(torch.cat([torch.nan_to_num(x), torch.isnan(x).float()], 1))


def table(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(n, 6)`` rows whose label is the sign of column 0; columns 3-5 missing for 40%."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 6)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    x[rng.random((n, 6)) < np.array([0, 0, 0, 0.4, 0.4, 0.4])] = np.nan
    return x, y


def test_the_probe_tells_a_model_that_reads_nan_as_zero():
    assert reads_nan_as_zero(FillsZero(), (6,))
    assert not reads_nan_as_zero(ReadsMask(), (6,))
    assert not reads_nan_as_zero(nn.Linear(6, 2), (6,))  # NaN outputs
    assert input_asks(FillsZero(), one_input=False) == {"nan-zero": 1}  # its layer's width
    assert input_asks(nn.Linear(6, 2), one_input=False) == {}


def test_a_node_asked_so_keeps_its_rows_with_nan_values_as_zero():
    x, y = table(50, 0)
    kept, _, _ = as_inputs((x, y))
    assert kept.shape[0] == int(np.isfinite(x).all(1).sum()) < 50  # left out by default
    filled, labels, _ = as_inputs((x, y), nan="zero")
    np.testing.assert_array_equal(filled, np.nan_to_num(x))
    assert labels.tolist() == y.tolist()


def test_dq_stores_every_row_of_a_model_that_reads_nan_as_zero():
    data = [table(150, seed) for seed in (1, 2)]

    def train(msg, context):
        x, y = data[int(context.node_config["partition-id"])]
        return dq_flower.client.dq_train(msg, context, TensorDataset(
            torch.from_numpy(x), torch.from_numpy(y)))

    def stored(model: nn.Module) -> int:
        result = dq_flower.DQStrategy(model, seed=0, upload_schedule="all").start(
            grid=InProcessGrid(train, 2), initial_arrays=ArrayRecord(model.state_dict()),
            num_rounds=1)
        return int(result.evaluate_metrics_serverapp[1]["stored"])

    complete = sum(int(np.isfinite(x).all(1).sum()) for x, _ in data)
    assert stored(FillsZero()) == 300  # 67 before: the rows without a NaN
    assert stored(ReadsMask()) == complete < 150  # its NaN rows still left out
