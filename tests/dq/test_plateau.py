"""Training to a plateau: the stopping rule on hand-made score curves, and one real phase."""

import numpy as np
import pytest
import torch

from dq_flower.dq.server.plateau import (
    HeldOutScores,
    PlateauRule,
    PlateauTracker,
    beyond_noise,
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
    assert actions == ["progress", "wait", "drop", "drop", "stop"] + ["stop"] * 2


def test_after_a_drop_the_patience_is_halved_rounded_up():
    flat = [0.5] + [0.4] * 12
    assert _run(flat, patience=4, lr_drops=1)[:9] == [
        "progress", "wait", "wait", "wait", "drop", "wait", "stop", "stop", "stop"]
    assert _run(flat, patience=3, lr_drops=1)[:6] == [
        "progress", "wait", "wait", "drop", "wait", "stop"]
    # progress after the drop: the halved patience starts over
    assert _run([0.5, 0.4, 0.4, 0.6, 0.6, 0.6], patience=2, lr_drops=1) == [
        "progress", "wait", "drop", "progress", "stop", "stop"]
    assert [PlateauRule(patience=p).patience_now(d) for p, d in
            ((4, 0), (4, 1), (3, 1), (1, 1), (5, 2))] == [4, 2, 2, 1, 3]


def test_a_gain_below_min_delta_is_no_progress():
    assert _run([0.5, 0.5005, 0.52], patience=5, min_delta=0.001) == [
        "progress", "wait", "progress"]


def _observe(tracker, step, scores):
    """What ``train_phase`` does with one evaluation."""
    progressed = beyond_noise(scores, tracker.mark, tracker.rule.evidence)
    if progressed:
        tracker.mark = scores
    return tracker.observe(step, scores.score, progressed)


def test_a_better_score_without_progress_snapshots_but_does_not_reset_the_patience():
    # held-out loss 0.500, then 0.498 and 0.497 (under 1% lower), 90 rows right throughout
    tracker = PlateauTracker(PlateauRule(patience=2, lr_drops=0))
    nodes = np.zeros(100, dtype=np.uint64)
    right = np.arange(100) < 90
    for step, loss, expected in ((50, 0.500, (True, "progress")), (100, 0.498, (True, "wait")),
                                 (150, 0.497, (True, "stop"))):
        assert _observe(tracker, step, HeldOutScores(np.full(100, loss), right, nodes)) == expected
    assert tracker.best_step == 150


def test_rows_right_count_as_progress_only_beyond_the_rows_that_changed():
    nodes = np.zeros(100, dtype=np.uint64)
    mark = HeldOutScores(np.full(100, 0.5), np.arange(100) < 90, nodes)

    def right(*rows):
        correct = mark.correct.copy()
        for row in rows:
            correct[abs(row)] = row >= 0
        return HeldOutScores(np.full(100, 0.5), correct, nodes)

    assert beyond_noise(mark, None, 1.0)  # the phase's first score
    assert not beyond_noise(right(90), mark, 1.0)  # one row more: 1 is not above sqrt(1)
    assert beyond_noise(right(90, 91), mark, 1.0)  # two more: 2 > sqrt(2)
    assert not beyond_noise(right(90, 91, -1, -2), mark, 1.0)  # two gained, two lost
    assert not beyond_noise(right(90, 91, 92, -1), mark, 1.0)  # net 2, not above sqrt(4)
    assert beyond_noise(right(90, 91, 92, 93, -1), mark, 1.0)  # net 3 > sqrt(5)
    assert not beyond_noise(right(90, 91), mark, 2.0)  # 2 is not above 2 sqrt(2)


def test_a_lower_loss_counts_only_beyond_one_percent_and_its_spread():
    nodes = np.zeros(100, dtype=np.uint64)
    mark = HeldOutScores(np.full(100, 1.0), None, nodes)
    assert beyond_noise(HeldOutScores(np.full(100, 0.988), None, nodes), mark, 1.0)
    assert not beyond_noise(HeldOutScores(np.full(100, 0.992), None, nodes), mark, 1.0)
    # 2% lower on average, but two rows fall by 2.0 and the rest not at all: a standard
    # error of 0.014 against a mean fall of 0.02 counts at one, not at two
    spread = np.full(100, 1.0)
    spread[:2] = -1.0
    assert beyond_noise(HeldOutScores(spread, None, nodes), mark, 1.0)
    assert not beyond_noise(HeldOutScores(spread, None, nodes), mark, 2.0)
    assert not beyond_noise(HeldOutScores(np.full(100, np.nan), None, nodes), mark, 1.0)
    inf = HeldOutScores(np.full(100, np.inf), None, nodes)
    assert beyond_noise(HeldOutScores(np.full(100, 5.0), None, nodes), inf, 1.0)
    assert not beyond_noise(HeldOutScores(np.zeros(0), None, nodes[:0]), None, 1.0)


def test_once_every_row_is_right_and_sure_a_falling_loss_is_no_progress():
    nodes = np.zeros(50, dtype=np.uint64)
    right, one_wrong = np.ones(50, dtype=bool), np.r_[np.zeros(1, bool), np.ones(49, bool)]
    halved = HeldOutScores(np.full(50, 0.004), right, nodes)
    assert not beyond_noise(halved, HeldOutScores(np.full(50, 0.008), right, nodes), 1.0)
    assert beyond_noise(halved, HeldOutScores(np.full(50, 0.008), one_wrong, nodes), 1.0)
    # right but not yet sure (a small held-out set all right early): the loss still counts
    assert beyond_noise(HeldOutScores(np.full(50, 0.1), right, nodes),
                        HeldOutScores(np.full(50, 0.2), right, nodes), 1.0)


def test_on_separable_rows_a_phase_stops_long_before_its_cap():
    """Four well-separated blobs: every held-out row right early; the margins grow on."""
    torch.manual_seed(0)
    centres = torch.randn(4, 8) * 4
    y = torch.arange(400) % 4
    x = centres[y] + torch.randn(400, 8)
    model = torch.nn.Linear(8, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def steps(n):
        losses = []
        for i in range(n):
            batch = torch.randint(0, 360, (32,), generator=torch.Generator().manual_seed(i))
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x[batch]), y[batch])
            loss.backward()
            optimizer.step()
            losses.append(float(loss))
        return losses

    def score():
        with torch.no_grad():
            out = model(x[360:])
        loss = torch.nn.functional.cross_entropy(out, y[360:], reduction="none")
        return HeldOutScores(loss.double().numpy(), (out.argmax(1) == y[360:]).numpy(),
                             np.zeros(40, dtype=np.uint64))

    rule = PlateauRule(eval_every=50, patience=4, max_steps=2000)
    result = train_phase(model, optimizer, 0.1, rule, steps, score)
    assert result.final is not None and result.final.correct.all()
    # measured: 450 steps; before, the loss kept falling by more than 1% and its noise at
    # every score and the phase ran to its cap of 2,000
    assert result.stopped and result.steps <= 600, result.steps


