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
