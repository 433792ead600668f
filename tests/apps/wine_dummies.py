"""A user's app: wine as a pandas table with a one-hot column from ``pd.get_dummies``.

The user loads ``load_wine(as_frame=True)``, keeps alcohol as a category (``pd.cut`` into
the same three bins at every site: below 12.5, 12.5 to 13.5, above) one-hot encoded with
``pd.get_dummies``, which in pandas 2 gives bool columns beside the float ones, and
standardises the twelve numeric columns by the training split's mean and standard
deviation. Seeded stratified 80/20 split; 4 nodes take rows round robin by ``iloc``, and
each node's data is the pair ``(features DataFrame, labels Series)``, the ``(x, y)`` form.
FedAvg's local training converts with ``to_numpy(np.float32)``: 5 epochs of Adam, lr
0.005, batch 16.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

NAME = "wine-dummies"
NUM_NODES = 4
ROUNDS = 8
SEED = 0
_CACHE: dict = {}


def available() -> bool:
    try:
        import pandas  # noqa: F401
        import sklearn  # noqa: F401
    except ImportError:
        return False
    return True


def _frames():
    if "frames" not in _CACHE:
        import pandas as pd
        from sklearn.datasets import load_wine
        from sklearn.model_selection import train_test_split

        wine = load_wine(as_frame=True)
        x, y = wine.data.copy(), wine.target
        x["alcohol_level"] = pd.cut(x.pop("alcohol"), [0, 12.5, 13.5, 99],
                                    labels=["light", "medium", "strong"])
        x = pd.get_dummies(x, columns=["alcohol_level"])
        x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.2, random_state=SEED,
                                                  stratify=y)
        numeric = [c for c in x.columns if not c.startswith("alcohol_level")]
        mean, std = x_tr[numeric].mean(), x_tr[numeric].std()
        x_tr = x_tr.assign(**((x_tr[numeric] - mean) / std))
        x_te = x_te.assign(**((x_te[numeric] - mean) / std))
        _CACHE["frames"] = (x_tr, y_tr, x_te, y_te)
    return _CACHE["frames"]


class Net(nn.Module):
    """15 -> 32 -> 3, ReLU."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(15, 32), nn.ReLU(), nn.Linear(32, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def load_local_data(partition_id: int):
    x, y, _, _ = _frames()
    return x.iloc[partition_id::NUM_NODES], y.iloc[partition_id::NUM_NODES]


def test_set() -> tuple[np.ndarray, np.ndarray]:
    _, _, x_test, y_test = _frames()
    return x_test.to_numpy(np.float32), y_test.to_numpy()


def local_train(model: nn.Module, data) -> int:
    """5 epochs of Adam (lr 0.005, batch 16) on the frame as float32; the examples seen."""
    features, labels = data
    rows = TensorDataset(torch.tensor(features.to_numpy(np.float32)),
                         torch.tensor(labels.to_numpy()))
    loader = DataLoader(rows, batch_size=16, shuffle=True,
                        generator=torch.Generator().manual_seed(0))
    opt = torch.optim.Adam(model.parameters(), lr=0.005)
    model.train()
    for _ in range(5):
        for xb, yb in loader:
            opt.zero_grad()
            nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
    return len(rows)
