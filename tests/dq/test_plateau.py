"""Training to a plateau: the stopping rule on hand-made score curves, and one real phase."""

import numpy as np
import pytest
import torch

from dq_flower.dq.server.plateau import (
    HeldOutScores,
    PlateauRule,
    PlateauTracker,
    progress_of,
    score_of,
    train_phase,
)


def _each(step):
    """``steps(n)`` from a one-step function."""
    return lambda n: [step() for _ in range(n)]


def _run(scores, **rule):
    tracker = PlateauTracker(PlateauRule(**{"min_delta": 0.0, **rule}))
    return [tracker.observe(i, s)[1] for i, s in enumerate(scores)]


def test_progress_resets_the_patience():
    assert _run([0.1, 0.2, 0.2, 0.3, 0.3], patience=2, lr_drops=0) == [
        "progress", "progress", "wait", "progress", "wait"]


def test_patience_running_out_drops_the_lr_then_stops():
    actions = _run([0.5, 0.4, 0.4, 0.4, 0.4, 0.4, 0.4], patience=2, lr_drops=2)
    assert actions == ["progress", "wait", "drop", "wait", "drop", "wait", "stop"]


def test_a_gain_below_min_delta_is_no_progress():
    assert _run([0.5, 0.5005, 0.52], patience=5, min_delta=0.001) == [
        "progress", "wait", "progress"]


def test_a_better_score_without_progress_snapshots_but_does_not_reset_the_patience():
    # held-out loss 0.500, then 0.498 and 0.497 (under 1% lower), 90 rows right throughout
    tracker = PlateauTracker(PlateauRule(patience=2, lr_drops=0))
    nodes = np.zeros(100, dtype=np.uint64)
    right = np.arange(100) < 90
    for step, loss, expected in ((50, 0.500, (True, "progress")), (100, 0.498, (True, "wait")),
                                 (150, 0.497, (True, "stop"))):
        scores = HeldOutScores(np.full(100, loss), right, nodes)
        assert tracker.observe(step, scores.score, progress_of(scores)) == expected
    assert tracker.best_step == 150


def test_one_more_row_right_or_a_one_percent_lower_loss_is_progress():
    tracker = PlateauTracker(PlateauRule(patience=1, lr_drops=0))
    nodes = np.zeros(100, dtype=np.uint64)

    def observe(loss, right):
        scores = HeldOutScores(np.full(100, loss), np.arange(100) < right, nodes)
        return tracker.observe(0, scores.score, progress_of(scores))[1]

    assert observe(0.50, 90) == "progress"
    assert observe(0.52, 91) == "progress"  # a row more, at a higher loss
    assert observe(0.494, 91) == "progress"  # 1.2% below the lowest loss (0.50)
    assert observe(0.492, 91) == "stop"  # 0.4% lower, no new row


def test_progress_counts_held_out_rows_and_the_loss_in_one_percent_steps():
    nodes = np.zeros(4, dtype=np.uint64)
    right = HeldOutScores(np.full(4, 0.3), np.array([1, 1, 0, 1], bool), nodes)
    assert progress_of(right)[1] == 3.0
    base = progress_of(HeldOutScores(np.full(4, 1.0), None, nodes))
    step = progress_of(HeldOutScores(np.full(4, 0.99), None, nodes))
    assert len(base) == 1 and step[0] - base[0] == pytest.approx(1.0)  # a 1% lower loss
    assert progress_of(HeldOutScores(np.full(4, np.nan), None, nodes)) == (-np.inf,)


def test_class_score_is_accuracy_with_the_loss_as_tie_break():
    nodes = np.zeros(4, dtype=np.uint64)
    a = HeldOutScores(np.array([0.1, 0.1, 0.1, 3.0]), np.array([1, 1, 1, 0], bool), nodes)
    b = HeldOutScores(np.array([0.2, 0.2, 0.2, 3.0]), np.array([1, 1, 1, 0], bool), nodes)
    c = HeldOutScores(np.full(4, 2.0), np.array([1, 1, 1, 1], bool), nodes)
    assert score_of(c) > score_of(a) > score_of(b)
    assert score_of(a) == pytest.approx(0.75, abs=1e-3)
    flat = HeldOutScores(np.array([1.0, 3.0]), None, nodes[:2])
    assert score_of(flat) == -2.0


def test_a_phase_ends_at_its_best_snapshot_and_restores_the_lr():
    torch.manual_seed(0)
    model = torch.nn.Linear(1, 1, bias=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    target = 1.0
    # the held-out score is best when the weight is nearest 1.0; the steps overshoot it
    def step():
        with torch.no_grad():
            model.weight += 0.3
        return 0.0

    def evaluate():
        err = abs(float(model.weight) - target)
        return HeldOutScores(np.array([err]), None, np.zeros(1, dtype=np.uint64))

    with torch.no_grad():
        model.weight.fill_(0.0)
    rule = PlateauRule(eval_every=1, patience=2, lr_drops=1, max_steps=50)
    result = train_phase(model, opt, 0.1, rule, _each(step), evaluate)
    assert float(model.weight) == pytest.approx(0.9)  # 3 steps: the best of 0, 0.3, ..., 2.1
    assert result.best_step == 3 and result.lr_drops == 1 and result.steps == 7
    assert opt.param_groups[0]["lr"] == 0.1
    assert result.initial.loss[0] == pytest.approx(1.0)
    assert result.final.loss[0] == pytest.approx(0.1)


def test_a_phase_never_takes_more_than_max_steps():
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    calls = []
    counter = iter(range(10_000))

    def evaluate():  # always improving: only the cap stops it
        return HeldOutScores(np.array([1.0 / (1 + next(counter))]), None,
                             np.zeros(1, dtype=np.uint64))

    result = train_phase(model, opt, 0.1, PlateauRule(eval_every=30, max_steps=100),
                         _each(lambda: calls.append(1) or 0.0), evaluate)
    assert result.steps == 100 and len(calls) == 100


def test_lr_drops_reach_the_optimizer():
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    seen = []

    def step():
        seen.append(opt.param_groups[0]["lr"])
        return 0.0

    constant = HeldOutScores(np.array([1.0]), None, np.zeros(1, dtype=np.uint64))
    train_phase(model, opt, 0.5, PlateauRule(eval_every=1, patience=1, lr_drops=2,
                                             lr_factor=0.1), _each(step),
                lambda: constant)
    # the first trained score is the phase's first best; then every score is a plateau
    assert seen == pytest.approx([0.5, 0.5, 0.05, 0.005])


@pytest.mark.parametrize("kwargs", [{"eval_every": 0}, {"patience": 0}, {"max_steps": 0},
                                    {"lr_drops": -1}, {"lr_factor": 1.0}])
def test_bad_rules_are_refused(kwargs):
    with pytest.raises(ValueError):
        PlateauRule(**kwargs)


def test_a_phase_keeps_trained_weights_even_when_the_start_scored_better():
    model = torch.nn.Linear(1, 1, bias=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch.no_grad():
        model.weight.fill_(1.0)  # the best the held-out score can see

    def step():
        with torch.no_grad():
            model.weight += 0.1
        return 0.0

    def evaluate():
        err = abs(float(model.weight) - 1.0)
        return HeldOutScores(np.array([err]), None, np.zeros(1, dtype=np.uint64))

    result = train_phase(model, opt, 0.1, PlateauRule(eval_every=2, patience=1, lr_drops=0),
                         _each(step), evaluate)
    assert float(model.weight) == pytest.approx(1.2)  # the first trained snapshot
    assert result.initial.loss[0] == 0.0 and result.final.loss[0] == pytest.approx(0.2)
