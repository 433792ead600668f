"""A user's app: hours of life left of pumps, read from the noise of vibration windows.

Four plants (400, 300, 200 and 100 windows) of two int16 channels of 64 samples each, as
the ADC gives them: a shaft tone of 2,000 counts and, as a pump wears, more noise (300 to
900 counts) and a third harmonic; the target is the hours left (0 to 500). The model
rescales the counts itself; DQ's nodes are given it (``model=``) and DQ the user's L1 loss.
At 2 bits a channel's four levels swamp the noise the wear shows in, and a model trained
on the codes reads the raw windows the user scores it on far worse than the codes.
Metric: mean absolute error in hours (lower is better).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

NAME, NUM_NODES, ROUNDS = "pump-wear", 4, 4
METRIC, LOWER_IS_BETTER = "mae-hours", True
SIZES = (400, 300, 200, 100)
DQ_CLIENT_MODEL = True
_CACHE: dict = {}


def available() -> bool:
    return True


def _windows(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    life = rng.uniform(0, 500, n)
    wear = 1 - life / 500
    t = np.arange(64) / 64
    f = rng.integers(1200, 3600, n)[:, None, None] / 600
    sig = np.concatenate([2000 * np.sin(2 * np.pi * f * t), 1500 * np.cos(2 * np.pi * f * t)], 1)
    sig += wear[:, None, None] ** 2 * 2500 * np.sin(2 * np.pi * 3 * f * t)
    sig += rng.normal(0, 1, sig.shape) * (300 + 600 * wear[:, None, None])
    return np.round(sig).astype(np.int16), life.astype(np.float32)


def _data() -> dict:
    if not _CACHE:
        rng = np.random.default_rng(21)
        _CACHE["parts"] = [_windows(rng, n) for n in SIZES]
        _CACHE["test"] = _windows(rng, 500)
    return _CACHE


class Net(nn.Module):
    """Two 1-D convolutions, global average pooling, a small head; hours out."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Sequential(nn.Conv1d(2, 16, 7, padding=3), nn.ReLU(), nn.MaxPool1d(2),
                                  nn.Conv1d(16, 32, 5, padding=2), nn.ReLU(),
                                  nn.AdaptiveAvgPool1d(1), nn.Flatten())
        self.head = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 250.0 + 250.0 * self.head(self.conv(x.float() / 2048.0)).squeeze(-1)


def DQ_LOSS_FN() -> nn.Module:  # noqa: N802 (the runner's name)
    return nn.L1Loss()


def load_local_data(k: int) -> tuple[np.ndarray, np.ndarray]:
    return _data()["parts"][k]


def test_set() -> tuple[np.ndarray, np.ndarray]:
    return _data()["test"]


def score(model: nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    model.eval()
    with torch.no_grad():
        return float(np.abs(model(torch.from_numpy(x)).numpy() - y).mean())


def local_train(model: nn.Module, data: tuple[np.ndarray, np.ndarray]) -> int:
    x, y = torch.from_numpy(data[0]), torch.from_numpy(data[1])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model.train()
    g = torch.Generator().manual_seed(0)
    for _ in range(2):
        p = torch.randperm(len(x), generator=g)
        for i in range(0, len(x), 32):
            b = p[i:i + 32]
            opt.zero_grad()
            nn.functional.l1_loss(model(x[b]), y[b]).backward()
            opt.step()
    return len(x)
