"""A user's app: 8% positives, a one-logit MLP trained with ``BCEWithLogitsLoss(pos_weight)``.

The user's rows (synthetic, seeded: 12,000 transactions of 20 standardised features) are
positive for about 8% (a fraud detector's table); five nodes take the first 10,000 round
robin as ``TensorDataset``s, the last 2,000 test. The user weighs the positives by the
negatives' count over theirs in ``BCEWithLogitsLoss(pos_weight=...)`` and scores by
balanced accuracy (the mean of both classes' recall), as such detectors are scored. FedAvg
trains one epoch per round with Adam (lr 0.01, batch 32); DQ is given the same loss
(``DQ_LOSS_FN``), a reducing loss module as the user wrote it.

Not one of the zoo's apps: its model (705 weights) is tiny beside its 10,000 rows, so DQ,
which asks for nearly every row here, sends about what FedAvg does (see the user-app page's
table of apps where DQ does not win).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

NAME = "imbalanced-weighted"
NUM_NODES = 5
ROUNDS = 8
METRIC = "balanced-accuracy"
LOWER_IS_BETTER = False
SEED = 0
_CACHE: dict = {}


def available() -> bool:
    return True


def _arrays() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    if "arrays" not in _CACHE:
        rng = np.random.default_rng(SEED)
        x = rng.normal(size=(12_000, 20)).astype(np.float32)
        logit = x @ rng.normal(size=20) * 0.8 - 5.0
        y = (rng.random(12_000) < 1 / (1 + np.exp(-logit))).astype(np.float32)
        _CACHE["arrays"] = (x[:10_000], y[:10_000], x[10_000:], y[10_000:])
    return _CACHE["arrays"]


def positive_weight() -> float:
    """The negatives' count over the positives' in the training rows (the user's pos_weight)."""
    y = _arrays()[1]
    return float((len(y) - y.sum()) / y.sum())


class Net(nn.Module):
    """20 -> 32 -> 1 logit, ReLU."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x).squeeze(-1)


def user_loss() -> nn.Module:
    """The loss the user trains with, reducing to one number as written."""
    return nn.BCEWithLogitsLoss(pos_weight=torch.tensor(positive_weight()))


DQ_LOSS_FN = user_loss


def load_local_data(partition_id: int) -> TensorDataset:
    x, y, _, _ = _arrays()
    idx = np.arange(partition_id, len(y), NUM_NODES)
    return TensorDataset(torch.from_numpy(x[idx]), torch.from_numpy(y[idx]))


def test_set() -> tuple[np.ndarray, np.ndarray]:
    _, _, x, y = _arrays()
    return x, y


def score(model: nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    """Balanced accuracy: the mean of the positives' and the negatives' recall."""
    with torch.no_grad():
        pred = (model(torch.as_tensor(x)) > 0).numpy()
    truth = np.asarray(y).astype(bool)
    return float(0.5 * (pred[truth].mean() + (~pred[~truth]).mean()))


def local_train(model: nn.Module, data: TensorDataset) -> int:
    """One epoch of Adam (lr 0.01, batch 32) on the weighted loss; the examples seen."""
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    loss_fn = user_loss()
    model.train()
    for xb, yb in DataLoader(data, batch_size=32, shuffle=True,
                             generator=torch.Generator().manual_seed(0)):
        opt.zero_grad()
        loss_fn(model(xb), yb).backward()
        opt.step()
    return len(data)
