"""Segmentation: 1x16x16 noisy images of a square and a disc; the target is a 16x16 mask of
class ids (0 background, 1 square, 2 disc), a label a pixel. A small fully convolutional net,
per-pixel cross-entropy. 4 nodes. Metric: the mean recall of the shapes' pixels (classes 1, 2).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

NAME, NUM_NODES, ROUNDS = "segment-masks", 4, 3
METRIC = "shape-recall"
TRAIN, TEST = 1200, 400
_CACHE: dict[str, np.ndarray] = {}


def _data() -> dict[str, np.ndarray]:
    if not _CACHE:
        rng = np.random.default_rng(0)
        n = TRAIN + TEST
        yy, xx = np.mgrid[:16, :16]
        images = rng.normal(0, 0.3, (n, 1, 16, 16)).astype(np.float32)
        masks = np.zeros((n, 16, 16), dtype=np.int64)
        for i in range(n):
            a, b = rng.integers(1, 10, 2)
            side = rng.integers(3, 6)
            masks[i, a:a + side, b:b + side] = 1
            c, d = rng.integers(3, 13, 2)
            masks[i][(yy - c) ** 2 + (xx - d) ** 2 <= rng.uniform(1.5, 3) ** 2] = 2
            images[i, 0][masks[i] > 0] += 1.0
        _CACHE.update(x=images, y=masks)
    return _CACHE


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
                                 nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                                 nn.Conv2d(16, 3, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def load_local_data(k: int) -> tuple[np.ndarray, np.ndarray]:
    d = _data()
    return d["x"][k:TRAIN:NUM_NODES], d["y"][k:TRAIN:NUM_NODES]


def test_set() -> tuple[np.ndarray, np.ndarray]:
    d = _data()
    return d["x"][TRAIN:], d["y"][TRAIN:]


def score(model: nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    model.eval()
    with torch.no_grad():
        p = model(torch.from_numpy(x)).argmax(1).numpy()
    return float(np.mean([np.mean(p[y == c] == c) for c in (1, 2)]))


def local_train(model: nn.Module, data: tuple[np.ndarray, np.ndarray]) -> int:
    x, y = (torch.from_numpy(a) for a in data)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(2):
        for i in range(0, len(x), 32):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x[i:i + 32]), y[i:i + 32]).backward()
            opt.step()
    return len(x)
