"""Items of more than two values, ``(x, y, weight)``: the first two read, the rest said once.

A custom ``Dataset`` yielding ``(x, y, weight)`` triples (digits 0 to 4 weighted twice, the
user's FedAvg training a weighted loss) lost the weight without a word; each node now says
in its log, once, that the values after ``(x, y)`` are left out and where class weights go.
"""

from __future__ import annotations

import logging

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from dq_flower import sample_keys
from dq_flower.data_input import as_inputs
from tests.plugin.test_column_dicts import Told


class Weighted(Dataset):
    """Items ``(tensor(4), int, float)``: features, a class and a sample weight."""

    def __init__(self, n: int = 12) -> None:
        self.x = np.arange(4 * n, dtype=np.float32).reshape(n, 4)
        self.y = np.arange(n) % 3

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int, float]:
        return torch.from_numpy(self.x[i]), int(self.y[i]), 2.0 if self.y[i] == 0 else 1.0


def _read(data) -> tuple[np.ndarray, np.ndarray, list[str]]:
    told = Told()
    logging.getLogger("flwr").addHandler(told)
    try:
        x, y, _ = as_inputs(data)
    finally:
        logging.getLogger("flwr").removeHandler(told)
    return x, y, [line for line in told.lines if "items of 3 values" in line]


def test_a_weight_beside_x_and_y_is_left_out_and_said_once(monkeypatch):
    monkeypatch.setattr(sample_keys, "_TOLD", set())
    data = Weighted()
    x, y, said = _read(data)
    np.testing.assert_array_equal(x, data.x)
    assert y.tolist() == data.y.tolist() and y.dtype == np.int64
    assert said == ["Weighted: items of 3 values; DQ reads the first two as (x, y) and leaves "
                    "out the others (an id is not needed; DQ's server weighs no rows by a "
                    "sample weight: class weights go in DQStrategy's loss_fn; several inputs: "
                    "give ((x1, x2), y))"]
    assert _read(Weighted(9))[2] == []  # once a process, not once a node's round
    loader = DataLoader(Weighted(), batch_size=5, collate_fn=lambda b: [
        torch.stack([i[0] for i in b]), torch.tensor([i[1] for i in b]),
        torch.tensor([i[2] for i in b])])
    x, y, said = _read(loader)  # its own collate_fn: a batch of three tensors
    assert x.shape == (12, 4) and len(said) == 1 and said[0].startswith("Weighted collated")


def test_pairs_say_nothing(monkeypatch):
    monkeypatch.setattr(sample_keys, "_TOLD", set())
    assert _read([(torch.ones(4), 1), (torch.zeros(4), 0)])[2] == []
