"""A round whose phase was reverted reports the held-out scores of the model it kept.

Its ``holdout-loss`` and ``holdout-acc`` were the discarded phase's (a round judged worse
beyond noise reported the worse model's figures beside ``reverted: 1``).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from dq_flower.dq.server.plateau import HeldOutScores, PhaseResult
from dq_flower.dq.server.round_metrics import RoundMetrics


def _scores(right: list[bool], loss: float) -> HeldOutScores:
    return HeldOutScores(np.full(len(right), loss), np.array(right), np.zeros(len(right)))


def _report(reverted: bool) -> dict:
    phase = PhaseResult(evaluations=3, initial=_scores([True, True, True, False], 0.4))
    phase.final = _scores([True, False, False, False], 1.5)
    schedule = SimpleNamespace(next_total=8, done=False, reason="", probe_after=0, curve=[])
    trainer = SimpleNamespace(schedule=schedule, last_phase=phase, reverted=reverted,
                              idle=SimpleNamespace(ran=False, kept=False))
    data = SimpleNamespace(store=None)
    return RoundMetrics(None, data, None, trainer).schedule()  # type: ignore[arg-type]


def test_a_reverted_round_reports_the_model_it_kept():
    kept = _report(reverted=True)
    assert kept["reverted"] == 1
    assert kept["holdout-acc"] == 0.75 and kept["holdout-loss"] == 0.4


def test_a_kept_phase_reports_its_own_scores():
    report = _report(reverted=False)
    assert report["reverted"] == 0
    assert report["holdout-acc"] == 0.25 and report["holdout-loss"] == 1.5
