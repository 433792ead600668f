"""Tests of the ``fedavg`` method: Flower's own FedAvg, configured, plus our client handler."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord
from flwr.serverapp.strategy import FedAvg

from dq_flower.baselines.config import FedAvgConfig
from dq_flower.harness.client_app import app as client_app
from dq_flower.harness.fedavg_client import local_epochs
from dq_flower.harness.inprocess import NODE_ID_BASE, InProcessGrid
from dq_flower.harness.methods import get_method
from dq_flower.harness.runtime import build_model, task_info
from dq_flower.harness.server_app import run_server, validate_run_config
from dq_flower.harness.simulate import build_run_config
from dq_flower.harness.tasks.data import load_partition
from dq_flower.model_ops import get_flat, num_params
from dq_flower.seeding import Purpose, round_rng

from .helpers import size_recording_app


def build(**knobs):
    run_config = build_run_config("fedavg", **knobs)
    task, _ = validate_run_config(run_config)
    info = task_info(task)
    model = build_model(task, info)
    strategy, train_config = get_method("fedavg").build(task, run_config, model, info)
    return strategy, train_config, task, model


def test_fedavg_is_flowers_own_strategy_configured_from_the_task():
    # Execute
    strategy, train_config, _, _ = build(num_clients=5, fraction_train=0.4, min_available=3,
                                         local_epochs=2, client_lr=0.2)
    # Assert
    assert type(strategy) is FedAvg
    assert strategy.fraction_train == 0.4 and strategy.fraction_evaluate == 0.0
    assert strategy.min_available_nodes == 3 and strategy.min_train_nodes == 1
    assert train_config["local-epochs"] == 2 and train_config["client-lr"] == 0.2
    assert train_config["num-partitions"] == 5
    assert "dataset" not in train_config  # defaults are not sent; clients rebuild them


@pytest.mark.parametrize(("kwargs", "key"), [
    ({"local_epochs": -1}, "local-epochs"),
    ({"client_lr": 0.0}, "client-lr"),
    ({"batch_size": 0}, "batch-size"),
    ({"client_momentum": 1.0}, "client-momentum"),
])
def test_fedavg_config_rejects_bad_values_naming_the_key(kwargs, key):
    with pytest.raises(ValueError, match=f"^{key}"):
        FedAvgConfig(**kwargs)


def test_one_round_is_the_weighted_mean_of_the_clients_local_training():
    # Prepare: unequal partitions so the num-examples weights matter
    strategy, train_config, task, model = build(num_clients=3, rounds=1, seed=2,
                                                partition="dirichlet", local_epochs=2)
    cfg = FedAvgConfig(local_epochs=2)
    expected, total = np.zeros(num_params(model)), 0
    for pid in range(3):
        x, y, _ = load_partition("digits", pid, 3, "dirichlet", 0.5, 2)
        local = build_model(task, task_info(task))
        local_epochs(local, x, y, cfg, round_rng(2, 1, pid, Purpose.SHUFFLE))
        expected += x.shape[0] * get_flat(local).astype(np.float64)
        total += x.shape[0]
    expected /= total
    config = ConfigRecord({"method": "fedavg", **train_config})
    # Execute
    result = strategy.start(grid=InProcessGrid(client_app, 3),
                            initial_arrays=ArrayRecord(model.state_dict()), num_rounds=1,
                            train_config=config)
    # Assert
    model.load_state_dict(result.arrays.to_torch_state_dict())
    np.testing.assert_allclose(get_flat(model), expected, rtol=0, atol=1e-5)
    assert result.train_metrics_clientapp[1]["train-loss"] > 0


def test_fedavg_uplink_is_four_bytes_per_parameter_plus_a_constant_envelope():
    # Prepare: record every reply's serialized size, per (round, node)
    sizes: dict[tuple[int, int], int] = {}
    measured_app = size_recording_app(sizes)

    run_config = build_run_config("fedavg", num_clients=3, rounds=3)
    # Execute
    result = run_server(InProcessGrid(measured_app, 3), run_config)
    # Assert
    d = result.num_params
    for rnd in (1, 2, 3):
        envelopes = [sizes[(rnd, NODE_ID_BASE + i)] - 4 * d for i in range(3)]
        assert all(0 < e < 2048 for e in envelopes), envelopes
        assert max(envelopes) - min(envelopes) <= 2  # num-examples varints may differ
        assert result.history[rnd]["up_bytes"] == sum(sizes[(rnd, NODE_ID_BASE + i)]
                                                      for i in range(3))
    for i in range(3):
        per_round = {sizes[(rnd, NODE_ID_BASE + i)] for rnd in (1, 2, 3)}
        assert len(per_round) == 1, per_round  # constant across rounds
    down = result.history[1]["down_bytes"] / 3
    assert 4 * d < down < 4 * d + 4096  # the broadcast is float32 too, plus the config


def test_fedavg_trains_and_histories_have_every_key():
    result = run_server(InProcessGrid(client_app, 4), build_run_config("fedavg", rounds=3))
    rows = result.history
    assert [r["round"] for r in rows] == [0, 1, 2, 3]
    assert rows[-1]["accuracy"] > rows[0]["accuracy"] + 0.3
    assert rows[3]["cum_up_bytes"] == sum(r["up_bytes"] for r in rows)
    assert "train_loss" in rows[1]


def test_fedavg_trains_on_the_nodes_that_are_connected():
    # Prepare: the run config says 4 partitions, but only 2 SuperNodes exist (flwr run's
    # default federation); FedAvg must not wait for the missing ones
    run_config = build_run_config("fedavg", num_clients=4, rounds=1)
    # Execute
    result = run_server(InProcessGrid(client_app, 2), run_config)
    # Assert
    assert result.history[1]["up_bytes"] > 2 * 4 * result.num_params