def test_equal_models_rarely_make_progress_and_better_ones_do():
    """Seeded Monte Carlo over 2,000 pairs of 100 held-out rows, each row right with
    probability p independently in both scorings (the noisiest case: no row keeps its
    verdict). Two models both right 90% of the time: one evaluation in about seven counts
    as progress (one-sided one standard error: 16%, less with the one-row minimum; a new
    best by one row, the rule before, counted in 44%); tolerance 0.12-0.20. A model right
    95% against 80%: progress at least 97% of the time (about 98.6% expected)."""
    rng = np.random.default_rng(0)
    nodes = np.zeros(100, dtype=np.uint64)

    def rate(p_mark, p_now):
        hits = 0
        for _ in range(2000):
            mark = HeldOutScores(np.ones(100), rng.random(100) < p_mark, nodes)
            now = HeldOutScores(np.ones(100), rng.random(100) < p_now, nodes)
            hits += beyond_noise(now, mark, 1.0)
        return hits / 2000

    assert 0.12 <= rate(0.9, 0.9) <= 0.20
    assert rate(0.8, 0.95) >= 0.97


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
    # 3 steps: the best of 0, 0.3, ..., 1.8 (two scores without progress, the drop, one more)
    assert float(model.weight) == pytest.approx(0.9)
    assert result.best_step == 3 and result.lr_drops == 1 and result.steps == 6
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


def _diverging_once(model, opt, lr_seen):
    """Real SGD steps towards weight 1; the fourth step's loss is NaN (a diverging batch)."""
    count = iter(range(10_000))

    def step():
        lr_seen.append(opt.param_groups[0]["lr"])
        opt.zero_grad()
        loss = (model.weight - 1.0).pow(2).sum()
        if next(count) == 3:
            loss = loss * float("nan")
        loss.backward()
        opt.step()
        return float(loss)
    return step


def test_steps_that_go_non_finite_are_undone_with_the_momentum_and_a_tenth_of_the_step():
    # a phase that diverged left NaN in SGD's momentum with the model at its finite best
    # snapshot, and every later phase of the run went non-finite at once and was rolled back
    model = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(0.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    lr_seen: list[float] = []

    def evaluate():
        err = abs(float(model.weight) - 1.0)
        return HeldOutScores(np.array([err]), None, np.zeros(1, dtype=np.uint64))

    result = train_phase(model, opt, 0.1, PlateauRule(eval_every=2, patience=2, lr_drops=0,
                                                      max_steps=40),
                         _each(_diverging_once(model, opt, lr_seen)), evaluate)
    assert result.diverged == 1
    assert lr_seen[2:4] == pytest.approx([0.1, 0.1]) and lr_seen[4] == pytest.approx(0.01)
    assert all(torch.isfinite(v).all() for s in opt.state.values() for v in s.values()
               if isinstance(v, torch.Tensor))
    assert torch.isfinite(model.weight).all() and result.final.loss[0] < 0.9
    assert len(result.losses) == result.steps - 2  # the undone run's losses are not kept
    assert opt.param_groups[0]["lr"] == 0.1  # the phase ends at its base step size


def test_an_optimizer_probe_leaves_a_diverged_candidate_non_finite():
    model = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(0.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    constant = HeldOutScores(np.array([1.0]), None, np.zeros(1, dtype=np.uint64))
    result = train_phase(model, opt, 0.1, PlateauRule(eval_every=2, max_steps=6),
                         _each(_diverging_once(model, opt, [])), lambda: constant,
                         keep_going=True, recover=False)
    assert result.diverged == 0 and not torch.isfinite(model.weight).all()


def test_a_large_stores_phase_scores_over_passes_not_fifty_steps():
    # 45,000 windows of a next-character model: 200 steps without progress (a third of a
    # pass) ended every phase at 25.6%; with the patience spanning a pass at least, 38.1%
    rule = PlateauRule(eval_every=50, patience=4, max_steps=2000)
    assert rule.for_rows(1_000, 64, 30.0) == PlateauRule(eval_every=50, patience=4,
                                                         max_steps=2000)
    big = rule.for_rows(45_000, 64, 30.0)
    assert big.eval_every == 176 and big.patience * big.eval_every * 64 >= 45_000
    assert big.max_steps == 21_094  # 30 passes
    assert rule.for_rows(12_800, 64, 30.0).eval_every == 50  # the patience is a pass already
