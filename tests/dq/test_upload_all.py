"""The ``upload-all`` baseline: every node uploads all its rows once, trained to a plateau."""

import pytest

from dq_flower.config import read
from dq_flower.dq.config import DQConfig
from dq_flower.harness.methods import get_method

from .helpers import run_inprocess

_DIGITS_TRAIN_ROWS = 1437  # the harness's digits: 80% of 1,797 rows for training


def _rows(result):
    return [r for r in result.history if r["round"] >= 1]


@pytest.mark.parametrize("method, bits", [("upload-all", 2), ("upload-all-8bit", 8)])
def test_every_row_arrives_in_the_first_round_and_nothing_is_asked_after(method, bits):
    result, _ = run_inprocess(method=method, num_clients=3, rounds=4, max_server_steps=200,
                              max_server_epochs=1)
    rows = _rows(result)
    assert rows[0]["selected"] == rows[0]["stored"] == _DIGITS_TRAIN_ROWS
    # every node exhausted: round 2 asks none, round 3 waits, round 4 probes one node,
    # which has no new row
    assert [r["schedule_done"] for r in rows] == [0, 2, 2, 2]
    assert [r["replies"] for r in rows] == [3, 0, 0, 1] and rows[3]["selected"] == 0
    assert rows[2]["cum_up_bytes"] == rows[0]["cum_up_bytes"] < rows[3]["cum_up_bytes"]
    assert result.history[-1]["accuracy"] > 0.85
    assert read(get_method(method).config_cls, {}).bits == (bits if bits != 2 else 0)


def test_each_round_samples_the_nodes_that_still_hold_rows():
    """Half the nodes a round: the second round samples the other half, not a used one."""
    result, _ = run_inprocess(method="upload-all", num_clients=8, rounds=8,
                              fraction_train=0.25, max_server_steps=100,
                              max_server_epochs=1)
    rows = _rows(result)
    stored = [r["stored"] for r in rows]
    assert all(r["replies"] == 2 for r in rows[:4]), [r["replies"] for r in rows]
    assert stored[0] < stored[1] < stored[2] < stored[3] == _DIGITS_TRAIN_ROWS
    # then every node has sent all it has, sampled this round or not: only probes follow
    assert rows[4]["schedule_done"] == 2 and rows[4]["replies"] == 0
    assert all(r["selected"] == 0 and r["replies"] <= 1 for r in rows[4:])


def test_without_probes_an_exhausted_run_ends_early():
    result, _ = run_inprocess(method="upload-all", num_clients=3, rounds=4, probe_after=0,
                              max_server_steps=200, max_server_epochs=1)
    rows = _rows(result)
    assert len(rows) == 2 and rows[-1]["ended_early"] and rows[-1]["schedule_done"] == 2
    assert rows[-1]["cum_up_bytes"] == rows[0]["cum_up_bytes"]


def test_the_schedule_is_a_knob_value_checked_by_name():
    assert DQConfig(upload_schedule="all").uploads_all
    assert not DQConfig().uploads_all
    with pytest.raises(ValueError, match="upload-schedule"):
        DQConfig(upload_schedule="everything")
