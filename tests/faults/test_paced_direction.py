"""A node that paces its reversals around the direction screen's warm-up and window.

One node of five sends -4x its update (reversed, four times the honest step) in rounds
1-3 and 18-20 only, honest in between: the warm-up let its first rounds through and its
honest rounds kept its mean cosine above ``min-cosine`` at the end. Against-the-round
updates are now held to the round's median weight, and those above twice the median norm
to the median norm, whatever the node's history; and the wrapper's ``clip-factor`` is 2 by
default, so no update moves the mean by more than twice an honest one from round 1.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord
from flwr.serverapp.strategy import FedAvg

import dq_flower
from dq_flower.harness.inprocess import InProcessGrid
from dq_flower.server.robust import DirectionScreen, clip_to_median, hold_against
from tests.compression import digits_app
from tests.compression.digits_app import Net, make_app

#: fp16: little coding noise, so that what the run ends at is the attack's doing
FP16 = {"codec": "fp16"}
PACED = frozenset({1, 2, 3, 18, 19, 20})


@pytest.fixture(autouse=True)
def _quiet():
    logging.getLogger("flwr").setLevel(logging.WARNING)
    yield
    logging.getLogger("flwr").setLevel(logging.INFO)


def _central(server_round: int, arrays: ArrayRecord) -> MetricRecord:
    model = Net()
    model.load_state_dict(arrays.to_torch_state_dict())
    loss, acc = digits_app.test(model)
    return MetricRecord({"accuracy": acc, "loss": loss})


def _accuracy(hostile_rounds: frozenset[int] | None, rounds: int = 20, **knobs) -> float:
    torch.manual_seed(0)
    model = Net()
    strategy = dq_flower.CompressedUpdates(FedAvg(fraction_evaluate=0.0), **FP16, **knobs)
    app = make_app([dq_flower.compression_mod], None if hostile_rounds is None else -4.0,
                   hostile_rounds)
    result = strategy.start(grid=InProcessGrid(app, 5),
                            initial_arrays=ArrayRecord(model.state_dict()),
                            num_rounds=rounds, train_config=ConfigRecord({"lr": 0.05}),
                            evaluate_fn=_central)
    # the mean of the last three rounds: the attack's last rounds, less one round's noise
    return float(np.mean([result.evaluate_metrics_serverapp[r]["accuracy"]
                          for r in range(rounds - 2, rounds + 1)]))


def test_reversals_paced_around_the_warm_up_and_the_window_do_not_wreck_the_model():
    # mean of rounds 18-20 before: 74.4% against the control's 85.3% (in the mean in rounds
    # 1, 2, 18 and 20)
    control = _accuracy(None)
    paced = _accuracy(PACED)
    assert paced >= control - 0.05, (paced, control)


def test_a_large_reversed_vector_is_held_to_the_median_norm_and_weight():
    ones = np.ones(4, dtype=np.float32)
    vectors = [ones, 2 * ones, 3 * ones, -40 * ones]
    held, weights = hold_against(vectors, [1.0, 2.0, 3.0, 1e6], [False, False, False, True])
    assert held[:3] == vectors[:3] and weights[:3] == [1.0, 2.0, 3.0]
    median = float(np.median([np.linalg.norm(v) for v in vectors]))
    assert np.isclose(np.linalg.norm(held[3]), median) and held[3][0] < 0
    assert weights[3] == 2.5
    # an update against the round at under twice the median norm keeps its size
    small, _ = hold_against(vectors[:3] + [-4 * ones], [1.0] * 4, [False] * 3 + [True])
    assert np.array_equal(small[3], -4 * ones)  # norm 8, median 5
    screen = DirectionScreen(min_cosine=-0.1)
    screen.keep([1, 2, 3, 4], clip_to_median(vectors, 1.0))  # as bound_vectors does
    assert screen.against == [False, False, False, True]
