"""Reported figures one node of five would set: evaluation under the wrapper, training
losses (GradientStrategy, DQ's gradient rounds, the wrapper), metric key floods, the size
of a DQ data reply the upload planner measures.

Before: under ``CompressedUpdates(FedAvg)`` one node claiming 2**31 - 1 examples set the
reported evaluation accuracy (the inner strategy's weighted mean) to its own 100% or 0%;
GradientStrategy's ``train-loss`` was the weighted mean of what each node claimed (1e300:
1e299); an evaluate reply with 100k metric keys was read key by key and every key
published. Now evaluate counts are capped at twice their median and values bounded by the
majority in the wrapper too, losses are bounded by the others', and a reply with more
than ``MAX_METRIC_KEYS`` metrics is rejected before any is read.
"""

from __future__ import annotations

import logging
import time
from functools import lru_cache

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import FedAvg

import dq_flower
from dq_flower.harness.inprocess import InProcessGrid
from dq_flower.server.evaluation import MAX_METRIC_KEYS
from dq_flower.wire.gradient_reply import METRICS_KEY
from tests.compression import digits_app
from tests.compression.digits_app import Net, load_data
from tests.faults import digits_attack
from tests.faults.digits_attack import Net as DigitsMLP
from tests.faults.digits_attack import X, Y, wire

NODES = 5
LR = 0.05
ROUNDS = 20  # the digits CNN near 89% (evaluated on the nodes' shares of its test set)
FLOOD = 100_000  # metric keys in the flooding reply (the probe's 400k: 9.2 MB)


@pytest.fixture(autouse=True)
def _quiet():
    logging.getLogger("flwr").setLevel(logging.ERROR)
    yield
    logging.getLogger("flwr").setLevel(logging.INFO)


def _flood() -> dict[str, float]:
    return {f"m{i}": 0.5 for i in range(FLOOD)}


# ------------------------------------------------------------ evaluation in the wrapper
def _wrapped_app(claim: dict | None, loss: float | None = None) -> ClientApp:
    """The quickstart's train (under the mod) and evaluate; node 0 replies ``claim``.

    ``loss``: node 0's claimed training loss.
    """
    app = ClientApp(mods=[dq_flower.compression_mod])

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        k = int(context.node_config["partition-id"])
        torch.manual_seed(k)
        model = Net()
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        trained = digits_app.train(model, load_data(k, NODES), 1,
                                   float(msg.content["config"]["lr"]))
        told = loss if loss is not None and k == 0 else trained
        return Message(RecordDict({"arrays": ArrayRecord(model.state_dict()),
                                   "metrics": MetricRecord({"train-loss": told,
                                                            "num-examples": 287})}),
                       reply_to=msg)

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        k = int(context.node_config["partition-id"])
        model = Net()
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        _, _, x, y = digits_app.digits()
        rows = np.array_split(np.arange(len(y)), NODES)[k]
        model.eval()
        with torch.no_grad():
            acc = float((model(torch.from_numpy(x[rows])).argmax(1).numpy() == y[rows]).mean())
        metrics = {"accuracy": acc, "num-examples": len(rows)}
        if claim is not None and k == 0:
            metrics = claim
        return Message(RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg)

    return app


def _wrapped_run(claim: dict | None, rounds: int = ROUNDS) -> tuple[dict, float]:
    """The last round's federated evaluation and the seconds its aggregation took."""
    torch.manual_seed(0)
    model = Net()
    strategy = dq_flower.CompressedUpdates(FedAvg(fraction_evaluate=1.0), codec="fp16")
    spent = []
    inner = strategy.aggregate_evaluate

    def timed(server_round, replies):
        t0 = time.perf_counter()
        out = inner(server_round, replies)
        spent.append(time.perf_counter() - t0)
        return out

    strategy.aggregate_evaluate = timed  # type: ignore[method-assign]
    result = strategy.start(grid=InProcessGrid(_wrapped_app(claim), NODES),
                            initial_arrays=ArrayRecord(model.state_dict()), num_rounds=rounds,
                            train_config=ConfigRecord({"lr": LR}))
    return dict(result.evaluate_metrics_clientapp[rounds]), max(spent)


@lru_cache(maxsize=2)
def _wrapped_control(rounds: int = ROUNDS) -> dict:
    return _wrapped_run(None, rounds)[0]


@pytest.mark.parametrize("accuracy", [0.0, 1.0])
def test_a_claimed_evaluation_count_does_not_set_the_wrappers_figure(accuracy):
    control = _wrapped_control()
    attacked, _ = _wrapped_run({"accuracy": accuracy, "num-examples": 2**31 - 1})
    assert abs(attacked["accuracy"] - control["accuracy"]) <= 0.05, (attacked, control)


def test_a_metric_key_flood_is_refused_before_it_is_read_under_the_wrapper():
    control = _wrapped_control(1)
    attacked, seconds = _wrapped_run({**_flood(), "accuracy": 0.5, "num-examples": 72},
                                     rounds=1)
    assert set(attacked) == {"accuracy"}
    assert seconds < 1.0
    assert abs(attacked["accuracy"] - control["accuracy"]) <= 0.05


@lru_cache(maxsize=3)
def _wrapped_losses(loss: float | None, rounds: int = 2) -> list[float]:
    """Each round's ``train-loss`` under ``CompressedUpdates(FedAvg)``."""
    torch.manual_seed(0)
    model = Net()
    strategy = dq_flower.CompressedUpdates(FedAvg(fraction_evaluate=0.0), codec="fp16")
    result = strategy.start(grid=InProcessGrid(_wrapped_app(None, loss), NODES),
                            initial_arrays=ArrayRecord(model.state_dict()), num_rounds=rounds,
                            train_config=ConfigRecord({"lr": LR}))
    return [result.train_metrics_clientapp[r]["train-loss"] for r in range(1, rounds + 1)]


