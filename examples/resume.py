"""Stop a Flower app after 2 rounds and resume it in a fresh strategy from its state_dict."""
import shutil
from pathlib import Path

import numpy as np
import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg
from flwr.simulation import run_simulation
from sklearn.datasets import load_digits
from torch import nn

import dq_flower

X, Y = load_digits(return_X_y=True)
X = (X / 16).astype(np.float32)
X_TEST, Y_TEST = X[1500:], Y[1500:]
CHECKPOINTS = Path("resume-checkpoints")


class Net(nn.Module):
    """Your own model."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))

    def forward(self, x):  # noqa: D102
        return self.body(x)


def accuracy(arrays: ArrayRecord) -> float:
    """Test accuracy of the model in ``arrays``."""
    model = Net()
    model.load_state_dict(arrays.to_torch_state_dict())
    with torch.no_grad():
        return float((model(torch.from_numpy(X_TEST)).argmax(1).numpy() == Y_TEST).mean())


def make_strategy(kind: str, model: nn.Module):
    """The strategy ``kind`` names, as your app builds it."""
    if kind == "dq":
        return dq_flower.DQStrategy(model, seed=0)
    if kind == "gradient":
        return dq_flower.GradientStrategy(model, codec="qsgd", seed=0)
    return dq_flower.CompressedUpdates(FedAvg(fraction_evaluate=0.0), codec="qsgd", levels=1)


def server_app(kind: str, rounds: int) -> ServerApp:
    """A ServerApp that resumes from its checkpoint if there is one and saves every round."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        torch.manual_seed(0)
        model = Net()
        strategy = make_strategy(kind, model)
        path, done = CHECKPOINTS / f"{kind}.pt", 0
        if path.exists():  # resume: the model and the strategy's whole state
            saved = torch.load(path, weights_only=False)  # a file this app wrote
            model.load_state_dict(saved["model"])
            strategy.load_state_dict(saved["strategy"])
            done = saved["round"]
            print(f"{kind}: resumed after round {done}{store(strategy)}")

        def save_and_evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
            if server_round > 0:  # after each round: what a fresh strategy needs
                CHECKPOINTS.mkdir(exist_ok=True)
                torch.save({"round": done + server_round, "model": arrays.to_torch_state_dict(),
                            "strategy": strategy.state_dict()}, path)
                print(f"{kind}: round {done + server_round}, accuracy {accuracy(arrays):.3f}"
                      f"{store(strategy)}")
            return MetricRecord({"accuracy": accuracy(arrays)})

        strategy.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()),
                       num_rounds=rounds, evaluate_fn=save_and_evaluate)

    return app


def store(strategy) -> str:
    """The size of DQ's sample store, as text."""
    return f", {strategy.stored} samples stored" if hasattr(strategy, "stored") else ""


def local_rows(context: Context):
    """The rows of this device (partition-id of num-partitions)."""
    k, n = context.node_config["partition-id"], context.node_config["num-partitions"]
    return X[k:1500:n], Y[k:1500:n]


dq_client = ClientApp()


@dq_client.train()
def dq_train(msg: Message, context: Context) -> Message:
    """Answer a DQ round."""
    return dq_flower.client.dq_train(msg, context, local_rows(context))


gradient_client = ClientApp()


@gradient_client.train()
def gradient_train(msg: Message, context: Context) -> Message:
    """Answer a compressed-gradient round."""
    return dq_flower.client.gradient_train(msg, context, local_rows(context), model=Net())


fedavg_client = ClientApp()


@fedavg_client.train(mods=[dq_flower.compression_mod])
def fedavg_train(msg: Message, context: Context) -> Message:
    """Your own train(), unchanged: compression_mod codes the update it returns."""
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    x, y = (torch.from_numpy(a) for a in local_rows(context))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for i in range(0, len(x), 32):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x[i:i + 32]), y[i:i + 32]).backward()
        optimizer.step()
    content = RecordDict({"arrays": ArrayRecord(model.state_dict()),
                          "metrics": MetricRecord({"num-examples": len(x)})})
    return Message(content=content, reply_to=msg)


CLIENTS = {"dq": dq_client, "gradient": gradient_client, "compressed": fedavg_client}

if __name__ == "__main__":
    shutil.rmtree(CHECKPOINTS, ignore_errors=True)
    for kind, client_app in CLIENTS.items():
        for rounds in (2, 1):  # 2 rounds, then a fresh ServerApp resumes for 1 more
            run_simulation(server_app=server_app(kind, rounds), client_app=client_app,
                           num_supernodes=4)
