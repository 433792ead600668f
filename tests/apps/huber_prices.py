"""A user's app: house prices ($k) with heavy-tailed noise, Huber loss, targets a (n, 1) column.

Synthetic, seeded: 8,000 sales; columns as recorded: living area (sq ft, 500-4500),
bedrooms (1-6), year built (1900-2020), lot size (acres, 0.05-2), distance to centre (km,
0-40). Price in thousands of dollars = a smooth function + Student-t (df 1.5) noise of
scale 25 (typos, distressed sales, luxury outliers). The user keeps y as a column
(df[["price"]].to_numpy(), shape (n, 1)) and the model outputs (n, 1). 5 nodes round robin
over 6,500 rows; 1,500 test. Loss: nn.HuberLoss(delta=25). FedAvg: Adam lr 0.01,
2 epochs, batch 32. Metric: mean absolute error in $k against the test prices.

DQ sent such targets as ``(n,)``; the user's ``HuberLoss`` broadcast them against the
model's ``(n, 1)`` to ``(n, n)`` and DQ learned the batch's centre (MAE 195.7, FedAvg
76.4); a float target of one value a row is now shaped as the outputs
(``dq_flower.losses.as_outputs``).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

NAME = "huber-prices"
NUM_NODES = 5
ROUNDS = 10
METRIC = "mae-k$"
LOWER_IS_BETTER = True
TOLERANCE = 0.2
_CACHE: dict = {}


def available() -> bool:
    return True


def _arrays():
    if "a" not in _CACHE:
        rng = np.random.default_rng(2)
        n = 8000
        area = rng.uniform(500, 4500, n)
        beds = np.clip(np.round(area / 800 + rng.normal(0, 0.7, n)), 1, 6)
        year = rng.integers(1900, 2021, n).astype(float)
        lot = rng.uniform(0.05, 2.0, n)
        dist = rng.uniform(0, 40, n)
        clean = (60 + 0.15 * area + 8 * beds + 0.8 * (year - 1900) + 40 * np.sqrt(lot)
                 - 4 * dist)
        y = clean + 25 * rng.standard_t(1.5, n)
        x = np.stack([area, beds, year, lot, dist], 1).astype(np.float32)
        y = y.astype(np.float32)[:, None]
        _CACHE["a"] = (x[:6500], y[:6500], x[6500:], y[6500:], clean[6500:])
    return _CACHE["a"]


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(5, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU(),
                                  nn.Linear(32, 1))

    def forward(self, x):
        return self.body(x)          # (n, 1)


def user_loss():
    return nn.HuberLoss(delta=25.0)


DQ_LOSS_FN = user_loss


def load_local_data(pid):
    x, y, *_ = _arrays()
    idx = np.arange(pid, len(y), NUM_NODES)
    return TensorDataset(torch.from_numpy(x[idx]), torch.from_numpy(y[idx]))


def test_set():
    _, _, x, y, _ = _arrays()
    return x, y


def chance_score() -> float:
    """The test MAE of always predicting the training prices' mean."""
    _, y_train, _, y_test, _ = _arrays()
    return float(np.mean(np.abs(y_test - y_train.mean())))


def score(model, x, y):
    with torch.no_grad():
        pred = model(torch.as_tensor(x)).reshape(-1).numpy()
    return float(np.mean(np.abs(pred - np.asarray(y).reshape(-1))))


def local_train(model, data):
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    loss_fn = user_loss()
    model.train()
    for _ in range(2):
        for xb, yb in DataLoader(data, batch_size=32, shuffle=True,
                                 generator=torch.Generator().manual_seed(0)):
            opt.zero_grad()
            loss_fn(model(xb), yb).backward()
            opt.step()
    return len(data)
