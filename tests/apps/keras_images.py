"""A user's app: Fashion-MNIST held as Keras holds images, 5 IID nodes, 6 rounds.

The first 5,000 training rows split round-robin over 5 nodes, each item
``{"pixels": uint8 tensor (28, 28, 1), "label": int}``: channels last and unscaled, the
model permuting and scaling them itself (``x.permute(0, 3, 1, 2).float() / 255``); the test
set is the first 1,000 test rows. FedAvg trains one epoch per round with SGD (lr 0.05,
momentum 0.9, batch 32).
"""

from __future__ import annotations

import numpy as np
import torch

from tests.apps import fmnist_cnn
from tests.apps.fmnist_cnn import _idx, available  # noqa: F401  (the same IDX files)

NAME = "keras-images"
NUM_NODES = 5
ROUNDS = 6
TRAIN_ROWS = 5000
TEST_ROWS = 1000


def _images(prefix: str, rows: int) -> tuple[np.ndarray, np.ndarray]:
    x = _idx(f"{prefix}-images-idx3-ubyte.gz", 16, rows, 784).reshape(rows, 28, 28, 1)
    y = _idx(f"{prefix}-labels-idx1-ubyte.gz", 8, rows, 1)
    return x.copy(), y.astype(np.int64)


class Net(fmnist_cnn.Net):
    """``fmnist_cnn``'s CNN, fed channels-last uint8 images it permutes and scales itself."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.permute(0, 3, 1, 2).float() / 255.0)


class PixelItems(fmnist_cnn.DictImages):
    """The device's rows as ``{"pixels": uint8 tensor (28, 28, 1), "label": int}``."""

    input_key = "pixels"


def load_local_data(partition_id: int) -> PixelItems:
    x, y = _images("train", TRAIN_ROWS)
    return PixelItems(x[partition_id::NUM_NODES], y[partition_id::NUM_NODES])


def test_set() -> tuple[np.ndarray, np.ndarray]:
    return _images("t10k", TEST_ROWS)


#: One epoch of SGD (lr 0.05, momentum 0.9, batch 32) on the items' pixels, as fmnist_cnn's.
local_train = fmnist_cnn.local_train
