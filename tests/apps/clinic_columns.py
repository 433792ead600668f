"""A user's app: a clinic's table read through Hugging Face ``datasets``, one value a column.

The user keeps each site's records as a pandas frame (age, BMI, blood pressure, glucose,
smoker as a bool, visits as uint8, and a 0/1 label drawn from a seeded logistic model of
them) and reads it as Flower's tabular examples do: ``Dataset.from_pandas(frame)
.with_format("torch")``, whose items are dicts of one 0-d tensor a column. 4 nodes of 500
rows, a test set of 1,600, 5 rounds. The model standardises its input by fixed means and
spreads in its ``forward`` (6 -> 32 -> 2); FedAvg's local training stacks the six feature
columns of each batch itself: one epoch of Adam (lr 0.003, batch 32).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader

NAME = "clinic-columns"
NUM_NODES = 4
ROUNDS = 5
ROWS = 500
COLUMNS = ("age", "bmi", "bp", "glucose", "smoker", "visits")
#: The model is 290 weights and a node's table 500 rows of 6 columns: every row DQ sends
#: outweighs what FedAvg's model sends for it.
UPLINK_SHARE = 0.5
MEAN = torch.tensor([50.0, 27.0, 130.0, 130.0, 0.2, 3.0])
SPREAD = torch.tensor([17.0, 5.0, 18.0, 35.0, 0.4, 2.0])
_CACHE: dict = {}


def available() -> bool:
    try:
        import datasets  # noqa: F401
        import pandas  # noqa: F401
    except ImportError:
        return False
    return True


def frame():
    """Every site's rows and the test rows, one seeded frame."""
    if "frame" not in _CACHE:
        import pandas as pd

        rng = np.random.default_rng(12)
        n = NUM_NODES * ROWS + 1600
        df = pd.DataFrame({
            "age": rng.integers(20, 85, n), "bmi": rng.normal(27, 5, n).astype(np.float32),
            "bp": rng.normal(130, 18, n).astype(np.float32),
            "glucose": rng.normal(130, 35, n).astype(np.float32),
            "smoker": rng.random(n) < 0.2, "visits": rng.poisson(3, n).astype(np.uint8)})
        z = (df[list(COLUMNS)].to_numpy(np.float32) - MEAN.numpy()) / SPREAD.numpy()
        logit = 4.5 * z[:, 3] + 2.1 * z[:, 1] + 1.5 * z[:, 0] + 1.8 * z[:, 4] - 3
        df["label"] = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.int64)
        _CACHE["frame"] = df
    return _CACHE["frame"]


class Net(nn.Module):
    """Standardised by fixed constants, then 6 -> 32 -> 2, ReLU."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body((x.float() - MEAN) / SPREAD)


def load_local_data(partition_id: int):
    from datasets import Dataset

    rows = frame().iloc[partition_id * ROWS:(partition_id + 1) * ROWS].reset_index(drop=True)
    return Dataset.from_pandas(rows).with_format("torch")


def test_set() -> tuple[np.ndarray, np.ndarray]:
    rows = frame().iloc[NUM_NODES * ROWS:]
    return rows[list(COLUMNS)].to_numpy(np.float32), rows["label"].to_numpy()


def local_train(model: nn.Module, data) -> int:
    """One epoch of Adam (lr 0.003, batch 32), the columns stacked per batch; rows seen."""
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    loader = DataLoader(data, batch_size=32, shuffle=True,
                        generator=torch.Generator().manual_seed(0))
    for batch in loader:
        x = torch.stack([batch[c].float() for c in COLUMNS], 1)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), batch["label"]).backward()
        opt.step()
    return len(data)
