"""A user's app: an MLP on Fashion-MNIST over 50 small nodes, 5 of them train each round.

The first 5,000 training rows as a Hugging Face ``datasets.Dataset`` of flat pixel rows
(784 floats in 0..1) and labels, split into 50 shards of 100 rows by flwr-datasets'
``IidPartitioner`` (phones, each with a few labelled photos); each node serves its shard
with ``with_format("torch")`` as ``{"image": tensor(784), "label": tensor()}`` dict
samples. ``FRACTION_TRAIN = 0.1``: the strategy samples 5 of the 50 nodes each round, for
15 rounds. The test set is the first 1,000 test rows. FedAvg trains one epoch per round
with SGD (lr 0.05, momentum 0.9, batch 32).
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader

NAME = "many-small"
NUM_NODES = 50
ROUNDS = 15
FRACTION_TRAIN = 0.1
TRAIN_ROWS = 5000
TEST_ROWS = 1000
DATA_DIR = Path(os.environ.get("FMNIST_DIR", "/usr/share/datasets/fashion-mnist"))
_CACHE: dict = {}


def available() -> bool:
    try:
        import datasets  # noqa: F401
        import flwr_datasets  # noqa: F401
    except ImportError:
        return False
    return all((DATA_DIR / f"{p}-{k}-idx{d}-ubyte.gz").exists()
               for p in ("train", "t10k") for k, d in (("images", 3), ("labels", 1)))


def _images(prefix: str, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """The first ``rows`` images (flat, 0..1) and labels of the IDX files ``prefix``."""
    with gzip.open(DATA_DIR / f"{prefix}-images-idx3-ubyte.gz") as f:
        x = np.frombuffer(f.read(), np.uint8, rows * 784, 16).reshape(rows, 784)
    with gzip.open(DATA_DIR / f"{prefix}-labels-idx1-ubyte.gz") as f:
        y = np.frombuffer(f.read(), np.uint8, rows, 8)
    return x.astype(np.float32) / 255.0, y.astype(np.int64)


def _partitioner():
    if "partitioner" not in _CACHE:
        from datasets import Dataset
        from datasets.utils.logging import disable_progress_bar
        from flwr_datasets.partitioner import IidPartitioner

        disable_progress_bar()
        x, y = _images("train", TRAIN_ROWS)
        partitioner = IidPartitioner(num_partitions=NUM_NODES)
        partitioner.dataset = Dataset.from_dict({"image": x, "label": y})
        _CACHE["partitioner"] = partitioner
    return _CACHE["partitioner"]


class Net(nn.Module):
    """784 -> 64 -> 10, ReLU."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = nn.Linear(784, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


def load_local_data(partition_id: int):
    """The node's 100 rows as a ``datasets.Dataset`` of torch dict samples."""
    return _partitioner().load_partition(partition_id).with_format("torch")


def test_set() -> tuple[np.ndarray, np.ndarray]:
    if "test" not in _CACHE:
        _CACHE["test"] = _images("t10k", TEST_ROWS)
    return _CACHE["test"]


def local_train(model: nn.Module, data) -> int:
    """One epoch of SGD (lr 0.05, momentum 0.9, batch 32); returns the examples seen."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loader = DataLoader(data, batch_size=32, shuffle=True,
                        generator=torch.Generator().manual_seed(0))
    model.train()
    for batch in loader:
        opt.zero_grad()
        nn.functional.cross_entropy(model(batch["image"]), batch["label"]).backward()
        opt.step()
    return len(data)
