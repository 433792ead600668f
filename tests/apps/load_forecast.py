"""A user's app: next-hour electricity load from the last 24 hours, sites of unequal size.

Each of six nodes is one site metering its hourly load in kW; the sites range from 40 kW
to 4,000 kW (a synthetic year's first 12 weeks per site: a daily cycle, quieter weekends,
5% noise, seeded by the site). The user cuts sliding windows as forecasting code usually
does: the last 24 hours as metered (kW, unscaled) are a sample, the next hour (kW) its
target, served as a ``TensorDataset``; weeks 1-10 train, weeks 11-12 of every site test.
The model is an MLP; FedAvg trains one epoch per round with Adam (lr 1e-3, batch 32) on
the mean squared error. Scored by the mean absolute percentage error on the test weeks
(lower is better), which weighs the small sites as much as the large ones.

Its model is small (1,665 weights) beside its data (about 10,000 windows): FedAvg's 36
uploads weigh about as much as a quarter of the windows at 4 bits, so this app allows DQ
half of FedAvg's uplink (``UPLINK_SHARE``) instead of the zoo's fifth.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

NAME = "load-forecast"
NUM_NODES = 6
ROUNDS = 6
METRIC = "mape"
LOWER_IS_BETTER = True
#: DQ's final error may be at most this much above FedAvg's, relatively.
TOLERANCE = 0.10
#: DQ's uplink may be at most this share of FedAvg's (see the module docstring).
UPLINK_SHARE = 0.5
#: Each site's mean load in kW.
SITE_KW = (40, 120, 300, 800, 1500, 4000)
WEEKS, TRAIN_WEEKS, HISTORY = 12, 10, 24
_CACHE: dict = {}


def available() -> bool:
    return True


def _site_load(site: int) -> np.ndarray:
    """The site's hourly load in kW over :data:`WEEKS` weeks."""
    rng = np.random.default_rng(site)
    hour = np.arange(WEEKS * 7 * 24)
    daily = 1 + 0.4 * np.sin(2 * np.pi * (hour % 24 - 8) / 24)
    weekly = np.where((hour // 24) % 7 >= 5, 0.7, 1.0)
    noise = 1 + 0.05 * rng.standard_normal(hour.size)
    return (SITE_KW[site] * daily * weekly * noise).astype(np.float32)


def _windows(load: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every 24 hours of ``load`` and the hour after them."""
    idx = np.arange(load.size - HISTORY)[:, None] + np.arange(HISTORY)
    return load[idx], load[HISTORY:]


def _sites() -> dict:
    if not _CACHE:
        cut = TRAIN_WEEKS * 7 * 24
        loads = [_site_load(s) for s in range(NUM_NODES)]
        _CACHE["train"] = [_windows(load[:cut]) for load in loads]
        test = [_windows(load[cut - HISTORY:]) for load in loads]
        _CACHE["test"] = (np.concatenate([x for x, _ in test]),
                          np.concatenate([y for _, y in test]))
    return _CACHE


class Net(nn.Module):
    """24 -> 64 -> 1, ReLU: the next hour's load in kW."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(HISTORY, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x).squeeze(-1)


def load_local_data(partition_id: int) -> TensorDataset:
    x, y = _sites()["train"][partition_id]
    return TensorDataset(torch.from_numpy(x), torch.from_numpy(y))


def test_set() -> tuple[np.ndarray, np.ndarray]:
    return _sites()["test"]


def score(model: nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    """Mean absolute percentage error of the forecasts."""
    with torch.no_grad():
        pred = model(torch.as_tensor(x)).numpy()
    return float(np.mean(np.abs(pred - y) / np.abs(y)))


def chance_score() -> float:
    """The error of always forecasting the training windows' mean load."""
    mean = float(np.mean(np.concatenate([y for _, y in _sites()["train"]])))
    _, y = test_set()
    return float(np.mean(np.abs(mean - y) / np.abs(y)))


def local_train(model: nn.Module, data: TensorDataset) -> int:
    """One epoch of Adam (lr 1e-3, batch 32) on the squared error; the examples seen."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loader = DataLoader(data, batch_size=32, shuffle=True,
                        generator=torch.Generator().manual_seed(0))
    loss_fn = nn.MSELoss()
    model.train()
    for x, y in loader:
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
    return len(data)
