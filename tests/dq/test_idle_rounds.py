"""Rounds whose new rows train no phase go on training on the store while that pays.

``upload-all`` stores every row in round 1 and nothing after: its later rounds trained
nothing, so a phase that stopped short of its plateau (its step cap) stayed there for the
whole run. They now train a fresh phase on the store from the kept model, kept where it
beats it on the held-out rows beyond noise; once one made no progress, the rounds after
train nothing until new rows come.
"""

from __future__ import annotations

import numpy as np
import torch

from dq_flower.dq.server.idle_rounds import IdleRounds
from dq_flower.dq.server.plateau import HeldOutScores, PhaseResult

from .helpers import run_inprocess


def _rows(result):
    return [r for r in result.history if r["round"] >= 1]


def test_a_phase_cut_short_by_its_step_cap_goes_on_in_the_rounds_without_new_rows():
    result, _ = run_inprocess(method="upload-all", num_clients=3, rounds=4, max_server_steps=50,
                              max_server_epochs=0.5)
    rows = _rows(result)
    assert rows[0]["stored"] == rows[-1]["stored"] and rows[1]["selected"] == 0
    assert all(r["server_steps"] == 50 for r in rows), [r["server_steps"] for r in rows]
    assert [r["idle_kept"] for r in rows[1:3]] == [1, 1], rows
    # measured: 89.7% after round 1, 94.4% and 94.7% after rounds 2 and 3 (before: 89.7%
    # in every round)
    assert rows[-1]["accuracy"] > rows[0]["accuracy"] + 0.03, [r["accuracy"] for r in rows]


def test_after_a_phase_on_the_unchanged_store_made_no_progress_the_rounds_train_nothing():
    result, _ = run_inprocess(method="upload-all", num_clients=3, rounds=6, max_server_steps=400,
                              max_server_epochs=1)
    rows = _rows(result)
    spent = next(i for i, r in enumerate(rows) if r.get("idle_kept") == 0)
    assert rows[spent]["server_steps"] > 0
    assert spent < len(rows) - 1 and all(r["server_steps"] == 0 for r in rows[spent + 1:])
    assert len({r["accuracy"] for r in rows[spent:]}) == 1  # the model kept: the one before


def _scores(right: int, loss: float, rows: int = 200) -> HeldOutScores:
    correct = np.arange(rows) < right
    return HeldOutScores(np.where(correct, loss, 3 * loss), correct, np.zeros(rows, np.uint64))


def test_a_phase_that_lowers_the_loss_but_gets_fewer_rows_right_is_not_kept():
    """Held-out accuracy 0.810 -> 0.802 at a 6% lower loss (TF-IDF topics) was kept."""
    model = torch.nn.Linear(2, 1)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model.weight.add_(1.0)
    idle = IdleRounds()
    phase = PhaseResult(initial=_scores(162, 0.50), final=_scores(160, 0.40))
    idle.judge(phase, model, start, evidence=1.0, stored=1000)
    assert not idle.kept and idle.spent and phase.final is phase.initial
    assert torch.equal(model.weight, start["weight"])
    idle.grown(1099, 1.1)  # phases on new rows: the store a tenth larger, not before
    assert not idle.due()
    idle.grown(1100, 1.1)
    assert idle.due()
    phase = PhaseResult(initial=_scores(162, 0.50), final=_scores(175, 0.45))
    idle.judge(phase, model, start, evidence=1.0, stored=1100)
    assert idle.kept and not idle.spent
