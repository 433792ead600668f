"""A user's app: an MLP regressing scikit-learn's diabetes progression as shipped, 20 rounds.

The same data as ``diabetes_regression`` but the way many users leave it: the float
target unscaled (disease progression, 25 to 346; always predicting the training mean
scores a test MSE of about 5,100). The user takes the seeded 80/20 ``train_test_split``
and deals the training rows round-robin to 5 nodes as ``TensorDataset``s. FedAvg trains
three epochs per round with Adam (lr 0.01, batch 16) on the mean squared error. Scored by
the test MSE in the target's own units (lower is better); DQ passes within
``1 + TOLERANCE`` of FedAvg's (see ``diabetes_regression`` for the tolerance).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

NAME = "diabetes-raw"
NUM_NODES = 5
ROUNDS = 20
SEED = 0
METRIC = "mse"
LOWER_IS_BETTER = True
#: DQ's final test MSE may be at most this much above FedAvg's, relatively.
TOLERANCE = 0.10
_CACHE: dict = {}


def available() -> bool:
    try:
        import sklearn  # noqa: F401
    except ImportError:
        return False
    return True


def _arrays() -> list[np.ndarray]:
    if "arrays" not in _CACHE:
        from sklearn.datasets import load_diabetes
        from sklearn.model_selection import train_test_split

        x, y = load_diabetes(return_X_y=True)
        _CACHE["arrays"] = train_test_split(x.astype(np.float32), y.astype(np.float32),
                                            test_size=0.2, random_state=SEED)
    return _CACHE["arrays"]


class Net(nn.Module):
    """10 -> 32 -> 1, ReLU."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def load_local_data(partition_id: int) -> TensorDataset:
    x_train, _, y_train, _ = _arrays()
    idx = np.arange(partition_id, len(y_train), NUM_NODES)
    return TensorDataset(torch.from_numpy(x_train[idx]), torch.from_numpy(y_train[idx]))


def test_set() -> tuple[np.ndarray, np.ndarray]:
    _, x_test, _, y_test = _arrays()
    return x_test, y_test


def score(model: nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    """Mean squared error of the model's predictions for ``x`` against ``y``."""
    with torch.no_grad():
        pred = model(torch.as_tensor(x)).reshape(-1).numpy()
    return float(np.mean((pred - np.asarray(y)) ** 2))


def chance_score() -> float:
    """The test MSE of always predicting the training targets' mean."""
    _, _, y_train, _ = _arrays()
    return float(np.mean((test_set()[1] - y_train.mean()) ** 2))


def local_train(model: nn.Module, data: TensorDataset) -> int:
    """Three epochs of Adam (lr 0.01, batch 16) on the MSE; returns the node's examples."""
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    loader = DataLoader(data, batch_size=16, shuffle=True,
                        generator=torch.Generator().manual_seed(0))
    model.train()
    for _ in range(3):
        for xb, yb in loader:
            opt.zero_grad()
            nn.functional.mse_loss(model(xb).reshape(-1), yb).backward()
            opt.step()
    return len(data)
