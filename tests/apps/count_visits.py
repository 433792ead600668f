"""A user's app: yearly hospital visits (counts), ``nn.PoissonNLLLoss()`` on a log-rate output.

Synthetic, seeded: 2,000 patients of 8 columns as a clinic records them (age, BMI, systolic
pressure, chronic conditions, smoker, income in $k, distance in km, insured), a pandas
frame the user hands DQ as ``(df[features].values, df["visits"].values)``: float64 rows,
int64 counts. Visits are Poisson with a log-rate linear in the columns (plus a squared
pressure term). 4 nodes round robin over 1,600 rows; 400 test. The model standardises by
fixed constants in ``forward`` (8 -> 32 -> 1, the log-rate). FedAvg: Adam lr 0.01, 2
epochs, batch 32. Metric: mean Poisson deviance (lower is better).

PyTorch's Poisson loss leaves out its constant (``exp(o) - y o``): below zero for a count of
2 or more near its rate, so the held-out loss falls below zero as the model learns, and
DQ's figures read against it (the gain of an upload relative to the loss before) logged
gains of 6e10; they are read above each row's floor now (``dq/server/loss_floor.py``).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

NAME = "count-visits"
NUM_NODES = 4
ROUNDS = 5
METRIC = "poisson-deviance"
LOWER_IS_BETTER = True
TOLERANCE = 0.1
ROWS, TRAIN = 2000, 1600
MEAN = torch.tensor([50.0, 27.0, 130.0, 1.5, 0.25, 60.0, 15.0, 0.85])
SPREAD = torch.tensor([17.0, 5.0, 18.0, 1.2, 0.43, 30.0, 12.0, 0.36])
_CACHE: dict = {}


def available() -> bool:
    try:
        import pandas  # noqa: F401
    except ImportError:
        return False
    return True


def _frame():
    if "df" not in _CACHE:
        import pandas as pd

        rng = np.random.default_rng(11)
        n = ROWS
        df = pd.DataFrame({
            "age": rng.integers(18, 90, n), "bmi": rng.normal(27, 5, n).round(1),
            "sbp": rng.normal(130, 18, n).round(), "chronic": rng.poisson(1.5, n),
            "smoker": (rng.random(n) < 0.25).astype(np.int64),
            "income_k": np.exp(rng.normal(4.0, 0.5, n)).round(1),
            "distance_km": rng.exponential(15, n).round(1),
            "insured": (rng.random(n) < 0.85).astype(np.int64)})
        z = ((df.age - 50) / 17 * 0.35 + (df.bmi - 27) / 5 * 0.15 + 0.35 * df.chronic
             + 0.3 * df.smoker - 0.15 * np.log(df.income_k / 55) - 0.02 * df.distance_km
             + 0.4 * df.insured + 0.15 * ((df.sbp - 130) / 18) ** 2 - 0.2)
        df["visits"] = rng.poisson(np.exp(z.to_numpy())).astype(np.int64)
        _CACHE["df"] = df
    return _CACHE["df"]


class Net(nn.Module):
    """8 -> 32 -> 1 (the log-rate), the columns standardised by fixed constants."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body((x - MEAN) / SPREAD).squeeze(-1)


def user_loss() -> nn.Module:
    return nn.PoissonNLLLoss(log_input=True)


DQ_LOSS_FN = user_loss


def load_local_data(partition_id: int) -> tuple[np.ndarray, np.ndarray]:
    df = _frame().iloc[:TRAIN].iloc[partition_id::NUM_NODES]
    return df.drop(columns="visits").values, df["visits"].values


def test_set() -> tuple[np.ndarray, np.ndarray]:
    df = _frame().iloc[TRAIN:]
    return df.drop(columns="visits").values.astype(np.float32), df["visits"].values


def deviance(rate: np.ndarray, y: np.ndarray) -> float:
    """Mean Poisson deviance of the rates ``rate`` against the counts ``y``."""
    y, rate = y.astype(np.float64), np.maximum(rate.astype(np.float64), 1e-8)
    log_ratio = np.log(np.where(y > 0, y, 1.0) / rate)
    return float(np.mean(2 * (np.where(y > 0, y * log_ratio, 0.0) - (y - rate))))


def score(model: nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    with torch.no_grad():
        return deviance(model(torch.as_tensor(x, dtype=torch.float32)).exp().numpy(),
                        np.asarray(y))


def chance_score() -> float:
    """The deviance of the training rows' mean rate."""
    return deviance(np.full(ROWS - TRAIN, _frame().visits[:TRAIN].mean()), test_set()[1])


def local_train(model: nn.Module, data: tuple[np.ndarray, np.ndarray]) -> int:
    """Two epochs of Adam (lr 0.01, batch 32) on the Poisson loss; the examples seen."""
    x, y = data
    rows = TensorDataset(torch.tensor(x, dtype=torch.float32),
                         torch.tensor(y, dtype=torch.float32))
    opt, loss_fn = torch.optim.Adam(model.parameters(), lr=0.01), user_loss()
    model.train()
    for _ in range(2):
        for xb, yb in DataLoader(rows, batch_size=32, shuffle=True,
                                 generator=torch.Generator().manual_seed(0)):
            opt.zero_grad()
            loss_fn(model(xb), yb).backward()
            opt.step()
    return len(y)
