"""A user's app: long 1-D signals, a waveform's shape from 1,000 raw readings.

Sine, square or sawtooth waves (3 classes) in raw units (amplitude 0.5..5, DC offset
-2..2, Gaussian noise 0.3 x amplitude, 3..15 cycles a window), seeded; samples ``(1, 1000)``
float32 as numpy ``(x, y)``; a small conv net of 2,339 weights, so one sample is about as
large as the model and DQ's uplink cannot be far below FedAvg's (``UPLINK_SHARE``). 4 IID
nodes of 600, 5 rounds. FedAvg: Adam lr 3e-3, 1 epoch, batch 32.

The model makes no held-out error from round 1; DQ's schedule asked the largest growth
every round all the same (no error left made its power law undefined) until every row was
in: 333,643 B of uplink against FedAvg's 216,140 B. Without held-out error it now asks the
least growth (``dq_flower.dq.server.schedule.AdaptiveSchedule``).
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

NAME = "long-waves"
NUM_NODES = 4
ROUNDS = 5
LEN = 1000
#: DQ's uplink may be this share of FedAvg's: one sample weighs 1,000 values, the model 2,339.
UPLINK_SHARE = 0.6


def available() -> bool:
    return True


def _make(n, seed):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    t = np.arange(LEN) / LEN
    cyc = rng.uniform(3, 15, (n, 1))
    ph = rng.uniform(0, 1, (n, 1))
    amp = rng.uniform(0.5, 5, (n, 1))
    off = rng.uniform(-2, 2, (n, 1))
    u = (cyc * t[None] + ph) % 1.0
    sine = np.sin(2 * np.pi * u)
    square = np.where(u < 0.5, 1.0, -1.0)
    saw = 2 * u - 1
    wave = np.choose(y[:, None], [sine, square, saw])
    x = off + amp * (wave + 0.3 * rng.standard_normal((n, LEN)))
    return x[:, None, :].astype(np.float32), y.astype(np.int64)


_TRAIN = _make(NUM_NODES * 600, 1)
_TEST = _make(1500, 2)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.c1 = nn.Conv1d(1, 8, 9, stride=2, padding=4)
        self.c2 = nn.Conv1d(8, 16, 7, padding=3)
        self.c3 = nn.Conv1d(16, 16, 5, padding=2)
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        x = nn.functional.max_pool1d(torch.relu(self.c1(x)), 4)
        x = nn.functional.max_pool1d(torch.relu(self.c2(x)), 4)
        x = torch.relu(self.c3(x)).mean(-1)
        return self.head(x)


def load_local_data(partition_id: int):
    x, y = _TRAIN
    return x[partition_id::NUM_NODES], y[partition_id::NUM_NODES]


def test_set():
    return _TEST


def local_train(model: nn.Module, data) -> int:
    x, y = data
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    order = np.random.default_rng(0).permutation(len(y))
    model.train()
    for s in range(0, len(y), 32):
        i = order[s:s + 32]
        opt.zero_grad()
        out = model(torch.from_numpy(x[i]))
        nn.functional.cross_entropy(out, torch.from_numpy(y[i])).backward()
        opt.step()
    return len(y)
