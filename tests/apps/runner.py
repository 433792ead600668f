"""Runs a user app of the zoo with Flower's FedAvg and with DQ at its defaults.

Each app module of ``tests/apps`` is written as a user writes a Flower app: its own
``Net``, its own per-device data (``load_local_data(partition_id)``), its own local
training for FedAvg (``local_train``) and its own test set (``test_set``). This module
only builds the two halves every app shares (the ``ServerApp`` main and the
``ClientApp`` train function) and runs them, either through Flower's own
``run_simulation`` (Ray) or through the package's in-process grid (fast tests).

What a user's server passes beyond the defaults, an app declares with optional module
attributes, the same for both kinds: ``TRAIN_CONFIG`` (a dict, sent as
``train_config=ConfigRecord(...)`` to ``strategy.start``; FedAvg's nodes then call
``local_train(model, data, msg.content["config"])``), ``FRACTION_TRAIN`` and
``MIN_AVAILABLE_NODES`` (the strategy's arguments); ``STREAM = True`` (a node's data
grows: ``load_local_data(partition_id, server_round)`` gives what it holds by that round);
``DQ_KNOBS`` (a dict) sets DQ's knobs
only, ``DQ_LOSS_FN`` (a callable returning the user's loss) DQ's ``loss_fn``, and
``DQ_CLIENT_MODEL = True`` has DQ's nodes given the model (``dq_train(..., model=)``). An
app scored by something other than accuracy names it (``METRIC``), computes it
(``score(model, x, y)``) and says whether lower is better (``LOWER_IS_BETTER``).
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

import dq_flower

#: Flower's FedAvg with the app's own training, DQ at its defaults, and DQ's ``upload-all``
#: baseline (every node's rows uploaded once at DQ's bits and coder, trained to a plateau).
KINDS = ("fedavg", "dq", "upload-all")


@dataclass
class AppRun:
    """What one run of one app measured."""

    app: str
    kind: str
    #: the app's metric on its test set after each round, round 0 (the start) first
    scores: list[float] = field(default_factory=list)
    up_bytes: int = 0
    down_bytes: int = 0
    wall_s: float = 0.0
    metric: str = "accuracy"
    #: uplink bytes by round and by node id (which nodes were heard from, and when)
    up_by_round: dict[int, int] = field(default_factory=dict)
    up_by_node: dict[int, int] = field(default_factory=dict)

    @property
    def final(self) -> float:
        return self.scores[-1] if self.scores else float("nan")


def docs_text(*parts: str) -> str:
    """A docs page (``docs/<parts>``) with its whitespace folded to single spaces."""
    page = Path(__file__).resolve().parents[2] / "docs" / Path(*parts)
    return " ".join(page.read_text(encoding="utf-8").split())


def metric_name(app: ModuleType) -> str:
    """The app's metric: ``METRIC``, or accuracy."""
    return str(getattr(app, "METRIC", "accuracy"))


def accuracy(model: torch.nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    """Share of the rows ``x`` whose highest output is their label ``y``."""
    with torch.no_grad():
        pred = model(torch.as_tensor(x)).argmax(1).numpy()
    return float((pred == np.asarray(y)).mean())


def lower_is_better(app: ModuleType) -> bool:
    """Whether the app's metric is a loss (``LOWER_IS_BETTER``), not a score."""
    return bool(getattr(app, "LOWER_IS_BETTER", False))


def dq_keeps_up(app: ModuleType, fedavg: float, dq: float, margin: float = 0.02) -> bool:
    """Whether DQ's final metric ``dq`` is FedAvg's ``fedavg`` or better within tolerance.

    A score (accuracy) may trail by ``margin`` (2 points); a lower-is-better metric may be
    at most ``1 + app.TOLERANCE`` times FedAvg's (the app states and justifies it).
    """
    if lower_is_better(app):
        return dq <= (1.0 + float(app.TOLERANCE)) * fedavg
    return dq >= fedavg - margin


def central_eval_fn(app: ModuleType):
    """The app's ``evaluate_fn``: its metric (``score``, or accuracy) on its test set."""
    xt, yt = app.test_set()
    score = getattr(app, "score", accuracy)

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        model = app.Net()
        model.load_state_dict(arrays.to_torch_state_dict())
        model.eval()
        return MetricRecord({metric_name(app): float(score(model, xt, yt))})

    return evaluate


def server_main(app: ModuleType, kind: str, rounds: int, out: AppRun):
    """The body of the app's ``@app.main()``: DQ at its defaults, or Flower's FedAvg."""

    def main(grid: Grid, context: Context) -> None:
        model = app.Net()
        kwargs: dict[str, Any] = {"fraction_train": getattr(app, "FRACTION_TRAIN", 1.0)}
        if hasattr(app, "MIN_AVAILABLE_NODES"):
            kwargs["min_available_nodes"] = app.MIN_AVAILABLE_NODES
        if kind in ("dq", "upload-all"):
            knobs = dict(getattr(app, "DQ_KNOBS", {}))
            if kind == "upload-all":
                knobs["upload-schedule"] = "all"
            if hasattr(app, "DQ_LOSS_FN"):
                kwargs["loss_fn"] = app.DQ_LOSS_FN()
            strategy: Any = dq_flower.DQStrategy(model, seed=0, **kwargs, **knobs)
        else:
            strategy = FedAvg(fraction_evaluate=0.0, **kwargs)
        train_config = getattr(app, "TRAIN_CONFIG", None)
        measured = dq_flower.MeasuredGrid(grid)
        start = time.perf_counter()
        result = strategy.start(
            grid=measured, initial_arrays=ArrayRecord(model.state_dict()), num_rounds=rounds,
            train_config=None if train_config is None else ConfigRecord(dict(train_config)),
            evaluate_fn=central_eval_fn(app))
        out.wall_s = time.perf_counter() - start
        out.scores = [float(m[out.metric])
                      for _, m in sorted(result.evaluate_metrics_serverapp.items())]
        out.up_bytes, out.down_bytes = measured.up_bytes, measured.down_bytes
        out.up_by_round, out.up_by_node = measured.per_round("up"), measured.per_node("up")

    return main


def client_train(app: ModuleType, kind: str):
    """The body of the app's ``@app.train()``: ``dq_train`` or the app's own training."""

    def train(msg: Message, context: Context) -> Message:
        partition = int(context.node_config["partition-id"])
        data = (app.load_local_data(partition, int(msg.content["config"]["server-round"]))
                if getattr(app, "STREAM", False) else app.load_local_data(partition))
        if kind in ("dq", "upload-all"):
            model = app.Net() if getattr(app, "DQ_CLIENT_MODEL", False) else None
            return dq_flower.client.dq_train(msg, context, data, model=model)
        model = app.Net()
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        if hasattr(app, "TRAIN_CONFIG"):  # the user's train reads what the server sent
            examples = app.local_train(model, data, msg.content["config"])
        else:
            examples = app.local_train(model, data)
        content = RecordDict({"arrays": ArrayRecord(model.state_dict()),
                              "metrics": MetricRecord({"num-examples": examples})})
        return Message(content=content, reply_to=msg)

    return train


def run_app(app: ModuleType, kind: str, rounds: int | None = None, *,
            engine: str = "inprocess") -> AppRun:
    """Run ``app`` with ``kind`` (one of :data:`KINDS`) for ``rounds`` (the app's own)."""
    rounds = int(rounds or app.ROUNDS)
    out = AppRun(app.NAME, kind, metric=metric_name(app))
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
