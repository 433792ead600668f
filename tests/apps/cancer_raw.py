"""A user's app: an MLP on scikit-learn's breast-cancer table as loaded, 4 nodes, 8 rounds.

The user loads the table as a pandas ``DataFrame`` (``load_breast_cancer(as_frame=True)``)
and feeds the 30 features unscaled (mean area runs from 144 to 2,501, smoothness from
0.05 to 0.16), takes scikit-learn's seeded, stratified 80/20 ``train_test_split`` and
deals the training rows round-robin to 4 nodes. Each node serves its rows through the
user's own map-style ``Dataset`` as ``{"features": tensor(30), "label": int}`` dict
samples. FedAvg trains three local epochs per round with Adam (lr 0.001, batch 32), the
step size written into the client's code.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

NAME = "cancer-raw"
NUM_NODES = 4
ROUNDS = 8
LOCAL_EPOCHS = 3
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
    """The seeded 80/20 split of the table: ``(train frame, test frame)``."""
    if "frames" not in _CACHE:
        from sklearn.datasets import load_breast_cancer
        from sklearn.model_selection import train_test_split

        frame = load_breast_cancer(as_frame=True).frame
        _CACHE["frames"] = train_test_split(frame, test_size=0.2, random_state=SEED,
                                            stratify=frame["target"])
    return _CACHE["frames"]


class Rows(Dataset):
    """Rows of the table as ``{"features": tensor(30), "label": int}``."""

    def __init__(self, frame) -> None:
        self.x = frame.drop(columns="target").to_numpy(np.float32)
        self.y = frame["target"].to_numpy(np.int64)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> dict:
        return {"features": torch.from_numpy(self.x[i]), "label": int(self.y[i])}


class Net(nn.Module):
    """30 -> 32 -> 2, ReLU."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(30, 32), nn.ReLU(), nn.Linear(32, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def load_local_data(partition_id: int) -> Rows:
    train, _ = _frames()
    return Rows(train.iloc[partition_id::NUM_NODES])


def test_set() -> tuple[np.ndarray, np.ndarray]:
    rows = Rows(_frames()[1])
    return rows.x, rows.y


def local_train(model: nn.Module, data: Rows) -> int:
    """Three epochs of Adam (lr 0.001, batch 32); returns the examples seen."""
    opt = torch.optim.Adam(model.parameters(), lr=0.001)
    loader = DataLoader(data, batch_size=32, shuffle=True,
                        generator=torch.Generator().manual_seed(0))
    model.train()
    for _ in range(LOCAL_EPOCHS):
        for batch in loader:
            opt.zero_grad()
            nn.functional.cross_entropy(model(batch["features"]), batch["label"]).backward()
            opt.step()
    return len(data)
