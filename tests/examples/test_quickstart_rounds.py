"""The README's ``simulate`` quickstart asks for 5 rounds and shows 0-3: the log says why."""

from __future__ import annotations

import logging

from tests.dq.helpers import run_inprocess


def test_a_run_that_ends_early_says_so_in_its_log(caplog):
    # examples/quickstart.py's run on the in-process grid: every row stored by round 2, so
    # round 3 asks for nothing and the run stops two rounds short of rounds=5
    with caplog.at_level(logging.INFO, logger="flwr"):
        result, _ = run_inprocess(num_clients=4, rounds=5, seed=0, budget=64, bits=2)
    assert [row["round"] for row in result.history] == [0, 1, 2, 3]
    said = [r.getMessage() for r in caplog.records if "ended early" in r.getMessage()]
    assert said == ["[dq] ended early after round 3: the adaptive upload schedule stopped "
                    "asking and the server's training reached its plateau"], said
