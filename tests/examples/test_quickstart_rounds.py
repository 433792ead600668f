"""The README's ``simulate`` quickstart asks for 5 rounds: rounds 3 and 4 ask for nothing and
round 5 probes one client; without probes the run ends early and its log says why. The
README and docs/method.md show this run's history and its round-2 log line."""

from __future__ import annotations

import logging
import re

from tests.dq.helpers import run_inprocess
from tests.test_docs import ALL_BLOCKS, _documented_output

#: examples/quickstart.py's run on the in-process grid
QUICKSTART = dict(num_clients=4, rounds=5, seed=0, budget=64, bits=2)


def test_every_row_stored_by_round_2_then_one_probe_in_round_5(caplog):
    with caplog.at_level(logging.INFO, logger="flwr"):
        result, _ = run_inprocess(**QUICKSTART)
    # docs/method.md shows this run's round-2 line, as its own text block
    line = next(r.getMessage() for r in caplog.records
                if r.getMessage().startswith("[dq] round 2: "))
    assert any(b.code.strip() == line for b in ALL_BLOCKS
               if b.path == "docs/method.md" and b.lang == "text"), line
    rows = result.history
    assert [row["round"] for row in rows] == [0, 1, 2, 3, 4, 5]
    assert [row.get("replies") for row in rows[1:]] == [4, 4, 0, 0, 1]
    assert rows[5]["selected"] == 0 and rows[5]["up_bytes"] > 0
    # nothing new: round 3 trains on the rows stored, round 4 finds no more, none after
    assert rows[5]["accuracy"] == rows[3]["accuracy"] > rows[2]["accuracy"]
    assert [row["server_steps"] > 0 for row in rows[1:]] == [True] * 4 + [False]
    # the README prints this history (examples/quickstart.py in Flower's simulation engine,
    # which tests/test_install.py runs with -m slow): the in-process grid gives the same
    block = next(b for b in ALL_BLOCKS if b.path == "README.md"
                 and b.code.startswith("# examples/quickstart.py"))
    printed = [f"{row['round']:>5}  {row['accuracy']:8.3f}  {row['up_bytes']:8d}  "
               f"{row['down_bytes']:10d}  {row['cum_up_bytes']:12d}" for row in rows]
    assert "\n".join(printed) in _documented_output(block), printed


def test_a_run_that_ends_early_says_so_in_its_log(caplog):
    # every row stored by round 2, so round 3 asks for nothing and trains on the rows
    # stored, round 4 finds no more there and, without probes, the run stops one round
    # short of rounds=5
    with caplog.at_level(logging.INFO, logger="flwr"):
        result, _ = run_inprocess(**QUICKSTART, probe_after=0)
    assert [row["round"] for row in result.history] == [0, 1, 2, 3, 4]
    said = [r.getMessage() for r in caplog.records if "ended early" in r.getMessage()]
    assert said == ["[dq] ended early after round 4: the adaptive upload schedule stopped "
                    "asking and the server's training reached its plateau"], said


def test_the_deploy_pages_round_lines_are_the_in_process_runs():
    # docs/deploy.md shows `dq-flower deploy local --nodes 2 --rounds 2` (a TLS deployment,
    # minutes); its rounds' accuracy and uplink are the in-process run's (the downlink, the
    # package app's round config, differs)
    block = next(b for b in ALL_BLOCKS if b.path == "docs/deploy.md"
                 and b.code.startswith("$ dq-flower deploy local --nodes 2 --rounds 2"))
    shown = re.findall(r"^round (\d+): accuracy ([\d.]+), up (\d+) B", block.code, re.M)
    result, _ = run_inprocess(num_clients=2, rounds=2, seed=0)
    assert shown == [(str(row["round"]), f"{row['accuracy']:.4f}", str(row["up_bytes"]))
                     for row in result.history], shown
