"""A user's app: 3x48x48 colour images of six textures, a small CNN (14,534 weights).

The user's images (synthetic, seeded: 3,600 of oriented stripes of six frequencies and two
colourings under heavy pixel noise) are split 3,000 / 600; five nodes take the training
images round robin as ``TensorDataset``s. The CNN (three 3x3 convolutions, global average
pooling, one linear layer) is small beside an image: D/d = 2.1. FedAvg trains one epoch per
round with Adam (lr 0.003, batch 32).

Not one of the zoo's apps: with D/d near 2 a row costs about a thirty-fifth of a model
upload at DQ's 2 bits, DQ's schedule asks for every image (its held-out rows are all right
from round 1, too few to show a flat curve), and DQ sends more than FedAvg (see the
user-app page's table of apps where DQ does not win).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

NAME = "texture-images"
NUM_NODES = 5
ROUNDS = 5
SEED = 5
_CACHE: dict = {}


def available() -> bool:
    return True


def _arrays() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    if "arrays" not in _CACHE:
        rng = np.random.default_rng(SEED)
        n = 3600
        y = rng.integers(0, 6, n)
        yy, xx = np.mgrid[0:48, 0:48] / 48.0
        images = np.empty((n, 3, 48, 48), np.float32)
        for i in range(n):
            angle = (y[i] % 3) * 0.9 + rng.normal(0, 0.1)
            stripes = np.sin(2 * np.pi * (2 + y[i]) * (xx * np.cos(angle) + yy * np.sin(angle))
                             + rng.uniform(0, 6.28))
            colour = np.array([1.0, 0.6, 0.3]) if y[i] < 3 else np.array([0.3, 0.6, 1.0])
            images[i] = colour[:, None, None] * stripes + rng.normal(0, 0.8, (3, 48, 48))
        _CACHE["arrays"] = (images[:3000], y[:3000], images[3000:], y[3000:])
    return _CACHE["arrays"]


class Net(nn.Module):
    """Conv 3-16-32-32 (3x3, ReLU, two max-pools), global average pooling, linear 32 -> 6."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
            nn.Linear(32, 6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def load_local_data(partition_id: int) -> TensorDataset:
    x, y, _, _ = _arrays()
    idx = np.arange(partition_id, len(y), NUM_NODES)
    return TensorDataset(torch.from_numpy(x[idx]), torch.from_numpy(y[idx]))


def test_set() -> tuple[np.ndarray, np.ndarray]:
    _, _, x, y = _arrays()
    return x, y


def local_train(model: nn.Module, data: TensorDataset) -> int:
    """One epoch of Adam (lr 0.003, batch 32) on cross-entropy; the examples seen."""
    opt = torch.optim.Adam(model.parameters(), lr=0.003)
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    for xb, yb in DataLoader(data, batch_size=32, shuffle=True,
                             generator=torch.Generator().manual_seed(0)):
        opt.zero_grad()
        loss_fn(model(xb), yb).backward()
        opt.step()
    return len(data)
