"""A user's app: a binary classifier ending in ``nn.Sigmoid()``, trained with ``BCELoss``.

The tutorial habit: the model outputs a probability, not a logit, and the user's loss is
``nn.BCELoss`` on it. The user standardizes scikit-learn's breast-cancer table (30
features), takes a seeded, stratified 75/25 ``train_test_split`` and keeps the labels as
float 0/1. Four nodes get the training rows round-robin through the user's own ``Dataset``
as ``{"features": tensor(30), "label": tensor(0. or 1.)}`` dict samples; a row is predicted
positive where its probability is above 0.5 (the app's ``score``). FedAvg trains one local
epoch per round with Adam (lr 0.01, batch 16). DQ's server, not told the user's loss, reads
the binary targets and scores the model's outputs as logits: on probabilities that loss
still pulls positives towards 1 and negatives towards 0.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

NAME = "cancer-sigmoid"
NUM_NODES = 4
ROUNDS = 8
METRIC = "accuracy"
LOWER_IS_BETTER = False
SEED = 0
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
        x = ((x - x.mean(0)) / x.std(0)).astype(np.float32)
        _CACHE["arrays"] = train_test_split(x, y.astype(np.float32), test_size=0.25,
                                            random_state=SEED, stratify=y)
    return _CACHE["arrays"]


class Net(nn.Module):
    """30 -> 16 -> 1 probability, ReLU then a sigmoid."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(30, 16), nn.ReLU(), nn.Linear(16, 1), nn.Sigmoid())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x).squeeze(-1)


class Rows(Dataset):
    """Rows as ``{"features": tensor(30), "label": tensor(0. or 1.)}``."""

    def __init__(self, x: np.ndarray, y: np.ndarray) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> dict:
        return {"features": torch.from_numpy(self.x[i]), "label": torch.tensor(self.y[i])}


def load_local_data(partition_id: int) -> Rows:
    x_train, _, y_train, _ = _arrays()
    idx = np.arange(partition_id, len(y_train), NUM_NODES)
    return Rows(x_train[idx], y_train[idx])


def test_set() -> tuple[np.ndarray, np.ndarray]:
    _, x_test, _, y_test = _arrays()
    return x_test, y_test.astype(np.int64)


def score(model: nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    """Share of rows whose probability is on their label's side of 0.5."""
    with torch.no_grad():
        pred = (model(torch.as_tensor(x)) > 0.5).numpy()
    return float((pred == np.asarray(y).astype(bool)).mean())


def local_train(model: nn.Module, data: Rows) -> int:
    """One epoch of Adam (lr 0.01, batch 16) on ``BCELoss``; the examples seen."""
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    loader = DataLoader(data, batch_size=16, shuffle=True,
                        generator=torch.Generator().manual_seed(0))
    loss_fn = nn.BCELoss()
    model.train()
    for batch in loader:
        opt.zero_grad()
        loss_fn(model(batch["features"]), batch["label"]).backward()
        opt.step()
    return len(data)
