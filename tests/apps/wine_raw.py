"""A user's app: an MLP on scikit-learn's wine table as loaded, 4 nodes, 10 rounds.

The user loads the 178 rows with ``load_wine`` and feeds the 13 features unscaled (proline
runs from 278 to 1,680, hue from 0.48 to 1.71), takes scikit-learn's seeded 80/20
``train_test_split`` (stratified) and deals the 142 training rows round-robin to 4 nodes,
each held as a ``TensorDataset``. The user's server passes its step size to the clients
with ``train_config=ConfigRecord({"lr": 0.001})``; FedAvg's local training reads it from
the message and runs 5 local epochs of Adam at that step size (batch 8).
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import ConfigRecord
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

NAME = "wine-raw"
NUM_NODES = 4
ROUNDS = 10
TRAIN_CONFIG = {"lr": 0.001}
LOCAL_EPOCHS = 5
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
        from sklearn.datasets import load_wine
        from sklearn.model_selection import train_test_split

        x, y = load_wine(return_X_y=True)
        x_tr, x_te, y_tr, y_te = train_test_split(
            x.astype(np.float32), y.astype(np.int64), test_size=0.2, random_state=SEED,
            stratify=y)
        _CACHE["arrays"] = (x_tr, y_tr, x_te, y_te)
    return _CACHE["arrays"]


class Net(nn.Module):
    """13 -> 64 -> 3, ReLU."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(13, 64), nn.ReLU(), nn.Linear(64, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def load_local_data(partition_id: int) -> TensorDataset:
    x, y, _, _ = _arrays()
    idx = np.arange(partition_id, len(y), NUM_NODES)
    return TensorDataset(torch.from_numpy(x[idx]), torch.from_numpy(y[idx]))


def test_set() -> tuple[np.ndarray, np.ndarray]:
    _, _, xt, yt = _arrays()
    return xt, yt


def local_train(model: nn.Module, data: TensorDataset, config: ConfigRecord) -> int:
    """5 epochs of Adam at the server's ``lr`` (batch 8); returns the examples seen."""
    opt = torch.optim.Adam(model.parameters(), lr=float(config["lr"]))
    loader = DataLoader(data, batch_size=8, shuffle=True,
                        generator=torch.Generator().manual_seed(0))
    model.train()
    for _ in range(LOCAL_EPOCHS):
        for xb, yb in loader:
            opt.zero_grad()
            nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
    return len(data)
