"""A user's app: raw breast-cancer rows as dict samples, one large site beside four small.

The user loads scikit-learn's breast-cancer table as shipped (30 features unscaled: mean
area 144 to 2,501), takes a seeded, stratified 75/25 ``train_test_split`` and gives one
site (node 0) the first 60% of the training rows, the other four the rest round robin,
as ``{"features": tensor(30), "label": int}`` dict samples of the user's own ``Dataset``.
The model is an MLP with dropout; FedAvg trains one epoch per round with Adam (lr 1e-3,
batch 16), weighting by rows.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

NAME = "cancer-large-node"
NUM_NODES = 5
ROUNDS = 8
#: The large site's share of the training rows.
LARGE_SHARE = 0.6
_CACHE: dict = {}


def available() -> bool:
    try:
        import sklearn  # noqa: F401
    except ImportError:
        return False
    return True


def _arrays() -> list[np.ndarray]:
    if "arrays" not in _CACHE:
        from sklearn.datasets import load_breast_cancer
        from sklearn.model_selection import train_test_split

        x, y = load_breast_cancer(return_X_y=True)
        _CACHE["arrays"] = train_test_split(x.astype(np.float32), y, test_size=0.25,
                                            random_state=1, stratify=y)
    return _CACHE["arrays"]


class Net(nn.Module):
    """30 -> 32 -> 2, ReLU, dropout 0.1."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(30, 32), nn.ReLU(), nn.Dropout(0.1),
                                  nn.Linear(32, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class Rows(Dataset):
    """Rows as ``{"features": tensor(30), "label": int}``."""

    def __init__(self, x: np.ndarray, y: np.ndarray) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> dict:
        return {"features": torch.from_numpy(self.x[i]), "label": int(self.y[i])}


def load_local_data(partition_id: int) -> Rows:
    x_train, _, y_train, _ = _arrays()
    cut = int(LARGE_SHARE * len(y_train))
    idx = (np.arange(cut) if partition_id == 0
           else np.arange(cut + partition_id - 1, len(y_train), NUM_NODES - 1))
    return Rows(x_train[idx], y_train[idx])


def test_set() -> tuple[np.ndarray, np.ndarray]:
    _, x_test, _, y_test = _arrays()
    return x_test, y_test


def score(model: nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    """Accuracy in eval mode (no dropout)."""
    model.eval()
    with torch.no_grad():
        return float((model(torch.as_tensor(x)).argmax(1).numpy() == y).mean())


def local_train(model: nn.Module, data: Rows) -> int:
    """One epoch of Adam (lr 1e-3, batch 16) on the cross-entropy; the examples seen."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loader = DataLoader(data, batch_size=16, shuffle=True,
                        generator=torch.Generator().manual_seed(0))
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    for batch in loader:
        opt.zero_grad()
        loss_fn(model(batch["features"]), batch["label"]).backward()
        opt.step()
    return len(data)
