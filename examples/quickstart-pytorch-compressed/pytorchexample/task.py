"""pytorchexample: A Flower / PyTorch app."""

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from datasets import Dataset
from flwr_datasets.partitioner import IidPartitioner
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader


class Net(nn.Module):
    """Model (simple CNN adapted from 'PyTorch: A 60 Minute Blitz' to 8x8 digits)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 2 * 2, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        """Logits of the 10 digit classes."""
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = x.view(-1, 32 * 2 * 2)
        x = F.relu(self.fc1(x))
        return self.fc2(x)


partitioner = None  # Cache the partitioner (offline: scikit-learn's digits, not the hub)


def digits(split: str) -> Dataset:
    """Train or test rows of scikit-learn's digits as a Hugging Face dataset."""
    bunch = load_digits()
    order = np.random.default_rng(42).permutation(len(bunch.target))
    rows = order[360:] if split == "train" else order[:360]
    return Dataset.from_dict({"img": bunch.images[rows].tolist(),
                              "label": bunch.target[rows].tolist()})


def apply_transforms(batch):
    """Apply transforms to the partition (pixels 0..16 to a normalised 1x8x8 tensor)."""
    batch["img"] = [(torch.tensor(img, dtype=torch.float32) / 8.0 - 1.0).unsqueeze(0)
                    for img in batch["img"]]
    return batch


def load_data(partition_id: int, num_partitions: int, batch_size: int):
    """Load partition of the digits data."""
    # Only initialize the partitioner once
    global partitioner
    if partitioner is None:
        partitioner = IidPartitioner(num_partitions=num_partitions)
        partitioner.dataset = digits("train")
    partition = partitioner.load_partition(partition_id)
    # Divide data on each node: 80% train, 20% test
    partition_train_test = partition.train_test_split(test_size=0.2, seed=42)
    # Construct dataloaders
    partition_train_test = partition_train_test.with_transform(apply_transforms)
    trainloader = DataLoader(
        partition_train_test["train"], batch_size=batch_size, shuffle=True
    )
    testloader = DataLoader(partition_train_test["test"], batch_size=batch_size)
    return trainloader, testloader


def load_centralized_dataset():
    """Load test set and return dataloader."""
    return DataLoader(digits("test").with_transform(apply_transforms), batch_size=128)


def train(net, trainloader, epochs, lr, device):
    """Train the model on the training set."""
    net.to(device)  # move model to GPU if available
    criterion = torch.nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    net.train()
    running_loss = 0.0
    for _ in range(epochs):
        for batch in trainloader:
            images = batch["img"].to(device)
            labels = batch["label"].to(device)
            optimizer.zero_grad()
            loss = criterion(net(images), labels)
            loss.backward()
            optimizer.step()
            running_loss += loss.item()
    avg_trainloss = running_loss / (epochs * len(trainloader))
    return avg_trainloss


def test(net, testloader, device):
    """Validate the model on the test set."""
    net.to(device)
    criterion = torch.nn.CrossEntropyLoss()
    correct, loss = 0, 0.0
    with torch.no_grad():
        for batch in testloader:
            images = batch["img"].to(device)
            labels = batch["label"].to(device)
            outputs = net(images)
            loss += criterion(outputs, labels).item()
            correct += (torch.max(outputs.data, 1)[1] == labels).sum().item()
    accuracy = correct / len(testloader.dataset)
    loss = loss / len(testloader)
    return loss, accuracy
