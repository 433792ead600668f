"""A round whose new rows add less than 1% to the store trains no phase (``one_class_nodes``)."""

from __future__ import annotations

import logging
import re

import pytest

from dq_flower.dq.server.schedule import MIN_GROWTH, AdaptiveSchedule, PairedGain
from tests.apps import one_class_nodes
from tests.apps.runner import run_app

ROUND_LINE = re.compile(r"\[dq\] round (\d+): (\d+) new samples, store (\d+), "
                        r".*?(\d+) server steps")


def test_growth_below_a_hundredth_of_the_store_is_not_worth_a_phase():
    assert MIN_GROWTH == 0.01
    assert AdaptiveSchedule().grew_enough(14, 1400)
    assert AdaptiveSchedule().grew_enough(1, 50)  # one row is enough in a small store
    assert not AdaptiveSchedule().grew_enough(0, 50)


def test_rows_of_rounds_that_trained_none_add_up_and_count_in_the_next_growth():
    schedule = AdaptiveSchedule()
    assert not schedule.grew_enough(13, 1400) and not schedule.grew_enough(0, 1400)
    assert schedule.unseen == 13
    again = AdaptiveSchedule()
    again.load_state(schedule.state())  # kept by a checkpoint
    assert again.unseen == 13
    assert schedule.grew_enough(5, 1418)  # 13 + 5 rows: 1.3% of the store
    assert schedule.unseen == 0 and schedule.behind == 13
    schedule.after_upload(1413, 1418, None)  # the first comparison: grows from before the 13
    assert schedule.behind == 0 and schedule.curve[-1]["stored"] == 1418.0


def test_the_growth_a_gain_is_divided_by_starts_at_the_last_phase():
    gain = PairedGain(gain=0.02, stderr=0.001, error_before=0.12, error_after=0.1, rows=400)
    plain, late = AdaptiveSchedule(), AdaptiveSchedule()
    plain.after_upload(1000, 1000 + 100, gain)
    late.unseen = 40
    assert late.grew_enough(60, 1100)  # 40 rows of a round that trained none, then 60
    late.after_upload(1040, 1100, gain)
    assert late.evidence == plain.evidence  # both: a growth from 1,000 to 1,100 rows


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
    unseen = 0  # rows of rounds that trained none add up
    for _, new, stored, steps in rounds:
        unseen += new
        assert (steps > 0) == (unseen >= max(MIN_GROWTH * stored, 1)), rounds
        unseen = 0 if steps else unseen


def test_dq_learns_every_digit_where_fedavg_cannot_yet(runs):
    dq, fedavg, _ = runs
    assert dq.final > 0.88 and dq.final > fedavg.final + 0.15
    assert dq.up_bytes < fedavg.up_bytes / 10
