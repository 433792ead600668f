"""A user's app: a model of two inputs, ``model(x_num, x_cat)``, on a table of people.

The user's rows (synthetic, seeded: 6,000 people) hold five measured numbers (age about 40,
a score about 0, hours 0 to 60, two more) as float32 and three label-encoded categories (8,
5 and 12 values) as int64, kept apart as PyTorch users keep them for entity embeddings: each
node's data is ``TensorDataset(x_num, x_cat, y)`` (five nodes, the first 5,000 rows round
robin; the last 1,000 test). The model normalises the numbers with ``BatchNorm1d``, reads
each category with its own ``nn.Embedding`` and ends in an MLP. FedAvg trains one epoch per
round with Adam (lr 0.01, batch 32).

Not one of the zoo's apps: like ``tab_embeddings`` its model (752 weights) is small beside
its rows, and DQ sends about a quarter of FedAvg's uplink (see the user-app page's table of
apps where DQ does not win by the zoo's fifth).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

NAME = "two-inputs"
NUM_NODES = 5
ROUNDS = 6
CARDINALITIES = (8, 5, 12)
SEED = 0
_CACHE: dict = {}


def available() -> bool:
    return True


def _arrays() -> tuple[np.ndarray, ...]:
    if "arrays" not in _CACHE:
        rng = np.random.default_rng(SEED)
        n = 6000
        cat = np.stack([rng.integers(0, c, n) for c in CARDINALITIES], 1)
        num = np.stack([rng.normal(40, 12, n), rng.normal(0, 1, n), rng.uniform(0, 60, n),
                        rng.normal(5, 2, n), rng.normal(0, 1, n)], 1).astype(np.float32)
        effects = [rng.normal(0, 1.5, c) for c in CARDINALITIES]
        logit = (sum(effects[i][cat[:, i]] for i in range(len(CARDINALITIES)))
                 + 0.03 * (num[:, 0] - 40) + 0.5 * num[:, 1])
        y = (logit + rng.logistic(size=n) > 0).astype(np.int64)
        _CACHE["arrays"] = (num[:5000], cat[:5000], y[:5000], num[5000:], cat[5000:], y[5000:])
    return _CACHE["arrays"]


class Net(nn.Module):
    """BatchNorm on the numbers, an embedding of 4 per category, MLP 17-32-2."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embeddings = nn.ModuleList([nn.Embedding(c, 4) for c in CARDINALITIES])
        self.norm = nn.BatchNorm1d(5)
        self.mlp = nn.Sequential(nn.Linear(17, 32), nn.ReLU(), nn.Linear(32, 2))

    def forward(self, x_num: torch.Tensor, x_cat: torch.Tensor) -> torch.Tensor:
        codes = [emb(x_cat[:, i]) for i, emb in enumerate(self.embeddings)]
        return self.mlp(torch.cat([self.norm(x_num), *codes], 1))


def load_local_data(partition_id: int) -> TensorDataset:
    num, cat, y, *_ = _arrays()
    idx = np.arange(partition_id, len(y), NUM_NODES)
    return TensorDataset(torch.from_numpy(num[idx]), torch.from_numpy(cat[idx]),
                         torch.from_numpy(y[idx]))


def test_set() -> tuple[tuple[np.ndarray, np.ndarray], np.ndarray]:
    *_, num, cat, y = _arrays()
    return (num, cat), y


def score(model: nn.Module, x: tuple[np.ndarray, np.ndarray], y: np.ndarray) -> float:
    """Accuracy of ``model(x_num, x_cat)``."""
    with torch.no_grad():
        pred = model(torch.from_numpy(x[0]), torch.from_numpy(x[1])).argmax(1).numpy()
    return float((pred == y).mean())


def local_train(model: nn.Module, data: TensorDataset) -> int:
    """One epoch of Adam (lr 0.01, batch 32) on cross-entropy; the examples seen."""
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    for x_num, x_cat, yb in DataLoader(data, batch_size=32, shuffle=True,
                                       generator=torch.Generator().manual_seed(0)):
        opt.zero_grad()
        loss_fn(model(x_num, x_cat), yb).backward()
        opt.step()
    return len(data)
