"""Nodes whose data grows every round (``growing_nodes``): DQ asks for the rows they gain
after they have sent all they held, and the ranges a node coded its rows in stay the ones
the server decodes them with."""

from __future__ import annotations

import logging
import re
from types import SimpleNamespace

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, RecordDict

from dq_flower.dq.client.sent import RANGES_STATE, coding_ranges
from dq_flower.dq.server.asks import RoundAsks
from dq_flower.dq.server.federation import FederationData
from tests.apps import growing_nodes
from tests.apps.runner import docs_text, run_app

ROUND_LINE = re.compile(r"\[dq\] round (\d+): (\d+) new samples, store (\d+)")


def _logged_run(kind: str):
    """A run of the app with ``kind``, and its DQ round lines ``(round, new, store)``."""
    logger = logging.getLogger("flwr")
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    logger.addHandler(handler)
    try:
        run = run_app(growing_nodes, kind)
    finally:
        logger.removeHandler(handler)
    return run, [tuple(int(g) for g in m.groups()) for m in map(ROUND_LINE.search, lines) if m]


@pytest.fixture(scope="module")
def runs():
    return _logged_run("dq"), _logged_run("upload-all"), run_app(growing_nodes, "fedavg")


@pytest.mark.parametrize("which", [0, 1], ids=["dq", "upload-all"])
def test_every_row_the_nodes_gain_arrives(runs, which):
    run, rounds = runs[which]
    last = growing_nodes.ROUNDS
    assert rounds[-1] == (last, 4 * 30, 4 * growing_nodes.rows_by(last)), rounds
    # round 1 takes all 4 x 120 rows; rounds 2 and 3 wait; round 4 probes one node (its 90
    # new rows) and finds the data growing; from round 5 every node is asked every round
    assert [r[1] for r in rounds] == [480, 0, 0, 90, 390, 120, 120], rounds
    assert set(run.up_by_round) == {1, 4, 5, 6, 7}


def test_dq_beats_fedavg_on_the_growing_data(runs):
    (dq, _), _, fedavg = runs
    assert dq.final > 0.89 and dq.final > fedavg.final + 0.1
    assert dq.up_bytes < fedavg.up_bytes / 10


def _context() -> Context:
    return Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})


def test_a_node_codes_in_the_ranges_it_sent_while_the_server_holds_them():
    rng = np.random.default_rng(0)
    first, grown = rng.uniform(0, 1, (50, 3)), rng.uniform(-1, 3, (80, 3))
    config, context = ConfigRecord({}), _context()
    sent = coding_ranges(context, config, first, 2, send=True)
    assert RANGES_STATE in context.state.array_records
    assert np.allclose(sent[0], first.min(0)) and np.allclose(sent[0] + sent[1], first.max(0))
    kept = coding_ranges(context, config, grown, 2, send=False)  # the server holds `sent`
    assert all(np.array_equal(a, b) for a, b in zip(kept, sent, strict=True))
    own = coding_ranges(context, config, grown, 2, send=True)  # asked again: its own now
    assert np.allclose(own[0], grown.min(0)) and not np.allclose(own[0], sent[0])
    # other bits, or nothing kept (a restarted node): its data's own ranges
    assert np.allclose(coding_ranges(context, config, first, 4, send=False)[0], first.min(0))
    assert np.allclose(coding_ranges(_context(), config, grown, 2, send=False)[0],
                       grown.min(0))


def test_the_plugin_page_quotes_these_runs(runs):
    (dq, _), _, fedavg = runs
    quoted = (f"DQ reached {dq.final:.1%} with {dq.up_bytes:,} uplink bytes, every row held "
              f"by round {growing_nodes.ROUNDS} stored, FedAvg {fedavg.final:.1%} with "
              f"{fedavg.up_bytes:,}")
    assert quoted in docs_text("plugin.md"), quoted


def test_only_a_node_that_sent_every_row_is_probed_or_taken_to_have_grown():
    asks = RoundAsks.__new__(RoundAsks)  # the method reads the federation and exclusions only
    asks.data, asks.trainer = FederationData(), SimpleNamespace(excluded={4})
    # node 2 is held back by node-rows-cap (0 left under it, 4,600 rows unsent); 4 excluded
    asks.data.sent = {1: [100, 100], 2: [5000, 400], 3: [100, 60], 4: [90, 90], 5: [80, 80]}
    left = {1: 0, 2: 0, 3: 40, 4: 0, 5: 0}
    assert asks.may_have_grown(left, None) == left  # no probe, nothing grown
    assert asks.may_have_grown(left, 1) == {**left, 1: None}  # the probes take turns
    assert asks.may_have_grown(left, 2) == {**left, 5: None}
    asks.data.grown = 20
    assert asks.may_have_grown(left, None) == {**left, 1: None, 5: None}
