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
    # every node exhausted: the run ends early, and no later round uploads a byte
    assert rows[-1]["ended_early"] and rows[-1]["schedule_done"] == 2
    assert all(r["cum_up_bytes"] == rows[0]["cum_up_bytes"] for r in rows)
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
    # then every node has sent all it has, sampled this round or not: the run ends early
    assert rows[-1]["schedule_done"] == 2 and rows[-1]["ended_early"] and len(rows) < 8


def test_the_schedule_is_a_knob_value_checked_by_name():
    assert DQConfig(upload_schedule="all").uploads_all
    assert not DQConfig().uploads_all
    with pytest.raises(ValueError, match="upload-schedule"):
        DQConfig(upload_schedule="everything")
