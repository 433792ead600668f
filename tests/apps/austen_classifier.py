"""A user's app: which Austen novel is a passage from? Word ids through an ``EmbeddingBag``.

The user reads the six novels (Debian's ``r-cran-janeaustenr``, through the package's
reader), lower-cases them into words, keeps the 2,999 most common (id 0 for any other),
cuts each novel into passages of 24 words (label: the novel) and holds out 3,000 passages
at random (seeded) as the test set. Six nodes get the others round-robin as a
``TensorDataset`` of int64 word ids and labels. The model is the mean of the words'
32-wide embeddings, then a linear layer to the six novels; FedAvg trains one local epoch a
round with Adam (lr 0.01, batch 32).
"""

from __future__ import annotations

import re
from collections import Counter

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

NAME = "austen-classifier"
NUM_NODES = 6
ROUNDS = 8
VOCAB, WORDS, TEST_ROWS, SEED = 3000, 24, 3000, 0
_CACHE: dict = {}


def available() -> bool:
    from dq_flower.harness.tasks.data.austen import find_austen_db

    try:
        find_austen_db()
        import rdata  # noqa: F401
    except (FileNotFoundError, ImportError):
        return False
    return True


def _arrays() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    if "arrays" not in _CACHE:
        from dq_flower.harness.tasks.data.austen import load_austen

        novels = [re.findall(r"[a-z']+", (d.train + " " + d.test).lower())
                  for d in load_austen().devices]
        common = Counter(w for words in novels for w in words).most_common(VOCAB - 1)
        ids = {w: i + 1 for i, (w, _) in enumerate(common)}
        xs, ys = [], []
        for label, words in enumerate(novels):
            seq = np.array([ids.get(w, 0) for w in words], dtype=np.int64)
            n = seq.size // WORDS
            xs.append(seq[:n * WORDS].reshape(n, WORDS))
            ys.append(np.full(n, label, dtype=np.int64))
        order = np.random.default_rng(SEED).permutation(sum(len(y) for y in ys))
        x, y = np.concatenate(xs)[order], np.concatenate(ys)[order]
        _CACHE["arrays"] = (x[TEST_ROWS:], y[TEST_ROWS:], x[:TEST_ROWS], y[:TEST_ROWS])
    return _CACHE["arrays"]


class Net(nn.Module):
    """Mean of 32-wide word embeddings, then 6 novels."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.words = nn.EmbeddingBag(VOCAB, 32, mode="mean")
        self.out = nn.Linear(32, 6)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out(self.words(ids))


def load_local_data(partition_id: int) -> TensorDataset:
    x, y, _, _ = _arrays()
    idx = np.arange(partition_id, len(y), NUM_NODES)
    return TensorDataset(torch.from_numpy(x[idx]), torch.from_numpy(y[idx]))


def test_set() -> tuple[np.ndarray, np.ndarray]:
    _, _, xt, yt = _arrays()
    return xt, yt


def local_train(model: nn.Module, data: TensorDataset) -> int:
    """One epoch of Adam (lr 0.01, batch 32); returns the examples seen."""
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    loader = DataLoader(data, batch_size=32, shuffle=True,
                        generator=torch.Generator().manual_seed(0))
    model.train()
    for xb, yb in loader:
        opt.zero_grad()
        nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
    return len(data)
