"""A user's app: a table with label-encoded categorical columns read by embeddings, 6 rounds.

The user's rows (synthetic, seeded: 6,000 people) hold three categorical columns as
label-encoded codes (8, 5 and 12 categories, stored as floats beside the numbers, as a
pandas frame's ``to_numpy()`` gives them) and four numeric columns as measured (age about
40, income about 50,000, hours 0 to 60, a score about 0): the label is a noisy logistic
function of the categories, the age and the score. The model reads each categorical
column with its own ``nn.Embedding`` (``x[:, :3].long()``: PyTorch's usual entity
embeddings), normalises the numbers with ``BatchNorm1d`` and ends in an MLP. Five nodes
take the first 5,000 rows round robin as ``TensorDataset``s; the last 1,000 test. FedAvg
trains one epoch per round with Adam (lr 0.01, batch 32).

Its model (718 weights) is small beside its data (5,000 rows of 7 columns): FedAvg's 30
uploads weigh about as much as all the rows at 4 bits, so this app allows DQ 0.3 of
FedAvg's uplink (``UPLINK_SHARE``) instead of the zoo's fifth.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

NAME = "tab-embeddings"
NUM_NODES = 5
ROUNDS = 6
#: DQ's uplink may be at most this share of FedAvg's (see the module docstring).
UPLINK_SHARE = 0.3
#: Categories of each label-encoded column.
CARDINALITIES = (8, 5, 12)
SEED = 0
_CACHE: dict = {}


def available() -> bool:
    return True


def _arrays() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    if "arrays" not in _CACHE:
        rng = np.random.default_rng(SEED)
        n = 6000
        codes = np.stack([rng.integers(0, c, n) for c in CARDINALITIES], 1)
        numbers = np.stack([rng.normal(40, 12, n), rng.normal(50_000, 20_000, n),
                            rng.uniform(0, 60, n), rng.normal(0, 1, n)], 1)
        effects = [rng.normal(0, 1.5, c) for c in CARDINALITIES]
        logit = (sum(effects[i][codes[:, i]] for i in range(len(CARDINALITIES)))
                 + 0.03 * (numbers[:, 0] - 40) + 0.5 * numbers[:, 3])
        y = (logit + rng.logistic(size=n) > 0).astype(np.int64)
        x = np.concatenate([codes, numbers], 1).astype(np.float32)
        _CACHE["arrays"] = (x[:5000], x[5000:], y[:5000], y[5000:])
    return _CACHE["arrays"]


class Net(nn.Module):
    """An embedding of 4 per categorical column, BatchNorm on the numbers, MLP 16-32-2."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embeddings = nn.ModuleList([nn.Embedding(c, 4) for c in CARDINALITIES])
        self.numbers = nn.BatchNorm1d(4)
        self.mlp = nn.Sequential(nn.Linear(4 * len(CARDINALITIES) + 4, 32), nn.ReLU(),
                                 nn.Linear(32, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        codes = x[:, :3].long()
        embedded = [e(codes[:, i]) for i, e in enumerate(self.embeddings)]
        return self.mlp(torch.cat([*embedded, self.numbers(x[:, 3:])], 1))


def load_local_data(partition_id: int) -> TensorDataset:
    x_train, _, y_train, _ = _arrays()
    idx = np.arange(partition_id, len(y_train), NUM_NODES)
    return TensorDataset(torch.from_numpy(x_train[idx]), torch.from_numpy(y_train[idx]))


def test_set() -> tuple[np.ndarray, np.ndarray]:
    _, x_test, _, y_test = _arrays()
    return x_test, y_test


def score(model: nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    """Accuracy, in eval mode (BatchNorm's running statistics)."""
    model.eval()
    with torch.no_grad():
        return float((model(torch.as_tensor(x)).argmax(1).numpy() == y).mean())


def local_train(model: nn.Module, data: TensorDataset) -> int:
    """One epoch of Adam (lr 0.01, batch 32) on the cross-entropy; the examples seen."""
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    loader = DataLoader(data, batch_size=32, shuffle=True, drop_last=True,
                        generator=torch.Generator().manual_seed(0))
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    for x, y in loader:
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
    return len(data)
