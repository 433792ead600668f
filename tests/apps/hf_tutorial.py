"""A user's app as Flower's PyTorch tutorial writes it: a Hugging Face data set of PIL images.

The first 6,000 Fashion-MNIST training rows as a ``datasets.Dataset`` of ``{"img": PIL
image, "label": int}``, split over 5 nodes by flwr-datasets' ``IidPartitioner``; each node
keeps 80% of its partition (``train_test_split(test_size=0.2, seed=42)``), maps it with
``with_transform`` (``ToTensor`` then ``Normalize((0.5,), (0.5,))``: pixels in [-1, 1]) and
hands the client a shuffled ``DataLoader`` of batches of 32, as the tutorial does. The
tutorial's CNN (conv 6, conv 16, three linear layers); FedAvg trains one epoch per round
with SGD (lr 0.01, momentum 0.9). The test set: the first 1,000 test rows, normalised alike.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader

# the same IDX files (``available``: what the zoo asks of every app)
from tests.apps.fmnist_cnn import _idx, available  # noqa: F401

NAME = "hf-tutorial"
NUM_NODES = 5
ROUNDS = 5
TRAIN_ROWS = 6000
TEST_ROWS = 1000


@functools.cache
def _hf_dataset():
    """The training rows as a Hugging Face data set of PIL images and class labels."""
    from datasets import ClassLabel, Dataset, Features  # the user's libraries
    from datasets import Image as ImageFeature
    from PIL import Image

    x = _idx("train-images-idx3-ubyte.gz", 16, TRAIN_ROWS, 784).reshape(-1, 28, 28)
    y = _idx("train-labels-idx1-ubyte.gz", 8, TRAIN_ROWS, 1).astype(int)
    features = Features({"img": ImageFeature(), "label": ClassLabel(num_classes=10)})
    return Dataset.from_dict({"img": [Image.fromarray(a) for a in x], "label": y.tolist()},
                             features=features)


def apply_transforms(batch: dict) -> dict:
    """The tutorial's transform: ``ToTensor`` then ``Normalize((0.5,), (0.5,))``."""
    from torchvision.transforms import Compose, Normalize, ToTensor

    transform = Compose([ToTensor(), Normalize((0.5,), (0.5,))])
    batch["img"] = [transform(img) for img in batch["img"]]
    return batch


class Net(nn.Module):
    """The tutorial's CNN: conv 6 -> pool -> conv 16 -> pool -> 120 -> 84 -> 10."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv1 = nn.Conv2d(1, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 4 * 4, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(torch.relu(self.conv1(x)))
        x = self.pool(torch.relu(self.conv2(x)))
        x = torch.relu(self.fc1(x.view(-1, 16 * 4 * 4)))
        return self.fc3(torch.relu(self.fc2(x)))


def load_local_data(partition_id: int) -> DataLoader:
    from flwr_datasets.partitioner import IidPartitioner

    partitioner = IidPartitioner(num_partitions=NUM_NODES)
    partitioner.dataset = _hf_dataset()
    partition = partitioner.load_partition(partition_id)
    train = partition.train_test_split(test_size=0.2, seed=42)["train"]
    return DataLoader(train.with_transform(apply_transforms), batch_size=32, shuffle=True)


def test_set() -> tuple[np.ndarray, np.ndarray]:
    x = _idx("t10k-images-idx3-ubyte.gz", 16, TEST_ROWS, 784).reshape(-1, 1, 28, 28)
    y = _idx("t10k-labels-idx1-ubyte.gz", 8, TEST_ROWS, 1)
    return (x.astype(np.float32) / 255.0 - 0.5) / 0.5, y.astype(np.int64)


def local_train(model: nn.Module, loader: DataLoader) -> int:
    """One epoch of the tutorial's training: SGD, lr 0.01, momentum 0.9."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model.train()
    examples = 0
    for batch in loader:
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(batch["img"]), batch["label"]).backward()
        optimizer.step()
        examples += len(batch["label"])
    return examples
