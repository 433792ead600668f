"""A user's app: an MLP regressing scikit-learn's diabetes progression, 5 nodes, 20 rounds.

A regression app: the user loads the 442 rows with ``load_diabetes`` (10 features as
scikit-learn ships them, centred and scaled to about -0.1..0.2), takes the seeded 80/20
``train_test_split``, and standardizes the float target (disease progression, 25 to 346)
with the training split's mean and std. The training rows go into a Hugging Face
``datasets.Dataset`` split over 5 nodes by flwr-datasets' ``IidPartitioner``; each node
serves ``{"features": tensor(10), "target": tensor()}`` dict samples. FedAvg trains one
epoch per round with Adam (lr 0.01, batch 16) on the mean squared error.

Its metric is the test set's mean squared error in the standardized units (lower is
better; always predicting the training mean scores about 0.84, a linear least-squares fit
0.56). DQ passes where its final MSE is at most ``1 + TOLERANCE`` times FedAvg's: the 89
test rows make the MSE itself uncertain by about sqrt(2 / 89), some 15% (for normal
errors), while FedAvg's own MSE moves by about 3% over its last eight rounds; 10% lies
between the two.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader

NAME = "diabetes-regression"
NUM_NODES = 5
ROUNDS = 20
SEED = 0
METRIC = "mse"
LOWER_IS_BETTER = True
#: DQ's final test MSE may be at most this much above FedAvg's, relatively.
TOLERANCE = 0.10
_CACHE: dict = {}


def available() -> bool:
    try:
        import datasets  # noqa: F401
        import flwr_datasets  # noqa: F401
        import sklearn  # noqa: F401
    except ImportError:
        return False
    return True


def _arrays() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    if "arrays" not in _CACHE:
        from sklearn.datasets import load_diabetes
        from sklearn.model_selection import train_test_split

        x, y = load_diabetes(return_X_y=True)
        x_tr, x_te, y_tr, y_te = train_test_split(x.astype(np.float32), y, test_size=0.2,
                                                  random_state=SEED)
        mean, std = y_tr.mean(), y_tr.std()
        _CACHE["arrays"] = (x_tr, ((y_tr - mean) / std).astype(np.float32),
                            x_te, ((y_te - mean) / std).astype(np.float32))
    return _CACHE["arrays"]


def _partitioner():
    if "partitioner" not in _CACHE:
        from datasets import Dataset
        from datasets.utils.logging import disable_progress_bar
        from flwr_datasets.partitioner import IidPartitioner

        disable_progress_bar()
        x, y, _, _ = _arrays()
        partitioner = IidPartitioner(num_partitions=NUM_NODES)
        partitioner.dataset = Dataset.from_dict({"features": x, "target": y})
        _CACHE["partitioner"] = partitioner
    return _CACHE["partitioner"]


class Net(nn.Module):
    """10 -> 32 -> 1, ReLU."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def load_local_data(partition_id: int):
    """The node's rows as a ``datasets.Dataset`` of torch dict samples."""
    return _partitioner().load_partition(partition_id).with_format("torch")


def test_set() -> tuple[np.ndarray, np.ndarray]:
    _, _, xt, yt = _arrays()
    return xt, yt


def score(model: nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    """Mean squared error of the model's predictions for ``x`` against ``y``."""
    with torch.no_grad():
        pred = model(torch.as_tensor(x)).reshape(-1).numpy()
    return float(np.mean((pred - np.asarray(y)) ** 2))


def chance_score() -> float:
    """The test MSE of always predicting the training mean (0 in standardized units)."""
    return float(np.mean(test_set()[1] ** 2))


def local_train(model: nn.Module, data) -> int:
    """One epoch of Adam (lr 0.01, batch 16) on the MSE; returns the examples seen."""
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    loader = DataLoader(data, batch_size=16, shuffle=True,
                        generator=torch.Generator().manual_seed(0))
    model.train()
    for batch in loader:
        opt.zero_grad()
        pred = model(batch["features"]).reshape(-1)
        nn.functional.mse_loss(pred, batch["target"]).backward()
        opt.step()
    return len(data)
