"""Runs a user app of the zoo with Flower's FedAvg and with DQ at its defaults.

Each app module of ``tests/apps`` is written as a user writes a Flower app: its own
``Net``, its own per-device data (``load_local_data(partition_id)``), its own local
training for FedAvg (``local_train``) and its own test set (``test_set``). This module
only builds the two halves every app shares (the ``ServerApp`` main and the
``ClientApp`` train function) and runs them, either through Flower's own
``run_simulation`` (Ray) or through the package's in-process grid (fast tests).
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

import dq_flower

KINDS = ("fedavg", "dq")


@dataclass
class AppRun:
    """What one run of one app measured."""

    app: str
    kind: str
    accuracy: list[float] = field(default_factory=list)
    up_bytes: int = 0
    down_bytes: int = 0
    wall_s: float = 0.0

    @property
    def final(self) -> float:
        return self.accuracy[-1] if self.accuracy else float("nan")


def central_eval_fn(app: ModuleType):
    """The app's ``evaluate_fn``: accuracy of the model on the app's test set."""
    xt, yt = app.test_set()

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        model = app.Net()
        model.load_state_dict(arrays.to_torch_state_dict())
        model.eval()
        with torch.no_grad():
            pred = model(torch.as_tensor(xt)).argmax(1).numpy()
        return MetricRecord({"accuracy": float((pred == np.asarray(yt)).mean())})

    return evaluate


def server_main(app: ModuleType, kind: str, rounds: int, out: AppRun):
    """The body of the app's ``@app.main()``: DQ at its defaults, or Flower's FedAvg."""

    def main(grid: Grid, context: Context) -> None:
        model = app.Net()
        fraction = getattr(app, "FRACTION_TRAIN", 1.0)
        if kind == "dq":
            strategy: Any = dq_flower.DQStrategy(model, fraction_train=fraction, seed=0)
        else:
            strategy = FedAvg(fraction_train=fraction, fraction_evaluate=0.0)
        measured = dq_flower.MeasuredGrid(grid)
        start = time.perf_counter()
        result = strategy.start(grid=measured, initial_arrays=ArrayRecord(model.state_dict()),
                                num_rounds=rounds, evaluate_fn=central_eval_fn(app))
        out.wall_s = time.perf_counter() - start
        out.accuracy = [float(m["accuracy"])
                        for _, m in sorted(result.evaluate_metrics_serverapp.items())]
        out.up_bytes, out.down_bytes = measured.up_bytes, measured.down_bytes

    return main


def client_train(app: ModuleType, kind: str):
    """The body of the app's ``@app.train()``: ``dq_train`` or the app's own training."""

    def train(msg: Message, context: Context) -> Message:
        data = app.load_local_data(int(context.node_config["partition-id"]))
        if kind == "dq":
            return dq_flower.client.dq_train(msg, context, data)
        model = app.Net()
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        examples = app.local_train(model, data)
        content = RecordDict({"arrays": ArrayRecord(model.state_dict()),
                              "metrics": MetricRecord({"num-examples": examples})})
        return Message(content=content, reply_to=msg)

    return train


def run_app(app: ModuleType, kind: str, rounds: int | None = None, *,
            engine: str = "inprocess") -> AppRun:
    """Run ``app`` with ``kind`` (``fedavg`` or ``dq``) for ``rounds`` (the app's own)."""
    rounds = int(rounds or app.ROUNDS)
    out = AppRun(app.NAME, kind)
    main = server_main(app, kind, rounds, out)
    train = client_train(app, kind)
    if engine == "inprocess":
        from dq_flower.harness.inprocess import InProcessGrid

        main(InProcessGrid(train, app.NUM_NODES), Context(
            run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={}))
        return out
    import cloudpickle
    from flwr.simulation import run_simulation

    cloudpickle.register_pickle_by_value(app)
    server_app, client_app = ServerApp(), ClientApp()
    server_app.main()(main)
    client_app.train()(train)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run_simulation(server_app=server_app, client_app=client_app,
                       num_supernodes=app.NUM_NODES,
                       backend_config={"client_resources": {"num_cpus": 1},
                                       "init_args": {"num_cpus": 2,
                                                     "include_dashboard": False}})
    return out
