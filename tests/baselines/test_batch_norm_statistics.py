"""A model with BatchNorm in the gradient baselines: its running statistics travel.

Gradients leave the buffers alone, so before this the server's statistics stayed at their
initial values (mean 0, variance 1) and a BatchNorm model evaluated at chance however it
trained. Now the server sends its buffers with the model, each client replies with its
own after the round's forward passes, and the server keeps their example-weighted mean.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord
from torch import nn

from dq_flower.codecs import make
from dq_flower.harness.client_app import app as client_app
from dq_flower.harness.client_app import make_client_app
from dq_flower.harness.inprocess import InProcessGrid
from dq_flower.harness.server_app import run_server
from dq_flower.harness.simulate import build_run_config
from dq_flower.model_ops import float_buffers, get_flat
from dq_flower.server.majority import robust_buffers
from dq_flower.wire.model_buffers import BUFFERS_KEY, buffers_record, weighted_buffers

from .test_compressed import exchange, make_strategy, node, reply_content


def _bn_strategy(clients: int = 3):
    strategy, _, _ = make_strategy(num_partitions=clients, task_kw={"model": "resnet20"},
                                   codec="identity", lr=1.0, momentum=0.0)
    return strategy


def _with_buffers(content, buffers):
    content[BUFFERS_KEY] = buffers_record(buffers)
    return content


def test_the_server_keeps_the_weighted_mean_of_the_statistics_bounded_by_the_majority():
    strategy = _bn_strategy()
    initial = float_buffers(strategy.model)
    assert initial and all(k.endswith(("running_mean", "running_var")) for k in initial)
    w0 = get_flat(strategy.model)
    g = make("identity").encode(np.zeros(w0.size, dtype=np.float32))
    parts = [{k: np.full_like(v, i + 1.0) for k, v in initial.items()} for i in range(3)]
    contents = {node(i): _with_buffers(reply_content(g, 4 * (i + 1)), parts[i])
                for i in range(3)}
    replies = exchange(strategy, contents)
    _, metrics = strategy.aggregate_train(1, replies)
    assert metrics["replies"] == 3 and metrics["stepped"] == 1
    got = float_buffers(strategy.model)
    # 1, 2, 3 and the broadcast (mean 0, variance 1): every value clipped to [1, 2], the
    # second lowest and second highest of the four; then weighted 4, 8, 12
    expected = (1 * 4 + 2 * 8 + 2 * 12) / 24
    assert all(np.allclose(v, expected) for v in got.values())
    mean = robust_buffers(parts, [4, 8, 12], initial)
    assert all(np.allclose(mean[k], got[k]) for k in got)
    # replies that agree keep their example-weighted mean
    same = [{k: np.full_like(v, 2.0) for k, v in initial.items()}] * 3
    assert all(np.allclose(v, weighted_buffers(same, [1, 2, 3])[k])
               for k, v in robust_buffers(same, [1, 2, 3], initial).items())


def test_a_reply_without_statistics_or_with_a_negative_variance_is_rejected():
    strategy = _bn_strategy(clients=5)
    initial = float_buffers(strategy.model)
    w0 = get_flat(strategy.model)
    g = make("identity").encode(np.zeros(w0.size, dtype=np.float32))
    negative = {k: (np.full_like(v, -1.0) if k.endswith("running_var") else v)
                for k, v in initial.items()}
    nan = {k: np.full_like(v, np.nan) for k, v in initial.items()}
    short = dict(list(initial.items())[:-1])
    good = {k: np.full_like(v, 0.5) for k, v in initial.items()}
    contents = {node(0): reply_content(g, 4),  # none
                node(1): _with_buffers(reply_content(g, 4), negative),
                node(2): _with_buffers(reply_content(g, 4), nan),
                node(3): _with_buffers(reply_content(g, 4), short),
                node(4): _with_buffers(reply_content(g, 4), good)}
    _, metrics = strategy.aggregate_train(1, exchange(strategy, contents))
    assert metrics["replies"] == 1 and metrics["rejected"] == 4
    assert all(np.allclose(v, 0.5) for v in float_buffers(strategy.model).values())


class _BatchNormMLP(nn.Module):
    """The digits MLP with BatchNorm after its hidden layer."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.BatchNorm1d(32),
                                  nn.ReLU(), nn.Linear(32, 10))

    def forward(self, x):
        return self.body(x)


def test_a_small_batch_norm_model_learns_in_powersgd():
    # the unmarked version of the test below (11 s, not 130 s): measured, 0.78 after 12
    # rounds; with the server's statistics left at (0, 1) (its buffers never set) 0.65
    grid = InProcessGrid(make_client_app(_BatchNormMLP), 3)
    run = run_server(grid, build_run_config("powersgd", num_clients=3, rounds=12, seed=2,
                                            model=_BatchNormMLP, lr=0.1),
                     model_factory=_BatchNormMLP)
    acc = [h["accuracy"] for h in run.history]
    assert acc[-1] > 0.72, acc
    assert all(h["replies"] == 3 for h in run.history[1:])


@pytest.mark.slow  # 130 s on 2 cores; the small model above is its unmarked version
def test_a_batch_norm_model_learns_in_powersgd():
    # before: 10% (chance) after 60 rounds; the MLP it is compared with learns either way
    grid = InProcessGrid(client_app, 3)
    run = run_server(grid, build_run_config("powersgd", num_clients=3, rounds=40, seed=2,
                                            model="resnet20", lr=0.1))
    acc = [h["accuracy"] for h in run.history]
    assert max(acc[-5:]) > 0.5, acc
    # every round's replies carried the statistics, and the server's moved off (0, 1)
    assert all(h["replies"] == 3 for h in run.history[1:])
    assert run.history[-1]["up_bytes"] > 0


def test_buffers_record_round_trips_and_zero_dim_arrays_stay_zero_dim():
    rec = buffers_record({"a.running_mean": np.arange(3.0), "b.running_var": np.ones(2)})
    assert [str(a.dtype) for a in rec.values()] == ["float32", "float32"]
    assert ArrayRecord({"n": Array(np.array(np.int64(3)))})["n"].shape == ()
    assert torch.equal(torch.as_tensor(rec["a.running_mean"].numpy()),
                       torch.arange(3.0))
