"""A user's app: a machine-state classifier on 10 plant sensors, a few glitched rows on one.

Four plants log 10 sensors (standardised by the vendor's nominal means and spreads, so a
reading is typically within 3) and a machine state (3 classes): scikit-learn's seeded
``make_classification``, 2,400 rows to train round robin, 600 to test. On plant 0, 3 of
its 600 rows have sensor 2 read at 50, 400 and 1,000 (a stuck converter), as real logs
do; the user does not clean them. FedAvg: 2 local epochs of Adam (lr 1e-3, batch 32).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

NAME = "sensor-glitch"
NUM_NODES = 4
ROUNDS = 6
TRAIN_ROWS = 2400
GLITCHES = ((17, 50.0), (230, 400.0), (511, 1000.0))  # plant 0's rows and their readings
#: DQ's uplink may be half FedAvg's, not a fifth: the model (451 weights) weighs less than
#: 50 of its rows, so FedAvg's updates are small beside the data DQ sends.
UPLINK_SHARE = 0.5
_CACHE: dict = {}


def available() -> bool:
    try:
        import sklearn  # noqa: F401
    except ImportError:
        return False
    return True


def _arrays() -> dict:
    if not _CACHE:
        from sklearn.datasets import make_classification

        x, y = make_classification(n_samples=3000, n_features=10, n_informative=6,
                                   n_redundant=2, n_classes=3, n_clusters_per_class=1,
                                   class_sep=1.0, random_state=7)
        x, y = x.astype(np.float32), y.astype(np.int64)
        train = x[:TRAIN_ROWS].copy()
        parts = [np.arange(k, TRAIN_ROWS, NUM_NODES) for k in range(NUM_NODES)]
        signs = np.sign(np.random.default_rng(0).standard_normal(len(GLITCHES)))
        for (row, reading), sign in zip(GLITCHES, signs, strict=True):
            train[parts[0][row], 2] = reading * sign
        _CACHE.update(x=train, y=y[:TRAIN_ROWS], x_test=x[TRAIN_ROWS:],
                      y_test=y[TRAIN_ROWS:], parts=parts)
    return _CACHE


class Net(nn.Module):
    """10 -> 32 -> 3, ReLU."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def load_local_data(partition_id: int) -> TensorDataset:
    data = _arrays()
    rows = data["parts"][partition_id]
    return TensorDataset(torch.from_numpy(data["x"][rows]), torch.from_numpy(data["y"][rows]))


def test_set() -> tuple[np.ndarray, np.ndarray]:
    data = _arrays()
    return data["x_test"], data["y_test"]


def local_train(model: nn.Module, data: TensorDataset) -> int:
    """2 epochs of Adam (lr 1e-3, batch 32); the examples seen."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loader = DataLoader(data, batch_size=32, shuffle=True,
                        generator=torch.Generator().manual_seed(0))
    model.train()
    for _ in range(2):
        for xb, yb in loader:
            opt.zero_grad()
            nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
    return len(data)
