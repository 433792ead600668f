"""A user's app: digits with one-hot float labels, as Keras's ``to_categorical`` gives them.

The user loads scikit-learn's 8x8 digits (pixel values 0-16, unscaled), turns each label
into a one-hot float32 row of 10 (``np.eye(10)[y]``), deals the 1,437 training rows of a
seeded 80/20 split round-robin to 5 nodes as ``TensorDataset(x, y_onehot)``, and trains an
MLP with ``cross_entropy(logits, y_onehot)`` (PyTorch reads float targets as class
probabilities): 3 local epochs of SGD (lr 0.01, momentum 0.9, batch 32) for FedAvg.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

NAME = "onehot-labels"
NUM_NODES = 5
ROUNDS = 6
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
            x.astype(np.float32), y.astype(np.int64), test_size=0.2, random_state=SEED)
        _CACHE["arrays"] = (x_tr, np.eye(10, dtype=np.float32)[y_tr], x_te, y_te)
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
    idx = np.arange(partition_id, len(y), NUM_NODES)
    return TensorDataset(torch.from_numpy(x[idx]), torch.from_numpy(y[idx]))


def test_set() -> tuple[np.ndarray, np.ndarray]:
    _, _, xt, yt = _arrays()
    return xt, yt


def local_train(model: nn.Module, data: TensorDataset) -> int:
    """3 epochs of SGD (lr 0.01, momentum 0.9, batch 32) on the one-hot targets."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loader = DataLoader(data, batch_size=32, shuffle=True,
                        generator=torch.Generator().manual_seed(0))
    model.train()
    for _ in range(3):
        for xb, yb in loader:
            opt.zero_grad()
            nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
    return len(data)
