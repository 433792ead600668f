"""What one DQ round costs from replies to stored rows: Python calls and modules.

The server's side of round 2 of four digits clients (the fixed schedule, 16 rows each) is
traced (:mod:`tests.tracing`) with the round's training steps and its report (the metrics
read off the parts) left out: screening, decoding, the checks, the store. The bounds hold
the measured figures with a small margin and fail where the receive stage grows back
(before this test: 1,273 calls through 23 modules, the report included; 1,092 through 22
before a reply was checked in one pass; 819 through 22 while each knob read was a call;
750 through 19 while the upload planner kept what each client sent; 793 through 18 while
client identities had a module of their own; 798 through 17 while decoders opened payloads
through the codecs' base class and the round's asks were read back through their planner;
797 through 15 while the round's template and its screening were two modules).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from dq_flower.dq.server.round_metrics import RoundMetrics
from dq_flower.dq.server.strategy import DQStrategy
from dq_flower.dq.server.training import ServerTrainer
from dq_flower.harness.client_app import app as client_app
from dq_flower.harness.inprocess import InProcessGrid
from dq_flower.harness.methods import client_task_config
from dq_flower.harness.runtime import build_model, task_info
from dq_flower.harness.task_config import TaskConfig
from tests.tracing import Trace, trace

#: what is left out: the training steps and the round's report
LEFT_OUT = (ServerTrainer.train_round.__code__, ServerTrainer.train_gradient.__code__,
            RoundMetrics.data_round.__code__)


@pytest.fixture(scope="module")
def receive() -> tuple[Trace, dict]:
    """Round 2's trace and metrics (round 1 adopts the data spec: not the steady state)."""
    logging.getLogger("flwr").setLevel(logging.WARNING)
    try:
        task = TaskConfig(num_partitions=4, seed=3)
        strategy = DQStrategy(build_model(task, task_info(task)), seed=3,
                              upload_schedule="fixed", budget=16, server_steps=2)
        grid = InProcessGrid(client_app, 4)
        config = client_task_config(task, "dq")
        metrics: dict = {}
        for rnd in (1, 2):
            replies = list(grid.send_and_receive(list(strategy.configure_train(
                rnd, None, config, grid))))
            if rnd == 1:
                strategy.aggregate_train(1, replies)
        found = trace(lambda: metrics.update(strategy.aggregate_train(2, replies)[1]),
                      skip=LEFT_OUT)
    finally:
        logging.getLogger("flwr").setLevel(logging.INFO)
    return found, metrics


def test_the_round_stores_every_reply(receive):
    _, metrics = receive
    assert metrics["replies"] == 4 and metrics["rejected"] == 0
    assert metrics["selected"] == 64 and metrics["stored"] == 128


def test_the_training_steps_and_the_report_are_left_out(receive):
    found, _ = receive
    assert not {"dq/server/training.py", "dq/server/round_metrics.py"} & set(found.ours)


def test_a_round_from_replies_to_stored_rows_stays_within_its_calls(receive):
    found, _ = receive
    assert sum(found.ours.values()) <= 800, found.ours.most_common(8)  # measured: 797


def test_a_round_from_replies_to_stored_rows_goes_through_few_modules(receive):
    found, _ = receive
    assert len(found.ours) <= 14, sorted(found.ours)  # measured: 14


def _pictured() -> set[str]:
    """The modules the development page's picture of one upload's path names."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "development.md").read_text()
    block = page.split("<!-- upload-path:", 1)[1].split("```text", 1)[1].split("```", 1)[0]
    return set(re.findall(r"[a-z_/]+\.py", block))


def test_the_docs_picture_the_path_the_round_takes(receive):
    found, _ = receive
    pictured = _pictured()
    assert pictured == set(found.ours), (sorted(pictured - set(found.ours)),
                                         sorted(set(found.ours) - pictured))
