"""Rounds that add less than 1% to the store train no phase; a node never heard from is
asked for no more than it is counted as holding (``one_class_nodes``)."""

from __future__ import annotations

import logging
import re

import pytest

from dq_flower.dq.server import asks
from dq_flower.dq.server.schedule import MIN_GROWTH, AdaptiveSchedule, PairedGain, allocate
from tests.apps import one_class_nodes
from tests.apps.runner import AppRun, run_app

ROUND_LINE = re.compile(r"\[dq\] round (\d+): (\d+) new samples, store (\d+), "
                        r".*?(\d+) server steps")
#: a round whose rows trained no phase of their own: one on the rows stored (idle_rounds)
ON_THE_STORE = "server steps on the rows stored"


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


def _dq_run(asks_of=None) -> tuple[AppRun, list[tuple[int, ...]]]:
    """DQ on the app (``asks_of``: in place of the schedule's ``allocate``), its round lines."""
    logger = logging.getLogger("flwr")
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    logger.addHandler(handler)
    patch = pytest.MonkeyPatch()
    if asks_of is not None:
        patch.setattr(asks, "allocate", asks_of)
    try:
        run = run_app(one_class_nodes, "dq")
    finally:
        patch.undo()
        logger.removeHandler(handler)
    return run, [(*(int(g) for g in m.groups()), int(ON_THE_STORE in line))
                 for line in lines if (m := ROUND_LINE.search(line))]


def _five_rows_of_one_node(total, left, fit, unknown=None):
    """The schedule's asks cut to 5 rows of the first node with rows left: rounds of 5 rows."""
    split = allocate(total, left, fit, unknown)
    first = min((k for k, v in left.items() if v), default=None)
    return {k: (min(a, 5) if k == first else 0) for k, a in split.items()}


@pytest.fixture(scope="module")
def runs():
    return _dq_run(), _dq_run(_five_rows_of_one_node), run_app(one_class_nodes, "fedavg")


def test_only_rounds_that_grow_the_store_enough_train(runs):
    _, (_, rounds), _ = runs
    assert [r[0] for r in rounds] == [1, 2, 3, 4, 5, 6]
    unseen = 0  # rows of rounds that trained none add up
    for _, new, stored, steps, on_the_store in rounds:
        unseen += new
        assert (steps > 0 and not on_the_store) == (unseen >= max(MIN_GROWTH * stored, 1)), \
            rounds
        unseen = 0 if steps and not on_the_store else unseen
    small = [r for r in rounds if 0 < r[1] < MIN_GROWTH * r[2]]  # 5 rows of about 920
    assert any(r[3] == 0 for r in small) and any(r[3] > 0 for r in small), rounds


def test_a_node_never_heard_from_does_not_take_the_others_asks(runs):
    (_, rounds), _, _ = runs
    # the empty node fails every round; the ten others hand in all their rows by round 2
    assert rounds[1][2] == 1400 and all(r[1] == 0 for r in rounds[2:]), rounds


def test_dq_learns_every_digit_where_fedavg_cannot_yet(runs):
    (dq, _), _, fedavg = runs
    assert dq.final > 0.88 and dq.final > fedavg.final + 0.15
    assert dq.up_bytes < fedavg.up_bytes / 10
