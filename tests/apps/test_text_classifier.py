"""A text classifier's word ids through DQ at its defaults, beside Flower's FedAvg.

``tests/apps/austen_classifier.py`` (the novel a 24-word passage is from, six nodes, eight
rounds) is not in the zoo's verdict (``test_zoo.py``: DQ within two points of FedAvg):
DQ sends every passage exactly with about a twentieth of FedAvg's uplink, but its server
ends about six points lower (docs/plugin.md gives the figures). What this checks: every
node's ids reach the server (no reply refused), DQ learns well above chance, and its
uplink stays under a fifth of FedAvg's. The small version in CI is
``tests/text/test_id_samples.py``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.apps import austen_classifier as app
from tests.apps.runner import run_app

pytestmark = pytest.mark.slow


def test_dq_learns_the_novels_from_word_ids_with_a_fifth_of_fedavgs_uplink(monkeypatch):
    if not app.available():
        pytest.skip("Jane Austen's novels (r-cran-janeaustenr) or rdata are not installed")
    fedavg, dq = (run_app(app, kind) for kind in ("fedavg", "dq"))
    _, y = app.test_set()
    chance = float(np.bincount(y).max() / len(y))
    line = (f"FedAvg {fedavg.final:.3f} with {fedavg.up_bytes:,} B up; "
            f"DQ {dq.final:.3f} with {dq.up_bytes:,} B up; chance {chance:.3f}")
    print(line)
    assert line in (Path(__file__).parents[2] / "docs" / "plugin.md").read_text(), (
        "docs/plugin.md quotes another run of this app")
    assert fedavg.final > chance + 0.25
    assert dq.final > chance + 0.25, dq.scores
    assert 0 < dq.up_bytes <= fedavg.up_bytes / 5
    monkeypatch.setattr(app, "DQ_KNOBS", {"optimizer": "adam", "lr": 0.01}, raising=False)
    tuned = run_app(app, "dq")  # FedAvg's nodes' optimizer and step size on the server
    line = (f'With optimizer="adam", lr=0.01: DQ {tuned.final:.3f} with {tuned.up_bytes:,} B '
            "up.")
    print(line)
    assert line in (Path(__file__).parents[2] / "docs" / "plugin.md").read_text()