@pytest.mark.parametrize("loss", [1e300, -1e300])
def test_one_nodes_training_loss_does_not_set_the_wrappers_figure(loss):
    # each metric is clipped to the span of the round's middle values before FedAvg's
    # weighted mean (was 2e299 and -2e299: only non-finite values were rejected)
    for honest, got in zip(_wrapped_losses(None), _wrapped_losses(loss), strict=True):
        assert abs(got - honest) <= 0.05 * honest, (got, honest)


# ------------------------------------------------------------ GradientStrategy
def _gradient_app(edit):
    def app(msg: Message, context: Context) -> Message:
        k = int(context.node_config["partition-id"])
        local = (X[k:1500:NODES], Y[k:1500:NODES])
        if msg.metadata.message_type == "evaluate":
            metrics = {"eval-acc": 0.9 - 0.01 * k, "num-examples": 300}
            if k == 0 and edit is not None:
                metrics = edit(metrics)
            return Message(RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg)
        reply = dq_flower.client.gradient_train(msg, context, local, model=DigitsMLP())
        content = wire(reply.content)
        if k == 0 and edit is not None:
            content[METRICS_KEY] = MetricRecord(edit(dict(content[METRICS_KEY].items())))
        return Message(content, reply_to=msg)

    return app


def _gradient_run(edit=None, rounds: int = 3, **knobs):
    torch.manual_seed(0)
    model = DigitsMLP()
    strategy = dq_flower.GradientStrategy(model, "qsgd", lr=0.5, seed=0, **knobs)
    return strategy.start(grid=InProcessGrid(_gradient_app(edit), NODES),
                          initial_arrays=ArrayRecord(model.state_dict()), num_rounds=rounds)


def test_one_nodes_training_loss_does_not_set_gradient_strategys_figure():
    control = _gradient_run()
    attacked = _gradient_run(lambda m: {**m, "train-loss": 1e300})
    for r in range(1, 4):
        honest = control.train_metrics_clientapp[r]["train-loss"]
        got = attacked.train_metrics_clientapp[r]["train-loss"]
        assert 0.8 * honest <= got <= 1.2 * honest, (r, got, honest)


# ------------------------------------------------------------ DQ's gradient rounds, its planner
def _dq_with_model(msg: Message, context: Context, local) -> RecordDict:
    """The package's DQ client, given the model a gradient round needs."""
    return wire(dq_flower.client.dq_train(msg, context, local, model=DigitsMLP()).content)


def _loss_of(value: float):
    def lie(content: RecordDict, _server_round: int) -> None:
        content["metrics"] = MetricRecord({**dict(content["metrics"].items()),
                                           "train-loss": value})

    return digits_attack.edits(lie)


@pytest.mark.parametrize("loss", [1e300, -1e300, float("nan")])
def test_one_nodes_training_loss_does_not_set_dq_gradient_rounds_figure(loss, monkeypatch):
    # with no stored rows the round's figure is the clients' losses: each is now clipped to
    # the span of the round's middle ones (was their plain mean: 1e300 gave 2e299, and NaN
    # left every round without a train-loss)
    monkeypatch.setattr(digits_attack, "honest", _dq_with_model)
    knobs = {"upload_mode": "gradient", "gradient_codec": "qsgd"}
    control = digits_attack.run(None, 3, **knobs)[2]
    attacked = digits_attack.run(_loss_of(loss), 3, **knobs)[2]
    for r, (honest, got) in enumerate(zip(control, attacked, strict=True), 1):
        assert "train-loss" in got, (r, got)
        assert abs(got["train-loss"] - honest["train-loss"]) <= 0.05 * honest["train-loss"], (
            r, got["train-loss"], honest["train-loss"])


def _padded(where: str):
    def pad(content: RecordDict, _server_round: int) -> None:
        """200 kB more in a data reply: a metric list, or a record DQ does not read."""
        if "samples" not in content:
            return
        if where == "metrics":
            content["metrics"] = MetricRecord({**dict(content["metrics"].items()),
                                               "pad": [0.5] * 25_000})
        else:
            content["pad"] = ArrayRecord({"x": digits_attack.raw(np.zeros(200_000, np.uint8))})

    return digits_attack.edits(pad)


@pytest.mark.parametrize("where", ["metrics", "record"])
def test_one_padded_data_reply_does_not_move_the_upload_planners_estimate(where, monkeypatch):
    # the bits of a data reply besides its samples: the replies' median (was their mean:
    # 9,928 honest, 329,966 with one of five padded, est-data-bits 21x); a record no DQ
    # reply holds is refused
    monkeypatch.setattr(digits_attack, "honest", _dq_with_model)
    knobs = {"upload_mode": "auto", "gradient_codec": "qsgd"}
    control = digits_attack.run(None, 1, **knobs)[1]
    _, attacked, metrics = digits_attack.run(_padded(where), 1, **knobs)
    assert attacked.planner.reply_bits == control.planner.reply_bits
    assert metrics[0]["rejected"] == int(where == "record")


def test_a_metric_key_flood_is_refused_in_the_packages_own_evaluation():
    result = _gradient_run(lambda m: {**m, **_flood()}, rounds=1, fraction_evaluate=1.0)
    assert set(result.evaluate_metrics_clientapp[1]) == {"eval-acc"}
    assert MAX_METRIC_KEYS < FLOOD
