"""The plugin API on a user's own model and data, through the in-process grid (no Ray).

Each test writes the two halves of a user's app: a client callable that gives
``dq_train``/``gradient_train`` the device's own data in one of the accepted forms, and
Flower's own ``Strategy.start`` on the server side.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, MetricRecord
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

import dq_flower
from dq_flower.harness.inprocess import InProcessGrid
from dq_flower.server.common import NodeConfigurationError


class Tabular(nn.Module):
    def __init__(self, features: int = 6, outputs: int = 3) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.body = nn.Sequential(nn.Linear(features, 16), nn.ReLU(), nn.Linear(16, outputs))

    def forward(self, x):
        return self.body(x)


def _blobs(n=600, seed=0):
    """Three Gaussian classes in 6 features, well outside [0, 1] (as users' data is)."""
    centres = np.random.default_rng(99).normal(0, 3, (3, 6))  # the same classes every call
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    x = (centres[y] + rng.normal(0, 1, (n, 6))) * 3.0 + 5.0
    return x.astype(np.float32), y.astype(np.int64)


class PairDataset(Dataset):
    """A map-style Dataset with a transform, like a torchvision data set."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return torch.from_numpy(self.x[i]) * 1.0, int(self.y[i])


def _shards(x, y, nodes):
    return [(x[k::nodes], y[k::nodes]) for k in range(nodes)]


def _as(kind, x, y):
    if kind == "numpy":
        return (x, y)
    if kind == "tensordataset":
        return TensorDataset(torch.from_numpy(x), torch.from_numpy(y))
    if kind == "dataset":
        return PairDataset(x, y)
    return DataLoader(TensorDataset(torch.from_numpy(x), torch.from_numpy(y)), batch_size=7,
                      shuffle=True)


def _accuracy(model, x, y):
    with torch.no_grad():
        return float((model(torch.from_numpy(x)).argmax(1).numpy() == y).mean())


def _run(strategy, client, nodes, rounds, model):
    grid = dq_flower.MeasuredGrid(InProcessGrid(client, nodes))
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()),
                            num_rounds=rounds)
    return result, grid


@pytest.mark.parametrize("kind", ["numpy", "tensordataset", "dataset", "dataloader"])
def test_dq_trains_on_each_form_of_client_data(kind):
    x, y = _blobs()
    xt, yt = _blobs(300, seed=1)
    shards = _shards(x, y, 3)
    data = [_as(kind, *s) for s in shards]

    def client(msg, context):
        return dq_flower.client.dq_train(msg, context, data[context.node_config["partition-id"]])

    model = Tabular()
    strategy = dq_flower.DQStrategy(model, bits=2, budget=40, server_steps=15, lr=0.02,
                                    upload_schedule="fixed")
    result, grid = _run(strategy, client, 3, 4, model)
    trained = Tabular()
    trained.load_state_dict(result.arrays.to_torch_state_dict())
    assert _accuracy(trained, xt, yt) > 0.9
    assert strategy.spec.sample_shape == (6,) and strategy.mode == "feature"
    assert strategy.stored == 4 * 3 * 40
    if kind == "numpy":  # a checkpoint keeps each client's feature ranges with the store
        resumed = dq_flower.DQStrategy(Tabular(), bits=2, budget=40, server_steps=15,
                                       lr=0.02, upload_schedule="fixed")
        resumed.load_state_dict(strategy.state_dict())
        want = strategy.store.draw(60, np.random.default_rng(1))[0]
        np.testing.assert_array_equal(resumed.store.draw(60, np.random.default_rng(1))[0], want)
        assert np.abs(want).max() > 1.5  # in the data's own units, not the coded [0, 1]
    # every row the server holds decodes within one quantization step of the user's value
    assert grid.up_bytes > 0 and grid.per_node("up") and sum(grid.per_round("up").values()) \
        == grid.up_bytes


def test_initial_arrays_are_where_training_starts():
    x, y = _blobs()
    data = _shards(x, y, 2)

    def client(msg, context):
        return dq_flower.client.dq_train(msg, context, data[context.node_config["partition-id"]])

    start = Tabular()
    with torch.no_grad():
        for p in start.parameters():
            p.fill_(0.0)
    model = Tabular()  # random weights: must be replaced by initial_arrays
    strategy = dq_flower.DQStrategy(model, server_steps=1, lr=1e-12, momentum=0.0,
                                    weight_decay=0.0)
    result = strategy.start(grid=InProcessGrid(client, 2),
                            initial_arrays=ArrayRecord(start.state_dict()), num_rounds=1)
    for name, value in result.arrays.to_torch_state_dict().items():
        assert torch.allclose(value, start.state_dict()[name], atol=1e-6), name


@pytest.mark.parametrize("scorer", ["loss", "gradnorm"])
def test_model_based_scorers_with_a_user_model(scorer):
    x, y = _blobs()
    data = _shards(x, y, 2)
    seen = {}

    def client(msg, context):
        seen["model"] = "model" in msg.content.array_records
        return dq_flower.client.dq_train(msg, context, data[context.node_config["partition-id"]],
                                         model=Tabular())

    model = Tabular()
    strategy = dq_flower.DQStrategy(model, scorer=scorer, selection_rule="sample", budget=30,
                                    server_steps=10, lr=0.02, upload_schedule="fixed")
    result, _ = _run(strategy, client, 2, 3, model)
    assert seen["model"]
    # server-side figures are reported with the ServerApp-side metrics, as Flower does
    assert result.evaluate_metrics_serverapp[3]["rejected"] == 0
    assert result.evaluate_metrics_serverapp[3]["stored"] == 3 * 2 * 30
    assert 3 not in result.train_metrics_clientapp


def test_model_based_scorer_without_a_client_model_fails_clearly():
    x, y = _blobs()
    data = _shards(x, y, 2)
    errors = []

    def client(msg, context):
        try:
            return dq_flower.client.dq_train(msg, context, data[0])
        except ValueError as exc:
            errors.append(str(exc))
            raise

    model = Tabular()
    # (the fixed schedule: the adaptive one's first round is uniform and needs no model)
    strategy = dq_flower.DQStrategy(model, scorer="loss", max_failed_rounds=2,
                                    upload_schedule="fixed")
    with pytest.raises(RuntimeError, match="needs the model"):
        _run(strategy, client, 2, 3, model)
    assert "pass model=" in errors[0]


@pytest.mark.parametrize("knob", [{"scorer": "loss"}, {"compensation": "qsgd"}])
def test_a_knob_that_needs_the_model_stops_the_run_in_round_one(knob):
    """At the defaults (adaptive: round 1 draws uniformly, no model sent) the node still
    refuses in round 1, and the run stops with one line naming the knob and the fix."""
    x, y = _blobs()
    data = _shards(x, y, 2)
    calls = []

    def client(msg, context):
        calls.append(int(msg.content["config"]["server-round"]))
        return dq_flower.client.dq_train(msg, context, data[context.node_config["partition-id"]])

    model = Tabular()
    strategy = dq_flower.DQStrategy(model, **knob)
    with pytest.raises(NodeConfigurationError) as info:
        _run(strategy, client, 2, 3, model)
    message = str(info.value)
    name, value = next(iter(knob.items()))
    assert f"{name}={value!r} needs the model: pass model= (your nn.Module) to dq_train" \
        in message, message
    assert "\n" not in message and message.startswith("[dq] node ")
    assert calls == [1, 1]  # both nodes refused round 1; no second round was sent


class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(2)
        self.body = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))

    def forward(self, x):
        return self.body(x)


def test_regression_targets_train_with_the_mse_default():
    rng = np.random.default_rng(3)
    x = rng.normal(0, 1, (400, 4)).astype(np.float32) * 2
    w = np.array([1.5, -1.0, 0.5, 0.25], dtype=np.float32)
    y = (x @ w + 1.0 + rng.normal(0, 0.05, 400)).astype(np.float32)
    data = _shards(x, y, 2)

    def client(msg, context):
        return dq_flower.client.dq_train(msg, context, data[context.node_config["partition-id"]])

    model = Regressor()
    strategy = dq_flower.DQStrategy(model, bits=6, budget=50, server_steps=40, lr=0.01)
    result, _ = _run(strategy, client, 2, 4, model)
    trained = Regressor()
    trained.load_state_dict(result.arrays.to_torch_state_dict())
    with torch.no_grad():
        mse = float(((trained(torch.from_numpy(x)).squeeze(1).numpy() - y) ** 2).mean())
    assert strategy.spec.target == "float"
    assert mse < 0.1 * float(y.var()), mse  # explains > 90% of the variance


def test_gradient_strategy_on_a_user_model_and_custom_loss():
    x, y = _blobs()
    data = _shards(x, y, 3)
    calls = {"n": 0}

    def loss_fn(out, target):
        calls["n"] += 1
        return nn.functional.cross_entropy(out, target, reduction="none")

    def client(msg, context):
        return dq_flower.client.gradient_train(
            msg, context, _as("dataloader", *data[context.node_config["partition-id"]]),
            model=Tabular(), loss_fn=loss_fn)

    model = Tabular()
    strategy = dq_flower.GradientStrategy(model, codec="qsgd", lr=0.1, seed=0)
    result, grid = _run(strategy, client, 3, 15, model)
    trained = Tabular()
    trained.load_state_dict(result.arrays.to_torch_state_dict())
    xt, yt = _blobs(300, seed=1)
    assert _accuracy(trained, xt, yt) > 0.8
    assert calls["n"] >= 15 * 3


def test_federated_evaluation_weights_clients_by_examples():
    x, y = _blobs()
    shards = _shards(x, y, 3)

    def client(msg, context):
        data = shards[context.node_config["partition-id"]]
        if msg.metadata.message_type == "evaluate":
            return dq_flower.client.evaluate(msg, context, data, model=Tabular())
        return dq_flower.client.dq_train(msg, context, data)

    model = Tabular()
    strategy = dq_flower.DQStrategy(model, fraction_evaluate=1.0, server_steps=10, lr=0.02)
    result, _ = _run(strategy, client, 3, 3, model)
    metrics = result.evaluate_metrics_clientapp[3]
    assert isinstance(metrics, MetricRecord)
    assert 0.8 < metrics["eval-acc"] <= 1.0 and metrics["eval-loss"] > 0


def test_unknown_knob_and_bad_values_fail_at_construction():
    with pytest.raises(ValueError, match=r"unknown knob 'bitz' \(did you mean 'bits'\?\)"):
        dq_flower.DQStrategy(Tabular(), bitz=2)
    with pytest.raises(ValueError, match="bits"):
        dq_flower.DQStrategy(Tabular(), bits=12)
    with pytest.raises(ValueError, match="codec"):
        dq_flower.GradientStrategy(Tabular(), codec="nope")
    with pytest.raises(TypeError, match="nn.Module"):
        dq_flower.DQStrategy("mlp")


class Stream(torch.utils.data.IterableDataset):
    """A node's rows as an ``IterableDataset``, shuffled each pass where ``shuffle``."""

    def __init__(self, x, y, shuffle: bool) -> None:
        self.x, self.y, self.shuffle, self.passes = x, y, shuffle, 0

    def __iter__(self):
        self.passes += 1
        order = (np.random.default_rng(self.passes).permutation(len(self.y)) if self.shuffle
                 else np.arange(len(self.y)))
        for i in order:
            yield torch.from_numpy(self.x[i]), int(self.y[i])


@pytest.mark.parametrize("shuffle", [False, True], ids=["one-order", "shuffled"])
def test_rows_streamed_in_another_order_each_round_are_each_stored_once(shuffle):
    """Rows are named by their content: a stream shuffled each pass had the server store
    some rows twice and never ask for others (a user's app: 313 of 1,437 digits rows stored
    twice), then was refused from its second round."""
    x, y = _blobs(240)
    streams = [Stream(xs, ys, shuffle) for xs, ys in _shards(x, y, 2)]

    def client(msg, context):
        data = DataLoader(streams[int(context.node_config["partition-id"])], batch_size=16)
        return dq_flower.client.dq_train(msg, context, data)

    model = Tabular()
    strategy = dq_flower.DQStrategy(model, seed=0, upload_schedule="fixed", budget=60, bits=8)
    result, _ = _run(strategy, client, 2, 3, model)
    assert [result.evaluate_metrics_serverapp[r]["rejected"] for r in (1, 2, 3)] == [0, 0, 0]
    assert result.evaluate_metrics_serverapp[3]["stored"] == 240
    store = strategy.data.store  # at 8 bits each stored row is nearest the row it codes
    stored, _ = store._decode(store._take(np.arange(len(store))))
    nearest = np.linalg.norm(stored[:, None] - x[None], axis=2).argmin(axis=1)
    assert np.unique(nearest).size == 240  # each row once


def test_a_bare_iterable_dataset_is_refused_with_what_to_give():
    x, y = _blobs(20)
    from dq_flower.data_input import as_arrays

    with pytest.raises(TypeError, match="read it through a DataLoader"):
        as_arrays(Stream(x, y, False))  # it failed on "object ... has no len()"
