"""A user's app: sample weights in the data set, ``TensorDataset(x, y, sample_weight)``.

The user weighs the digits 0 to 4 twice as much as the others (a business rule, as Keras'
``sample_weight`` would) and keeps the weight beside each row: four nodes serve scikit-learn's
first 1,400 digits (8x8 pixels 0..16, unscaled) round robin as ``TensorDataset(x, y, w)``
through a ``DataLoader``; the last 397 rows test. FedAvg trains one epoch per round with
Adam (lr 0.003, batch 32) on the weighted cross-entropy ``(cross_entropy(model(x), y,
reduction="none") * w).mean()``. DQ's nodes get the same ``DataLoader``: every tensor of a
``TensorDataset`` but the last reads as a model input, so the server, whose model takes one
input, refuses round 1's replies and asks for ``(x, y)`` from round 2 on, the weights left
out (its loss weighs no rows).

Not one of the zoo's apps: its figures are quoted on the plugin page.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

NAME = "sample-weights"
NUM_NODES = 4
ROUNDS = 5
_CACHE: dict = {}


def available() -> bool:
    return True


def digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits, unscaled float32 pixels and int64 labels, read once."""
    if "xy" not in _CACHE:
        from sklearn.datasets import load_digits

        data = load_digits()
        _CACHE["xy"] = data.data.astype(np.float32), data.target.astype(np.int64)
    return _CACHE["xy"]


class Net(nn.Module):
    """64 -> 64 -> 10, ReLU."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def load_local_data(partition_id: int) -> DataLoader:
    x, y = (a[:1400][partition_id::NUM_NODES] for a in digits())
    w = np.where(y < 5, 2.0, 1.0).astype(np.float32)
    return DataLoader(TensorDataset(torch.from_numpy(x), torch.from_numpy(y),
                                    torch.from_numpy(w)), batch_size=32, shuffle=True,
                      generator=torch.Generator().manual_seed(partition_id))


def test_set() -> tuple[np.ndarray, np.ndarray]:
    x, y = digits()
    return x[1400:], y[1400:]


def local_train(model: nn.Module, loader: DataLoader) -> int:
    """One epoch of Adam on the weighted cross-entropy; returns the examples seen."""
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    seen = 0
    for x, y, w in loader:
        opt.zero_grad()
        (nn.functional.cross_entropy(model(x), y, reduction="none") * w).mean().backward()
        opt.step()
        seen += len(y)
    return seen
