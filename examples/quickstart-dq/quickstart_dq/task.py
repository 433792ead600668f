"""quickstart_dq: the model and the data (scikit-learn's 8x8 digits, offline)."""

from functools import lru_cache

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import TensorDataset

TEST_FRACTION = 0.2
SPLIT_SEED = 42


class Net(nn.Module):
    """A small CNN for 8x8 grey-scale digits shaped (1, 8, 8)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.pool = nn.MaxPool2d(2, 2)
        self.fc1 = nn.Linear(32 * 2 * 2, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of the 10 digit classes."""
        x = self.pool(F.relu(self.conv1(x)))  # 16 x 4 x 4
        x = self.pool(F.relu(self.conv2(x)))  # 32 x 2 x 2
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)


@lru_cache(maxsize=1)
def _digits() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Train and test rows of the digits, shuffled once with a fixed seed."""
    bunch = load_digits()
    # the data set's definition: pixels are 0..16
    x = (bunch.data.astype(np.float32) / 16.0).reshape(-1, 1, 8, 8)
    y = bunch.target.astype(np.int64)
    order = np.random.default_rng(SPLIT_SEED).permutation(len(y))
    n_test = int(round(TEST_FRACTION * len(y)))
    test, train = order[:n_test], order[n_test:]
    return x[train], y[train], x[test], y[test]


def _dataset(x: np.ndarray, y: np.ndarray) -> TensorDataset:
    return TensorDataset(torch.from_numpy(x), torch.from_numpy(y))


def load_data(partition_id: int, num_partitions: int) -> tuple[TensorDataset, TensorDataset]:
    """Train and test rows of node `partition_id`: an IID partition by index."""
    x_train, y_train, x_test, y_test = _digits()
    train = np.array_split(np.arange(len(y_train)), num_partitions)[partition_id]
    test = np.array_split(np.arange(len(y_test)), num_partitions)[partition_id]
    return _dataset(x_train[train], y_train[train]), _dataset(x_test[test], y_test[test])


def load_centralized_testset() -> TensorDataset:
    """Every test row, for the server's central evaluation."""
    _, _, x_test, y_test = _digits()
    return _dataset(x_test, y_test)


def test(net: nn.Module, dataset: TensorDataset) -> tuple[float, float]:
    """Mean cross-entropy loss and accuracy of ``net`` on ``dataset``."""
    x, y = dataset.tensors
    net.eval()
    with torch.no_grad():
        logits = net(x)
    loss = F.cross_entropy(logits, y).item()
    accuracy = (logits.argmax(1) == y).float().mean().item()
    return loss, accuracy
