"""A small Flower app in the shape of Flower's PyTorch quickstart, on scikit-learn digits.

Its own ``Net``, ``train()`` (SGD with momentum, the quickstart's loop) and ``test()``; the
ClientApp's ``@app.train()`` is the quickstart's, unchanged, with or without mods.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    """A small CNN for 8x8 digits."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.pool = nn.MaxPool2d(2, 2)
        self.fc1 = nn.Linear(32 * 2 * 2, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


@lru_cache(maxsize=1)
def digits() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    bunch = load_digits()
    x = (bunch.data.astype(np.float32) / 16.0).reshape(-1, 1, 8, 8)
    y = bunch.target.astype(np.int64)
    order = np.random.default_rng(42).permutation(len(y))
    test, train = order[:360], order[360:]
    return x[train], y[train], x[test], y[test]


def load_data(partition_id: int, num_partitions: int, batch_size: int = 32) -> DataLoader:
    x, y, _, _ = digits()
    rows = np.array_split(np.arange(len(y)), num_partitions)[partition_id]
    ds = TensorDataset(torch.from_numpy(x[rows]), torch.from_numpy(y[rows]))
    gen = torch.Generator().manual_seed(partition_id)
    return DataLoader(ds, batch_size=batch_size, shuffle=True, generator=gen)


def train(net: nn.Module, loader: DataLoader, epochs: int, lr: float) -> float:
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    net.train()
    total = 0.0
    for _ in range(epochs):
        for images, labels in loader:
            opt.zero_grad()
            loss = F.cross_entropy(net(images), labels)
            loss.backward()
            opt.step()
            total += loss.item()
    return total / (epochs * len(loader))


def test(net: nn.Module) -> tuple[float, float]:
    _, _, x, y = digits()
    net.eval()
    with torch.no_grad():
        logits = net(torch.from_numpy(x))
    loss = F.cross_entropy(logits, torch.from_numpy(y)).item()
    return loss, (logits.argmax(1).numpy() == y).mean().item()


def make_app(mods=(), hostile_scale: float | None = None,
             hostile_rounds: frozenset[int] | None = None) -> ClientApp:
    """The quickstart's ClientApp; with ``hostile_scale`` node 0 sends its update scaled
    by it (``-4``: four times the honest step, reversed), before any mod codes it; only in
    ``hostile_rounds`` if given (the config's ``server-round``)."""
    app = ClientApp(mods=list(mods))

    @app.train()
    def train_handler(msg: Message, context: Context) -> Message:
        torch.manual_seed(int(context.node_config["partition-id"]))
        model = Net()
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        loader = load_data(context.node_config["partition-id"],
                           context.node_config["num-partitions"])
        loss = train(model, loader, 1, float(msg.content["config"]["lr"]))
        state = model.state_dict()
        rnd = int(msg.content["config"]["server-round"])
        if hostile_scale is not None and int(context.node_config["partition-id"]) == 0 \
                and (hostile_rounds is None or rnd in hostile_rounds):
            start = msg.content["arrays"].to_torch_state_dict()
            state = {k: start[k] + hostile_scale * (v - start[k]) for k, v in state.items()}
        metrics = MetricRecord({"train_loss": loss, "num-examples": len(loader.dataset)})
        content = RecordDict({"arrays": ArrayRecord(state), "metrics": metrics})
        return Message(content=content, reply_to=msg)

    return app
