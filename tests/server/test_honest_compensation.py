"""Honest compensations are not rejected when the server trains far between uploads.

With ``compensation-mode = "store"`` and thousands of server steps per round the honest
clients' error-feedback compensations grow several-fold from one round to the next; the
norm screen's old bound (5x the recent median) rejected every one of them in rounds 2-4.
"""

from __future__ import annotations

import pytest

from tests.dq.helpers import run_inprocess


@pytest.mark.slow
def test_ef_sign_compensations_under_long_server_training_are_all_accepted():
    result, _ = run_inprocess(num_clients=3, rounds=4, compensation="ef-sign",
                              compensation_mode="store", server_steps=2500,
                              upload_schedule="fixed")
    assert [r["rejected"] for r in result.history[1:]] == [0, 0, 0, 0]


def test_ef_sign_compensations_after_a_long_training_phase_are_accepted():
    result, _ = run_inprocess(num_clients=3, rounds=2, compensation="ef-sign",
                              compensation_mode="store", server_steps=2500,
                              upload_schedule="fixed")
    assert [r["rejected"] for r in result.history[1:]] == [0, 0]
