"""Flower ``FedAvg``'s arguments on ``DQStrategy`` and ``GradientStrategy``, taken as FedAvg
takes them: a ServerApp written for FedAvg keeps its line when the class changes."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy.strategy_utils import aggregate_metricrecords

import dq_flower
from dq_flower.client import dq_train, evaluate, gradient_train
from dq_flower.harness.inprocess import InProcessGrid

NODES = 6
RNG = np.random.default_rng(0)
X = RNG.random((NODES * 20, 8)).astype(np.float32)
Y = (X[:, 0] > 0.5).astype(np.int64)


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))


def _data(context: Context) -> tuple[np.ndarray, np.ndarray]:
    k = int(context.node_config["partition-id"])
    return X[k::NODES], Y[k::NODES]


def _app() -> ClientApp:
    """DQ's or a gradient method's train; the user's own evaluate, on the keys given."""
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        if "method" in msg.content["config"]:  # a gradient baseline's round
            return gradient_train(msg, context, _data(context), model=_model())
        return dq_train(msg, context, _data(context))

    @app.evaluate()
    def evaluate_(msg: Message, context: Context) -> Message:
        assert set(msg.content.array_records) == {"weights"}, msg.content.array_records
        assert "server-round" in msg.content.config_records["cfg"]
        reply = evaluate(msg, context, _data(context), model=_model())  # its only record
        metrics = dict(reply.content["metrics"].items())
        metrics["n"] = metrics.pop("num-examples")
        return Message(RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg)

    return app


FEDAVG_LINE = dict(fraction_train=0.1, fraction_evaluate=1.0, min_train_nodes=4,
                   min_evaluate_nodes=2, min_available_nodes=NODES, weighted_by_key="n",
                   arrayrecord_key="weights", configrecord_key="cfg")


@pytest.fixture(autouse=True)
def _quiet():
    logging.getLogger("flwr").setLevel(logging.WARNING)
    yield
    logging.getLogger("flwr").setLevel(logging.INFO)


@pytest.mark.parametrize("kind", ["dq", "qsgd"])
def test_a_fedavg_line_runs_with_its_arguments_honoured(kind):
    seen: list[tuple[int, str]] = []

    def train_aggr(records: list[RecordDict], key: str) -> MetricRecord:
        seen.append((len(records), key))
        return MetricRecord({"users-examples": sum(int(r["metrics"]["num-examples"])
                                                   for r in records)})

    def eval_aggr(records: list[RecordDict], key: str) -> MetricRecord:
        seen.append((len(records), key))
        return aggregate_metricrecords(records, key)

    args = dict(FEDAVG_LINE, train_metrics_aggr_fn=train_aggr, evaluate_metrics_aggr_fn=eval_aggr)
    strategy = (dq_flower.DQStrategy(_model(), **args) if kind == "dq"
                else dq_flower.GradientStrategy(_model(), "qsgd", **args))
    grid = InProcessGrid(_app(), NODES)
    sent = list(strategy.configure_train(1, strategy._return_arrays(), ConfigRecord(), grid))
    assert len(sent) == 4  # min_train_nodes beats fraction_train's one node of six
    _, metrics = strategy.aggregate_train(1, list(grid.send_and_receive(sent)))
    assert metrics is not None and metrics["users-examples"] == 4 * 20
    asked = list(strategy.configure_evaluate(1, strategy._return_arrays(), ConfigRecord(), grid))
    evaluated = strategy.aggregate_evaluate(1, list(grid.send_and_receive(asked)))
    assert seen == [(4, "n"), (NODES, "n")]
    assert evaluated is not None and 0.0 < float(evaluated["eval-acc"]) <= 1.0
    assert "n" not in evaluated  # Flower's aggregate_metricrecords leaves the weight out


def test_a_failing_metrics_function_is_logged_and_its_metrics_left_out(caplog):
    def broken(records, key):
        raise KeyError("train_loss")

    strategy = dq_flower.DQStrategy(_model(), train_metrics_aggr_fn=broken)
    grid = InProcessGrid(_app(), NODES)
    sent = list(strategy.configure_train(1, strategy._return_arrays(), ConfigRecord(), grid))
    with caplog.at_level(logging.WARNING):
        _, metrics = strategy.aggregate_train(1, list(grid.send_and_receive(sent)))
    assert metrics is not None and metrics["replies"] == NODES  # the round's own figures
    assert "train_metrics_aggr_fn failed on this round's 6 replies (KeyError" in caplog.text


@pytest.mark.parametrize(("key", "value", "says"), [
    ("min_train_nodes", -1, "min_train_nodes must be an int >= 0"),
    ("weighted_by_key", "", "weighted_by_key must be a non-empty str"),
    ("arrayrecord_key", 3, "arrayrecord_key must be a non-empty str"),
    ("evaluate_metrics_aggr_fn", "mean", "evaluate_metrics_aggr_fn must be callable")])
def test_bad_fedavg_arguments_fail_naming_them(key, value, says):
    for build in (dq_flower.DQStrategy, dq_flower.GradientStrategy):
        with pytest.raises(ValueError, match=says):
            build(_model(), **{key: value})


def test_a_misspelt_fedavg_argument_is_named_with_the_one_meant():
    from dq_flower.baselines.config import GradientConfig
    from dq_flower.config import field_keys
    from dq_flower.dq.config import DQConfig
    from dq_flower.server.common import FedAvgArgs

    for build in (dq_flower.DQStrategy, dq_flower.GradientStrategy):
        with pytest.raises(ValueError, match="'min_train_node'.*'min_train_nodes'"):
            build(_model(), min_train_node=2)
    knobs = {k.replace("-", "_") for cfg in (DQConfig, GradientConfig) for k in field_keys(cfg)}
    FedAvgArgs.pop(dict.fromkeys(knobs))  # no knob of either method reads as a misspelling
    for build in (dq_flower.DQStrategy, dq_flower.GradientStrategy):
        # the strategy's own arguments too: it listed every knob, none of them the one meant
        for typo, meant in (("fraction_evalute", "fraction_evaluate"),
                            ("min_available_node", "min_available_nodes"),
                            ("los_fn", "loss_fn")):
            with pytest.raises(ValueError, match=f"'{typo}' \\(did you mean '{meant}'\\?\\)"):
                build(_model(), **{typo: 1})
        FedAvgArgs.pop(dict.fromkeys(knobs), build.__init__)  # no knob reads as one


def test_a_wait_for_more_nodes_than_connect_says_what_may_be_wrong_once(caplog, monkeypatch):
    """min-available-nodes above a local simulation's node count waited an hour in silence
    but for a line a second; after 30 s the log now says why it may wait."""
    from dq_flower.server import common

    clock = [0.0]
    monkeypatch.setattr(common.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(common.time, "sleep", lambda s: clock.__setitem__(0, clock[0] + s))

    class Grid:
        def get_node_ids(self):
            return [1, 2] if clock[0] < 40 else [1, 2, 3]

    with caplog.at_level(logging.INFO, logger="flwr"):
        assert common.wait_for_nodes(Grid(), 3) == [1, 2, 3]
    hints = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(hints) == 1 and hints[0].startswith("2 of the 3 nodes min-available-nodes")
    assert "options.num-supernodes" in hints[0]
