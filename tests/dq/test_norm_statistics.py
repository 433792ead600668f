"""Batch norms' running statistics follow the server's steps; a bfloat16 model is refused."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import dq_flower
from dq_flower.dq.server.input_scale import MIN_NORM_MOMENTUM, tracked_statistics


def test_slow_statistics_follow_the_steps_while_the_server_trains_and_are_restored():
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8, momentum=0.01), nn.ReLU(),
                          nn.BatchNorm1d(8, momentum=None), nn.BatchNorm1d(8, momentum=0.3))
    with tracked_statistics(model):
        assert [m.momentum for m in model[1:] if hasattr(m, "momentum")] == [
            MIN_NORM_MOMENTUM, MIN_NORM_MOMENTUM, 0.3]
    assert [model[1].momentum, model[3].momentum, model[4].momentum] == [0.01, None, 0.3]


def test_a_bfloat16_model_is_refused_before_any_round():
    with pytest.raises(ValueError, match="bfloat16 tensors, which Flower's ArrayRecord"):
        dq_flower.DQStrategy(nn.Linear(4, 2).to(torch.bfloat16))


def test_nodes_that_score_get_the_servers_batch_norm_statistics_with_its_weights():
    import numpy as np
    from flwr.app import ArrayRecord
    from sklearn.datasets import load_digits

    from dq_flower.harness.inprocess import InProcessGrid

    x, y = load_digits(return_X_y=True)
    x, y = np.tile((x / 16).astype(np.float32), (3, 1)), np.tile(y, 3)  # round 2 scores

    def net() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(64, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 10))

    seen: dict[int, torch.Tensor] = {}

    def train(msg, context):
        part = int(context.node_config["partition-id"])
        mine = net()  # the node's own copy: statistics 0 and 1 until the server's arrive
        reply = dq_flower.client.dq_train(msg, context, (x[part::2], y[part::2]), model=mine)
        seen[int(msg.content["config"]["server-round"])] = mine[1].running_mean.clone()
        return reply

    model = net()
    strategy = dq_flower.DQStrategy(model, seed=0)
    strategy.start(grid=InProcessGrid(train, 2), initial_arrays=ArrayRecord(model.state_dict()),
                   num_rounds=2)
    # round 2 scored with the model round 1 trained: its statistics, not the fresh zeros
    assert seen[2].abs().sum() > 0
