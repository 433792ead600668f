"""The store-level compensation (control variate) and refreshed residuals."""

from __future__ import annotations

import numpy as np
import pytest

from dq_flower.dq.server.control_variate import ControlVariate
from dq_flower.dq.server.strategy import DQStrategy
from dq_flower.harness.client_app import app as client_app
from dq_flower.harness.inprocess import InProcessGrid
from dq_flower.harness.methods import client_task_config
from dq_flower.harness.runtime import build_model, task_info
from dq_flower.harness.task_config import TaskConfig
from dq_flower.harness.tasks.data import load_partition
from dq_flower.model_ops import weighted_loss_grad

TASK = TaskConfig(num_partitions=2, seed=3, model="mlp")


def _strategy(**knobs):
    return DQStrategy(build_model(TASK, task_info(TASK)), seed=TASK.seed, **knobs)


def _play(strategy, grid, server_round):
    messages = strategy.configure_train(server_round, None, client_task_config(TASK, "dq"),
                                        grid)
    replies = grid.send_and_receive(messages)
    assert not any(r.has_error() for r in replies)
    return strategy.aggregate_train(server_round, replies)


def test_with_lossless_refreshed_residuals_a_store_step_is_the_true_gradient():
    # Prepare: 1-bit data (far from the true points), an exact (identity) compensation,
    # a refreshed residual every round; the server's minibatch is the whole store
    strategy = _strategy(bits=1, budget=40, compensation="identity",
                         compensation_mode="refresh", refresh_every=1, server_steps=2,
                         upload_schedule="fixed",
                         server_batch_size=10_000)
    grid = InProcessGrid(client_app, 2)
    _play(strategy, grid, 1)
    captured = {}
    original = strategy.trainer.train_steps

    def spy(server_round, fresh):
        # the moment the round's store steps start: store and control variate updated
        x, y, w = strategy.store.draw(10_000, np.random.default_rng(0))
        rows = strategy.store._take(np.arange(len(strategy.store)))
        nodes, ids = strategy.store.node_ids(rows), rows.ids.astype(np.int64)
        data = {p: load_partition("digits", p, 2, "iid", 0.5, TASK.seed)[:2] for p in (0, 1)}
        # the store keys rows by client identity: here the partition id
        x_true = np.stack([data[int(n)][0][i] for n, i in
                            zip(nodes, ids, strict=True)])
        ws = (w / w.sum()).astype(np.float32)
        _, g_store = weighted_loss_grad(strategy.model, strategy.data.shaped(x), y, ws)
        _, g_true = weighted_loss_grad(strategy.model, strategy.data.shaped(x_true), y, ws)
        captured.update(store=g_store, true=g_true, cv=strategy.cv.value(),
                        refreshed=sum(u.refresh is not None for u in fresh))
        return original(server_round, fresh)

    strategy.trainer.train_steps = spy
    _, metrics = _play(strategy, grid, 2)
    # Assert: both clients refreshed, and quantized rows + control variate = true gradient
    assert metrics["refreshed"] == 2 == captured["refreshed"]
    np.testing.assert_allclose(captured["store"] + captured["cv"], captured["true"],
                               rtol=1e-4, atol=1e-6)
    error = np.linalg.norm(captured["store"] - captured["true"])
    assert error > 100 * np.linalg.norm(captured["store"] + captured["cv"] - captured["true"])


def test_first_step_mode_leaves_store_steps_uncorrected():
    strategy = _strategy(compensation="identity")
    assert strategy.cv is None
    with pytest.raises(ValueError, match="compensation-mode"):
        _strategy(compensation_mode="store")  # nothing to correct with


def test_the_control_variate_survives_checkpoint_and_resume():
    strategy = _strategy(budget=30, compensation="qsgd", compensation_mode="store",
                         compensation_decay=0.8)
    grid = InProcessGrid(client_app, 2)
    for rnd in (1, 2):
        _play(strategy, grid, rnd)
    state = strategy.state_dict()
    resumed = _strategy(budget=30, compensation="qsgd", compensation_mode="store",
                        compensation_decay=0.8)
    resumed.load_state_dict(state)
    np.testing.assert_array_equal(resumed.cv.value(), strategy.cv.value())
    assert np.linalg.norm(strategy.cv.value()) > 0


def test_control_variate_weights_and_decay_by_hand():
    cv = ControlVariate(2, decay=0.5)
    cv.add(1, np.array([1.0, 0.0], np.float32), 3.0)
    cv.add(2, np.array([0.0, 2.0], np.float32), 1.0)
    np.testing.assert_allclose(cv.value(), [3 / 4, 2 / 4])
    cv.age()  # both halve: the mean is unchanged
    np.testing.assert_allclose(cv.value(), [3 / 4, 2 / 4])
    cv.add(2, np.array([0.0, 4.0], np.float32), 1.0)  # fresh, undecayed
    np.testing.assert_allclose(cv.value(), [1.5 / 3, (1.0 + 4.0) / 3])
    cv.replace(1, np.array([2.0, 2.0], np.float32), 1.0)
    np.testing.assert_allclose(cv.value(), [2 / 2.5, (2 + 5.0) / 2.5])
