"""A user's app: an MLP on scikit-learn's digits, label-skewed over 5 nodes, 10 rounds.

The user holds the digits (8x8, 1,797 rows, pixels 0..16 scaled to 0..1) as a Hugging
Face ``datasets.Dataset`` and splits it as Flower's quickstarts do: a seeded 80/20
train/test split, then flwr-datasets' ``DirichletPartitioner`` over the training rows by
label (alpha 0.3, seeded: each node holds a few digits mostly, some hardly or not at all,
and 185 to 409 rows). Each node serves its rows through ``with_transform`` as
``{"features": tensor(64), "label": int}`` dict samples.
FedAvg trains one epoch per round with SGD (lr 0.05, momentum 0.9, batch 32).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader

NAME = "digits-skew-mlp"
NUM_NODES = 5
ROUNDS = 10
ALPHA = 0.3
SEED = 0
_CACHE: dict = {}


def available() -> bool:
    try:
        import datasets  # noqa: F401
        import flwr_datasets  # noqa: F401
        import sklearn  # noqa: F401
    except ImportError:
        return False
    return True


def _split():
    """The seeded 80/20 split of the digits: ``(train Dataset, test x, test y)``."""
    if "split" not in _CACHE:
        from datasets import Dataset
        from datasets.utils.logging import disable_progress_bar
        from sklearn.datasets import load_digits

        disable_progress_bar()
        x, y = load_digits(return_X_y=True)
        ds = Dataset.from_dict({"features": (x / 16.0).astype(np.float32),
                                "label": y.astype(np.int64)})
        parts = ds.train_test_split(test_size=0.2, seed=SEED)
        test = parts["test"].with_format("numpy")[:]
        _CACHE["split"] = (parts["train"], test["features"].astype(np.float32),
                           test["label"].astype(np.int64))
    return _CACHE["split"]


def _partitioner():
    if "partitioner" not in _CACHE:
        from flwr_datasets.partitioner import DirichletPartitioner

        partitioner = DirichletPartitioner(num_partitions=NUM_NODES, partition_by="label",
                                           alpha=ALPHA, min_partition_size=50, seed=SEED)
        partitioner.dataset = _split()[0]
        _CACHE["partitioner"] = partitioner
    return _CACHE["partitioner"]


def apply_transforms(batch: dict) -> dict:
    """The quickstart's transform: the rows' lists become tensors."""
    batch["features"] = [torch.tensor(v, dtype=torch.float32) for v in batch["features"]]
    return batch


class Net(nn.Module):
    """64 -> 64 -> 10, ReLU."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = nn.Linear(64, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


def load_local_data(partition_id: int):
    """The node's label-skewed rows as a ``datasets.Dataset`` of dict samples."""
    return _partitioner().load_partition(partition_id).with_transform(apply_transforms)


def test_set() -> tuple[np.ndarray, np.ndarray]:
    _, xt, yt = _split()
    return xt, yt


def local_train(model: nn.Module, data) -> int:
    """One epoch of SGD (lr 0.05, momentum 0.9, batch 32); returns the examples seen."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loader = DataLoader(data, batch_size=32, shuffle=True,
                        generator=torch.Generator().manual_seed(0))
    model.train()
    for batch in loader:
        opt.zero_grad()
        nn.functional.cross_entropy(model(batch["features"]), batch["label"]).backward()
        opt.step()
    return len(data)
