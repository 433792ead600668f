"""Five regression nodes on a synthetic task, split by region, replies through the wire.

``y = sin(3 x0) + x1^2 - x2`` on 8 uniform features, plus ``sin(12 x3)`` and three times the
noise (std 0.45 against 0.15) where ``x0 > 0.8``: split by ``x0``, the last node holds the
harder, noisier region. Test MSE is against the noiseless function on 2,000 fresh points.
The nodes run the package's own client (:func:`tests.faults.digits_attack.honest`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, Message
from torch import nn

import dq_flower
from dq_flower.harness.inprocess import InProcessGrid

from .digits_attack import honest, wire

DIM, NODES = 8, 5


def make(n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(x, noisy y, noiseless y)`` of ``n`` points."""
    rng = np.random.default_rng(seed)
    x = rng.random((n, DIM)).astype(np.float32)
    hard = x[:, 0] > 0.8
    f = np.sin(3 * x[:, 0]) + x[:, 1] ** 2 - x[:, 2] + np.where(hard, np.sin(12 * x[:, 3]), 0)
    noise = rng.normal(0, 1, n) * np.where(hard, 0.45, 0.15)
    return x, (f + noise).astype(np.float32), f.astype(np.float32)


X, Y, _ = make(2500, 0)
X_TEST, _, F_TEST = make(2000, 1)


class Net(nn.Module):
    """A small MLP with one float output."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(DIM, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                                  nn.Linear(64, 1))

    def forward(self, x):
        return self.body(x).squeeze(-1)


def by_region() -> list[np.ndarray]:
    """Rows by ``x0``: node 4 holds ``x0 > 0.8``, the harder and noisier region."""
    return np.array_split(np.argsort(X[:, 0]), NODES)


def at_random(seed: int = 0) -> list[np.ndarray]:
    """Rows shuffled and dealt out: every node holds every region."""
    return np.array_split(np.random.default_rng(seed).permutation(len(X)), NODES)


def run(parts: list[np.ndarray], rounds: int = 6, seed: int = 0,
        attack: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
        **knobs: Any) -> tuple[float, dq_flower.DQStrategy]:
    """Test MSE and the strategy of one run; ``attack(x, y) -> y``: node 0's targets."""

    def app(msg: Message, context) -> Message:
        k = int(context.node_config["partition-id"])
        x, y = X[parts[k]], Y[parts[k]]
        if attack is not None and k == 0:
            y = attack(x, y).astype(np.float32)
        return Message(wire(honest(msg, context, (x, y))), reply_to=msg)

    torch.manual_seed(seed)
    model = Net()
    strategy = dq_flower.DQStrategy(model, seed=seed, **knobs)
    strategy.start(grid=InProcessGrid(app, NODES), initial_arrays=ArrayRecord(model.state_dict()),
                   num_rounds=rounds)
    with torch.no_grad():
        pred = strategy.model(torch.from_numpy(X_TEST)).numpy()
    return float(((pred - F_TEST) ** 2).mean()), strategy
