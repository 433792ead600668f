"""A Flower app written the way a user writes one, outside the package.

Its own ``nn.Module``, its own standardized tabular data (scikit-learn's breast-cancer
set, 30 features, range about -3 to 12 after standardizing), one ``TensorDataset`` per
device, its own ServerApp and ClientApp. Only the strategy and the client call come from
``dq_flower``; FedAvg is Flower's own, with a local training loop like Flower's
quickstart.
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg
from sklearn.datasets import load_breast_cancer
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dq_flower

NUM_NODES = 4


class Net(nn.Module):
    """A small MLP for 30 standardized features, 2 classes."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(30, 32), nn.ReLU(), nn.Linear(32, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def _arrays():
    x, y = load_breast_cancer(return_X_y=True)
    rng = np.random.default_rng(0)
    order = rng.permutation(len(y))
    x, y = x[order].astype(np.float32), y[order].astype(np.int64)
    split = int(0.8 * len(y))
    mean, std = x[:split].mean(0), x[:split].std(0)
    x = (x - mean) / std  # the user's own preprocessing: standardized features
    return x[:split], y[:split], x[split:], y[split:]


def load_local_data(partition_id: int) -> TensorDataset:
    """The device's own training rows as a TensorDataset."""
    x, y, _, _ = _arrays()
    idx = np.arange(partition_id, len(y), NUM_NODES)
    return TensorDataset(torch.from_numpy(x[idx]), torch.from_numpy(y[idx]))


def test_set() -> tuple[np.ndarray, np.ndarray]:
    """The server's held-out rows."""
    _, _, xt, yt = _arrays()
    return xt, yt


def central_eval(server_round: int, arrays: ArrayRecord) -> MetricRecord:
    model = Net()
    model.load_state_dict(arrays.to_torch_state_dict())
    xt, yt = test_set()
    with torch.no_grad():
        acc = float((model(torch.from_numpy(xt)).argmax(1).numpy() == yt).mean())
    return MetricRecord({"accuracy": acc})


def make_server_app(kind: str, rounds: int, out: dict) -> ServerApp:
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        model = Net()
        if kind == "dq":
            strategy = dq_flower.DQStrategy(model, bits=2, budget=32, server_steps=20,
                                            lr=0.05, seed=0)
        elif kind == "ef-sign":
            strategy = dq_flower.GradientStrategy(model, codec="ef-sign", lr=0.05, seed=0)
        else:
            strategy = FedAvg(fraction_evaluate=0.0)
        measured = dq_flower.MeasuredGrid(grid)
        result = strategy.start(grid=measured, initial_arrays=ArrayRecord(model.state_dict()),
                                num_rounds=rounds, evaluate_fn=central_eval)
        out["accuracy"] = [float(m["accuracy"])
                           for _, m in sorted(result.evaluate_metrics_serverapp.items())]
        out["state"] = result.arrays.to_torch_state_dict()
        out["up_bytes"] = measured.up_bytes
        out["down_bytes"] = measured.down_bytes

    return app


def _local_fedavg(msg: Message, trainset: TensorDataset) -> Message:
    """Flower-quickstart style local training: one epoch of SGD, reply the weights."""
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = DataLoader(trainset, batch_size=16, shuffle=True,
                        generator=torch.Generator().manual_seed(0))
    for xb, yb in loader:
        opt.zero_grad()
        nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
    content = RecordDict({"arrays": ArrayRecord(model.state_dict()),
                          "metrics": MetricRecord({"num-examples": len(trainset)})})
    return Message(content=content, reply_to=msg)


def make_client_app(kind: str) -> ClientApp:
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        trainset = load_local_data(int(context.node_config["partition-id"]))
        if kind == "dq":
            return dq_flower.client.dq_train(msg, context, trainset)
        if kind == "ef-sign":
            return dq_flower.client.gradient_train(msg, context, trainset, model=Net())
        return _local_fedavg(msg, trainset)

    return app
