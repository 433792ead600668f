"""A user's app: ten nodes of one digit each, and a new node with no rows yet.

scikit-learn's first 1,400 digits (8x8 pixels 0..16, the model scaling them itself): node
``k`` holds the digit ``k`` only (about 140 rows, a federation split by label as far as it
goes); an eleventh node has no rows, and the user's own ``DataLoader(..., shuffle=True)``
refuses an empty data set there, so it fails every round for either strategy. FedAvg trains
one epoch per round with SGD (lr 0.05, momentum 0.9, batch 32); the last 397 digits test.

Not one of the zoo's apps: it shows the server train no phase on a round whose rows add
less than 1% to its store (``tests/apps/test_one_class_nodes.py``).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tests.apps import sample_weights
from tests.apps.sample_weights import digits

NAME = "one-class-nodes"
NUM_NODES = 11
ROUNDS = 6


def available() -> bool:
    return True


class Net(sample_weights.Net):
    """64 -> 64 -> 10, ReLU, on the pixels over 16."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x / 16)


def load_local_data(partition_id: int) -> DataLoader:
    x, y = (a[:1400] for a in digits())
    mine = y == partition_id  # the eleventh node (id 10): none
    return DataLoader(TensorDataset(torch.from_numpy(x[mine]), torch.from_numpy(y[mine])),
                      batch_size=32, shuffle=True,
                      generator=torch.Generator().manual_seed(partition_id))


def test_set() -> tuple[np.ndarray, np.ndarray]:
    x, y = digits()
    return x[1400:], y[1400:]


def local_train(model: nn.Module, loader: DataLoader) -> int:
    """One epoch of SGD (lr 0.05, momentum 0.9); returns the examples seen."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model.train()
    seen = 0
    for x, y in loader:
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        seen += len(y)
    return seen
