"""A user's app: an MLP on scikit-learn's breast-cancer table, 4 nodes, 8 rounds.

The user's own preprocessing: a seeded 80/20 split of the 569 rows, the 30 features
standardized with the training split's mean and std (the test rows with the same), the
training rows dealt round-robin to 4 nodes, each held as a ``TensorDataset``. FedAvg
trains one epoch per round with SGD (lr 0.05, momentum 0.9, batch 32).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

NAME = "tabular-mlp"
NUM_NODES = 4
ROUNDS = 8
SEED = 0
_CACHE: dict = {}


def available() -> bool:
    try:
        import sklearn  # noqa: F401
    except ImportError:
        return False
    return True


def _arrays() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    if "arrays" not in _CACHE:
        from sklearn.datasets import load_breast_cancer

        x, y = load_breast_cancer(return_X_y=True)
        order = np.random.default_rng(SEED).permutation(len(y))
        x, y = x[order].astype(np.float32), y[order].astype(np.int64)
        split = int(0.8 * len(y))
        mean, std = x[:split].mean(0), x[:split].std(0)
        x = (x - mean) / std
        _CACHE["arrays"] = (x[:split], y[:split], x[split:], y[split:])
    return _CACHE["arrays"]


class Net(nn.Module):
    """30 -> 32 -> 2, ReLU."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(30, 32), nn.ReLU(), nn.Linear(32, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def load_local_data(partition_id: int) -> TensorDataset:
    x, y, _, _ = _arrays()
    idx = np.arange(partition_id, len(y), NUM_NODES)
    return TensorDataset(torch.from_numpy(x[idx]), torch.from_numpy(y[idx]))


def test_set() -> tuple[np.ndarray, np.ndarray]:
    _, _, xt, yt = _arrays()
    return xt, yt


def local_train(model: nn.Module, data: TensorDataset) -> int:
    """One epoch of SGD (lr 0.05, momentum 0.9, batch 32); returns the examples seen."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loader = DataLoader(data, batch_size=32, shuffle=True,
                        generator=torch.Generator().manual_seed(0))
    model.train()
    for xb, yb in loader:
        opt.zero_grad()
        nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
    return len(data)
