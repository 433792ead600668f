"""A user's app: three float targets a row on scales about 1, 100 and 10,000 (a rate, a count
and a price), MSE on the raw targets.

Synthetic, seeded: 5,000 rows of 8 standardised features; each target is a linear function
plus a sine of one feature and noise, times its scale, plus an offset (0, 500, 200,000).
6 nodes round robin over 4,200 rows; 800 test. Model 8-32-3. FedAvg: Adam lr 0.01, 5
epochs, batch 32. Metric: the mean over targets of the mean absolute error in the target's
spreads (lower is better). ``tests/dq/test_output_scale.py`` runs it; it is not in the zoo
(FedAvg's Adam does not bring the price up from 0 in six rounds: 2.68).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

NAME = "multiscale-targets"
NUM_NODES = 6
ROUNDS = 6
METRIC = "nmae"
LOWER_IS_BETTER = True
TOLERANCE = 0.1
SCALES, OFFSETS = np.array([1.0, 100.0, 10000.0]), np.array([0.0, 500.0, 200000.0])
_CACHE: dict = {}


def available() -> bool:
    return True


def _data() -> dict:
    if not _CACHE:
        rng = np.random.default_rng(0)
        x = rng.normal(0, 1, (5000, 8)).astype(np.float32)
        w = rng.normal(0, 1, (8, 3))
        z = x @ w + 0.5 * np.sin(x[:, :3] * 2) + rng.normal(0, 0.2, (5000, 3))
        _CACHE.update(x=x, y=(z * SCALES + OFFSETS).astype(np.float32))
    return _CACHE


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))

    def forward(self, x):
        return self.body(x)


def load_local_data(partition_id: int):
    d = _data()
    return d["x"][partition_id:4200:NUM_NODES], d["y"][partition_id:4200:NUM_NODES]


def test_set():
    d = _data()
    return d["x"][4200:], d["y"][4200:]


def column_errors(model, x, y) -> np.ndarray:
    """Each target's mean absolute error in its spreads."""
    with torch.no_grad():
        p = model(torch.from_numpy(x)).numpy()
    return np.abs(p - y).mean(0) / y.std(0)


def score(model, x, y) -> float:
    return float(column_errors(model, x, y).mean())


def local_train(model, data):
    x, y = (torch.from_numpy(a) for a in data)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(0)
    for _ in range(5):
        order = torch.randperm(len(x), generator=g)
        for i in range(0, len(x), 32):
            b = order[i:i + 32]
            opt.zero_grad()
            nn.functional.mse_loss(model(x[b]), y[b]).backward()
            opt.step()
    return len(x)
