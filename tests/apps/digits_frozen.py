"""A user's app: a frozen feature layer and a trainable head (transfer learning), 6 rounds.

The user fine-tunes only a head: the model's first layer stands for a pretrained feature
extractor and is frozen (``requires_grad = False`` on its parameters, the usual way); the
head (128 -> 10) trains. Data: scikit-learn's digits (pixels scaled to 0..1), a seeded
70/30 ``train_test_split``, the training rows round robin over 5 nodes as
``TensorDataset``s. FedAvg trains one epoch per round with Adam (lr 0.01, batch 32) over
the parameters that require gradients.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

NAME = "digits-frozen"
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


def _arrays() -> list[np.ndarray]:
    if "arrays" not in _CACHE:
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split

        x, y = load_digits(return_X_y=True)
        _CACHE["arrays"] = train_test_split((x / 16).astype(np.float32), y, test_size=0.3,
                                            random_state=SEED)
    return _CACHE["arrays"]


class Net(nn.Module):
    """A frozen 64 -> 128 feature layer (ReLU), then a trainable 128 -> 10 head."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.backbone = nn.Sequential(nn.Linear(64, 128), nn.ReLU())
        for p in self.backbone.parameters():
            p.requires_grad = False
        self.head = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))


def load_local_data(partition_id: int) -> TensorDataset:
    x_train, _, y_train, _ = _arrays()
    idx = np.arange(partition_id, len(y_train), NUM_NODES)
    return TensorDataset(torch.from_numpy(x_train[idx]), torch.from_numpy(y_train[idx]))


def test_set() -> tuple[np.ndarray, np.ndarray]:
    _, x_test, _, y_test = _arrays()
    return x_test, y_test


def local_train(model: nn.Module, data: TensorDataset) -> int:
    """One epoch of Adam (lr 0.01, batch 32) on the head; the examples seen."""
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=0.01)
    loader = DataLoader(data, batch_size=32, shuffle=True,
                        generator=torch.Generator().manual_seed(0))
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    for x, y in loader:
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
    return len(data)
