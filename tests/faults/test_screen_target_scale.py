"""The agreement screen reads float targets at their own scale.

Five machines send vibration windows to a model that forecasts the next window: two tones
and a little sensor noise, at each machine's amplitude. One healthy machine's targets are
40 times larger in mean square (its amplitude 6.3 times the others'); its forecast error is
as much larger, and the screen, reading the absolute loss, excluded it (a user's five
machines at 0.05 g to 4 g, an autoencoder, lost the two loudest: ROC AUC 0.763 against
0.789 with the screen off). A machine whose targets are other windows' is still excluded,
a loud one too.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from flwr.app import ArrayRecord, Message
from torch import nn

import dq_flower
from dq_flower.dq.server.node_screen import AgreementScreen, scale_factors
from dq_flower.dq.server.plateau import HeldOutScores
from dq_flower.harness.inprocess import InProcessGrid

from .digits_attack import honest, wire

LEN, ROWS, NODES = 32, 300, 5
LOUD = (1.0, 1.0, 1.0, 1.0, math.sqrt(40.0))


def windows(node: int, amplitude: float) -> tuple[np.ndarray, np.ndarray]:
    """``ROWS`` windows of two tones at random phases plus noise and the windows after them."""
    rng = np.random.default_rng(node)
    t = np.arange(2 * LEN)
    phase = rng.uniform(0, 2 * np.pi, (ROWS, 2))
    x = (np.sin(0.4 * t + phase[:, :1]) + 0.5 * np.sin(1.1 * t + phase[:, 1:])
         + 0.05 * rng.standard_normal((ROWS, 2 * LEN)))
    x = (amplitude * x).astype(np.float32)
    return x[:, :LEN], x[:, LEN:]


def run(amplitudes: tuple[float, ...], shuffled: int | None = None, rounds: int = 3):
    """The strategy after ``rounds`` rounds; ``shuffled``: the node whose targets are others'."""

    def app(msg: Message, context) -> Message:
        k = int(context.node_config["partition-id"])
        x, y = windows(k, amplitudes[k])
        y = y[np.random.default_rng(99).permutation(ROWS)] if k == shuffled else y
        return Message(wire(honest(msg, context, (x, y))), reply_to=msg)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(LEN, 4), nn.Linear(4, LEN))
    strategy = dq_flower.DQStrategy(model, seed=0)
    strategy.start(grid=InProcessGrid(app, NODES), initial_arrays=ArrayRecord(model.state_dict()),
                   num_rounds=rounds)
    return strategy


def test_a_healthy_node_of_40_times_larger_targets_is_not_excluded():
    screen = run(LOUD).trainer.screen
    assert screen.excluded == {}
    assert 4 in screen.cleared  # judged by its loss, and kept: at the others' scale it fits


def test_a_node_whose_targets_disagree_is_still_excluded_beside_a_loud_one():
    screen = run(LOUD, shuffled=0).trainer.screen
    assert set(screen.excluded) == {0}
    loud = run(LOUD, shuffled=4).trainer.screen
    assert set(loud.excluded) == {4}


def test_scale_factors_read_larger_targets_at_the_median_scale():
    nodes = np.repeat(np.arange(4, dtype=np.uint64), 10)
    scale = np.repeat([1.0, 2.0, 0.01, 8.0], 10)
    scores = HeldOutScores(np.repeat([0.1, 0.2, 0.1, 0.8], 10), None, nodes, scale=scale)
    assert scale_factors(scores, [0, 1, 2, 3]) == {1: 0.75, 3: 1.5 / 8}
    assert scale_factors(HeldOutScores(scores.loss, None, nodes), [0, 1, 2, 3]) == {}
    assert AgreementScreen().verdicts(scores, scaled=True)[3].excess < 0.4
