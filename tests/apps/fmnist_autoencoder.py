"""A user's app: a convolutional autoencoder on Fashion-MNIST, ``TensorDataset(x, x)``.

The first 2,000 training images (pixels scaled to 0..1) round robin over 4 nodes, each a
``TensorDataset(x, x)``: the images are their own targets. The model encodes with two
strided convolutions (8 and 16 channels, 7x7 at the bottleneck) and decodes with two
transposed ones ending in a sigmoid; the app scores the mean squared error of the
reconstructions of the first 500 test images. FedAvg: 5 epochs of Adam (lr 1e-3,
batch 32) a round.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tests.apps.fmnist_cnn import _images, available  # noqa: F401 - the same IDX files

NAME = "fmnist-autoencoder"
NUM_NODES = 4
ROUNDS = 3
TRAIN_ROWS = 2000
TEST_ROWS = 500
METRIC = "mse"
LOWER_IS_BETTER = True
#: DQ's MSE may be this much above FedAvg's (the zoo's other regressions allow the same).
TOLERANCE = 0.10
#: DQ's uplink may be half FedAvg's, not a fifth: the model (3,433 weights) weighs less
#: than a few of its 784-pixel images, so one update is small beside the rows it learns from.
UPLINK_SHARE = 0.5
_CACHE: dict = {}


def _train() -> np.ndarray:
    if "train" not in _CACHE:
        _CACHE["train"] = _images("train", TRAIN_ROWS)[0]
    return _CACHE["train"]


class Net(nn.Module):
    """Conv 8 and 16 (stride 2), transposed conv 8 and 1 (stride 2), a sigmoid."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.encode = nn.Sequential(nn.Conv2d(1, 8, 3, 2, 1), nn.ReLU(),
                                    nn.Conv2d(8, 16, 3, 2, 1), nn.ReLU())
        self.decode = nn.Sequential(nn.ConvTranspose2d(16, 8, 4, 2, 1), nn.ReLU(),
                                    nn.ConvTranspose2d(8, 1, 4, 2, 1), nn.Sigmoid())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decode(self.encode(x))


def load_local_data(partition_id: int) -> TensorDataset:
    x = torch.from_numpy(_train()[partition_id::NUM_NODES])
    return TensorDataset(x, x)


def test_set() -> tuple[np.ndarray, np.ndarray]:
    x = _images("t10k", TEST_ROWS)[0]
    return x, x


def score(model: nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    """The reconstructions' mean squared error."""
    with torch.no_grad():
        return float(((model(torch.as_tensor(x)) - torch.as_tensor(y)) ** 2).mean())


def chance_score() -> float:
    """The error of answering every image with the training images' mean image."""
    x, _ = test_set()
    return float(((x - _train().mean(0)) ** 2).mean())


def local_train(model: nn.Module, data: TensorDataset) -> int:
    """5 epochs of Adam (lr 1e-3, batch 32) on the squared error; the examples seen."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model.train()
    loader = DataLoader(data, batch_size=32, shuffle=True,
                        generator=torch.Generator().manual_seed(0))
    for _ in range(5):
        for x, y in loader:
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    return len(data)
