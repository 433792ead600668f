"""A user's app: ``BatchNorm1d`` as the model's first layer on the unscaled breast-cancer table.

The user does no preprocessing: the 30 features as ``load_breast_cancer`` gives them (mean
area 144 to 2,501, smoothness 0.05 to 0.16), a ``BatchNorm1d(30)`` at the model's input
normalising them, then ``Linear(30, 64)``, ``BatchNorm1d(64)``, ReLU, ``Dropout(0.3)`` and
``Linear(64, 2)``. Seeded stratified 80/20 split; 5 nodes round robin as
``TensorDataset``s. FedAvg: 3 local epochs of Adam (lr 0.001, batch 16, ``drop_last`` so
BatchNorm never sees a batch of one), averaging BatchNorm's running statistics with the
weights (they travel in the ``state_dict``).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

NAME = "cancer-batchnorm"
NUM_NODES = 5
ROUNDS = 10
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
        from sklearn.model_selection import train_test_split

        x, y = load_breast_cancer(return_X_y=True)
        x_tr, x_te, y_tr, y_te = train_test_split(
            x.astype(np.float32), y.astype(np.int64), test_size=0.2, random_state=SEED,
            stratify=y)
        _CACHE["arrays"] = (x_tr, y_tr, x_te, y_te)
    return _CACHE["arrays"]


class Net(nn.Module):
    """BatchNorm 30, 30 -> 64, BatchNorm 64, ReLU, dropout 0.3, 64 -> 2."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.BatchNorm1d(30), nn.Linear(30, 64), nn.BatchNorm1d(64),
                                  nn.ReLU(), nn.Dropout(0.3), nn.Linear(64, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def load_local_data(partition_id: int) -> TensorDataset:
    x, y, _, _ = _arrays()
    return TensorDataset(torch.from_numpy(x[partition_id::NUM_NODES]),
                         torch.from_numpy(y[partition_id::NUM_NODES]))


def test_set() -> tuple[np.ndarray, np.ndarray]:
    _, _, x_test, y_test = _arrays()
    return x_test, y_test


def local_train(model: nn.Module, data: TensorDataset) -> int:
    """3 epochs of Adam (lr 0.001, batch 16, the last short batch dropped); the examples."""
    opt = torch.optim.Adam(model.parameters(), lr=0.001)
    loader = DataLoader(data, batch_size=16, shuffle=True, drop_last=True,
                        generator=torch.Generator().manual_seed(0))
    model.train()
    for _ in range(3):
        for xb, yb in loader:
            opt.zero_grad()
            nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
    return len(data)
