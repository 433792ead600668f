"""A user's app: an MLP on scikit-learn's digits over 20 nodes of 15 rows, half train a round.

Each of 20 devices has recorded 15 labelled digits (8x8, pixels 0..16 scaled to 0..1): the
user takes the seeded 80/20 train/test split of a Hugging Face ``datasets.Dataset`` of
the digits, keeps the first 300 training rows and splits them over the nodes with
flwr-datasets' ``IidPartitioner``; each node serves ``{"features": tensor(64), "label":
int}`` dict samples through ``with_transform``. The user's server waits for all 20 nodes
(``MIN_AVAILABLE_NODES = 20``) and samples half of them each round
(``FRACTION_TRAIN = 0.5``), 10 rounds; the test set is the 360 held-out rows. FedAvg
trains five local epochs per round with SGD (lr 0.05, momentum 0.9, batch 8).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader

NAME = "tiny-nodes"
NUM_NODES = 20
ROUNDS = 10
FRACTION_TRAIN = 0.5
MIN_AVAILABLE_NODES = 20
ROWS = 300
LOCAL_EPOCHS = 5
SEED = 0
_CACHE: dict = {}


def available() -> bool:
    try:
        import datasets  # noqa: F401
        import flwr_datasets  # noqa: F401
        import sklearn  # noqa: F401
    except ImportError:
        return False
    return True


def _split():
    """The seeded split: ``(first 300 training rows as a Dataset, test x, test y)``."""
    if "split" not in _CACHE:
        from datasets import Dataset
        from datasets.utils.logging import disable_progress_bar
        from sklearn.datasets import load_digits

        disable_progress_bar()
        x, y = load_digits(return_X_y=True)
        ds = Dataset.from_dict({"features": (x / 16.0).astype(np.float32),
                                "label": y.astype(np.int64)})
        parts = ds.train_test_split(test_size=0.2, seed=SEED)
        test = parts["test"].with_format("numpy")[:]
        _CACHE["split"] = (parts["train"].select(range(ROWS)),
                           test["features"].astype(np.float32),
                           test["label"].astype(np.int64))
    return _CACHE["split"]


def _partitioner():
    if "partitioner" not in _CACHE:
        from flwr_datasets.partitioner import IidPartitioner

        partitioner = IidPartitioner(num_partitions=NUM_NODES)
        partitioner.dataset = _split()[0]
        _CACHE["partitioner"] = partitioner
    return _CACHE["partitioner"]


def apply_transforms(batch: dict) -> dict:
    """The quickstart's transform: the rows' lists become tensors."""
    batch["features"] = [torch.tensor(v, dtype=torch.float32) for v in batch["features"]]
    return batch


class Net(nn.Module):
    """64 -> 64 -> 10, ReLU."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = nn.Linear(64, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


def load_local_data(partition_id: int):
    """The node's 15 rows as a ``datasets.Dataset`` of dict samples."""
    return _partitioner().load_partition(partition_id).with_transform(apply_transforms)


def test_set() -> tuple[np.ndarray, np.ndarray]:
    _, xt, yt = _split()
    return xt, yt


def local_train(model: nn.Module, data) -> int:
    """Five epochs of SGD (lr 0.05, momentum 0.9, batch 8); returns the examples seen."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loader = DataLoader(data, batch_size=8, shuffle=True,
                        generator=torch.Generator().manual_seed(0))
    model.train()
    for _ in range(LOCAL_EPOCHS):
        for batch in loader:
            opt.zero_grad()
            nn.functional.cross_entropy(model(batch["features"]), batch["label"]).backward()
            opt.step()
    return len(data)
