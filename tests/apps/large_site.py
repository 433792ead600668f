"""A user's app: one hospital's rows beside four clinics' dozen each, over 100 times theirs.

scikit-learn's digits (pixels scaled to 0..1), a seeded 80/20 split; the first 48
training rows go to four clinics of 12 rows, the other 1,389 to one hospital (partition
0), each node's data a ``TensorDataset``. The hospital holds 115 times a clinic's rows. An
MLP; FedAvg trains one epoch per round with SGD (lr 0.05, momentum 0.9, batch 32) and
weighs the nodes by their rows.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

NAME = "large-site"
NUM_NODES = 5
ROUNDS = 6
CLINIC_ROWS = 12
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
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split

        x, y = load_digits(return_X_y=True)
        x_tr, x_te, y_tr, y_te = train_test_split(
            (x / 16).astype(np.float32), y.astype(np.int64), test_size=0.2, random_state=SEED)
        _CACHE["arrays"] = (x_tr, y_tr, x_te, y_te)
    return _CACHE["arrays"]


class Net(nn.Module):
    """64 -> 64 -> 10, ReLU."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def load_local_data(partition_id: int) -> TensorDataset:
    x, y, _, _ = _arrays()
    clinics = (NUM_NODES - 1) * CLINIC_ROWS
    rows = (slice(clinics, None) if partition_id == 0
            else slice((partition_id - 1) * CLINIC_ROWS, partition_id * CLINIC_ROWS))
    return TensorDataset(torch.from_numpy(x[rows]), torch.from_numpy(y[rows]))


def test_set() -> tuple[np.ndarray, np.ndarray]:
    _, _, x_test, y_test = _arrays()
    return x_test, y_test


def local_train(model: nn.Module, data: TensorDataset) -> int:
    """One epoch of SGD (lr 0.05, momentum 0.9, batch 32); the examples seen."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loader = DataLoader(data, batch_size=32, shuffle=True,
                        generator=torch.Generator().manual_seed(0))
    model.train()
    for xb, yb in loader:
        opt.zero_grad()
        nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
    return len(data)
