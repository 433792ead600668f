"""Targets held as a ``(n, 1)`` column under the user's own loss and an ``(n, 1)`` output.

DQ sends a float target of one value a row as ``(n,)``; before the user's loss read it, it
is shaped as the model's outputs (``dq_flower.losses.as_outputs``). Without that, the
fraud app's every reply was refused by the model check (AUC stayed at the start's 0.616)
and the prices app's ``HuberLoss`` learned the batch's centre (the zoo runs that one).
"""

from __future__ import annotations

import pytest

from tests.apps import rare_fraud
from tests.apps.runner import docs_text, run_app
from tests.apps.test_zoo import runs  # the zoo's runs, made once per session


@pytest.mark.skipif(not rare_fraud.available(), reason="needs scikit-learn")
def test_column_labels_under_the_users_bce_train_every_round_as_fedavgs_do():
    fed, dq = run_app(rare_fraud, "fedavg"), run_app(rare_fraud, "dq")
    assert dq.scores[1] > dq.scores[0] + 0.05  # round 1's rows trained (refused before)
    # each reply trains (none refused) until the learning curve is flat (round 4: a pause)
    assert all(dq.up_by_round.get(r, 0) > 0 for r in range(1, 4))
    assert dq.final >= fed.final - 0.02, (dq.scores, fed.scores)
    assert dq.up_bytes * 5 <= fed.up_bytes
    assert 0.72 <= fed.final <= 0.74, fed.scores  # it swings by a point from run to run
    quoted = (f"ROC AUC {dq.scores[0]:.3f} at the start throughout, now {dq.final:.3f}\nwith "
              f"{dq.up_bytes:,} bytes against FedAvg's 0.72 to 0.74 (from run to run) with "
              f"{fed.up_bytes:,}")
    assert quoted.replace("\n", " ") in docs_text("plugin.md"), quoted


def test_the_prices_app_as_the_plugin_page_quotes_it():
    fed, dq = runs("huber_prices")["fedavg"], runs("huber_prices")["dq"]
    quoted = (f"now {dq.final:.1f} with\n{dq.up_bytes:,} uplink bytes against FedAvg's "
              f"{fed.up_bytes:,}")
    assert f"FedAvg's {fed.final:.1f}" in docs_text("plugin.md")
    assert quoted.replace("\n", " ") in docs_text("plugin.md"), quoted
