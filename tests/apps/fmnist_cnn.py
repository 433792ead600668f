"""A user's app: a small CNN on Fashion-MNIST dict samples, 5 IID nodes, 6 rounds.

The first 5,000 training rows split round-robin over 5 nodes, each served as
``{"image": tensor(1, 28, 28), "label": int}`` (the shape flwr-datasets gives after a
``ToTensor`` transform); the test set is the first 1,000 test rows. FedAvg trains one
epoch per round with SGD (lr 0.05, momentum 0.9, batch 32).
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

NAME = "fmnist-cnn"
NUM_NODES = 5
ROUNDS = 6
TRAIN_ROWS = 5000
TEST_ROWS = 1000
DATA_DIR = Path(os.environ.get("FMNIST_DIR", "/usr/share/datasets/fashion-mnist"))


def available() -> bool:
    return (DATA_DIR / "train-images-idx3-ubyte.gz").exists()


def _idx(name: str, offset: int, rows: int, size: int) -> np.ndarray:
    with gzip.open(DATA_DIR / name) as f:
        raw = f.read()
    return np.frombuffer(raw, np.uint8, rows * size, offset)


def _images(prefix: str, rows: int) -> tuple[np.ndarray, np.ndarray]:
    x = _idx(f"{prefix}-images-idx3-ubyte.gz", 16, rows, 784).reshape(rows, 1, 28, 28)
    y = _idx(f"{prefix}-labels-idx1-ubyte.gz", 8, rows, 1)
    return x.astype(np.float32) / 255.0, y.astype(np.int64)


class Net(nn.Module):
    """conv 8 -> pool -> conv 16 -> pool -> fc 64 -> fc 10."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.fc1 = nn.Linear(16 * 7 * 7, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


class DictImages(Dataset):
    """The device's rows as ``{"image": tensor, "label": int}`` items."""

    input_key = "image"  # the item's key of the sample

    def __init__(self, x: np.ndarray, y: np.ndarray) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> dict:
        return {self.input_key: torch.from_numpy(self.x[i]), "label": int(self.y[i])}


def load_local_data(partition_id: int) -> DictImages:
    x, y = _images("train", TRAIN_ROWS)
    return DictImages(x[partition_id::NUM_NODES], y[partition_id::NUM_NODES])


def test_set() -> tuple[np.ndarray, np.ndarray]:
    return _images("t10k", TEST_ROWS)


def local_train(model: nn.Module, data: DictImages) -> int:
    """One epoch of SGD (lr 0.05, momentum 0.9, batch 32); returns the examples seen."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loader = DataLoader(data, batch_size=32, shuffle=True,
                        generator=torch.Generator().manual_seed(0))
    model.train()
    for batch in loader:
        opt.zero_grad()
        nn.functional.cross_entropy(model(batch[data.input_key]), batch["label"]).backward()
        opt.step()
    return len(data)
