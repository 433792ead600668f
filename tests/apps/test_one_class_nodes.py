"""A round whose new rows add less than 1% to the store trains no phase (``one_class_nodes``)."""

from __future__ import annotations

import logging
import re

import pytest

from dq_flower.dq.server.schedule import MIN_GROWTH, AdaptiveSchedule
from tests.apps import one_class_nodes
from tests.apps.runner import run_app

ROUND_LINE = re.compile(r"\[dq\] round (\d+): (\d+) new samples, store (\d+), "
                        r".*?(\d+) server steps")


def test_growth_below_a_hundredth_of_the_store_is_not_worth_a_phase():
    assert MIN_GROWTH == 0.01
    assert AdaptiveSchedule.grew_enough(14, 1400) and not AdaptiveSchedule.grew_enough(13, 1400)
    assert AdaptiveSchedule.grew_enough(1, 50)  # one row is always enough in a small store
    assert not AdaptiveSchedule.grew_enough(0, 50)


@pytest.fixture(scope="module")
def runs():
    logger = logging.getLogger("flwr")
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    logger.addHandler(handler)
    try:
        dq = run_app(one_class_nodes, "dq")
    finally:
        logger.removeHandler(handler)
    rounds = [tuple(int(g) for g in m.groups()) for m in map(ROUND_LINE.search, lines) if m]
    return dq, run_app(one_class_nodes, "fedavg"), rounds


def test_only_rounds_that_grow_the_store_enough_train(runs):
    _, _, rounds = runs
    assert [r[0] for r in rounds] == [1, 2, 3, 4, 5, 6]
    small = [r for r in rounds if 0 < r[1] < MIN_GROWTH * r[2]]
    assert small, rounds  # the late rounds bring one row each: the rule is exercised
    for _, new, stored, steps in rounds:
        assert (steps > 0) == (new >= max(MIN_GROWTH * stored, 1)), rounds


def test_dq_learns_every_digit_where_fedavg_cannot_yet(runs):
    dq, fedavg, _ = runs
    assert dq.final > 0.88 and dq.final > fedavg.final + 0.15
    assert dq.up_bytes < fedavg.up_bytes / 10
