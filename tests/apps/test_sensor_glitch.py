"""A node with a few honest outliers (``sensor_glitch``): its rows within the bound are kept.

The value bound (10 times the first round's median scale) refused the plant whose log has
3 glitched rows of 600 in every round: its reply's ranges covered the glitches, and the
server kept asking it and throwing its bytes away (39% of the run's uplink). A node so
refused is now asked for its rows within the bound (``value-bound`` in its config) and
codes them in ranges over those rows.
"""

from __future__ import annotations

import pytest
from flwr.app import ArrayRecord

import dq_flower
from dq_flower.dq.server.validation import data_scale
from dq_flower.harness.inprocess import InProcessGrid
from tests.apps import sensor_glitch as app
from tests.apps.runner import client_train


def test_a_scale_is_the_largest_absolute_value_its_ranges_reach():
    import numpy as np

    ranges = (np.array([-400.0, 0.0]), np.array([1400.0, 1.0]))  # [-400, 1000] and [0, 1]
    assert data_scale(np.zeros((0, 2)), ranges) == 1000.0  # |lo| + span said 1,800


def test_the_glitched_plants_rows_within_the_bound_are_stored_from_round_two():
    if not app.available():
        pytest.skip("needs scikit-learn")
    model = app.Net()
    strategy = dq_flower.DQStrategy(model, seed=0)
    result = strategy.start(grid=InProcessGrid(client_train(app, "dq"), app.NUM_NODES),
                            initial_arrays=ArrayRecord(model.state_dict()), num_rounds=4)
    rejected = [result.evaluate_metrics_serverapp[r]["rejected"] for r in range(1, 5)]
    assert rejected == [1, 0, 0, 0]  # round 1 learns the bound; then the plant is asked within it
    bound = strategy.data.value_bound
    outside = sum(abs(reading) > bound for _, reading in app.GLITCHES)
    examples, sent = strategy.data.sent[0]  # plant 0 (its identity: its partition id)
    assert outside >= 1 and examples == 600 and sent == 600 - outside  # every row within
