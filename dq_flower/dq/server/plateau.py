"""Training to a plateau of the held-out score: one *phase* of the server's training.

A *phase* (one per adaptive upload round) steps from the base
learning rate and scores the held-out rows every ``eval_every`` steps. A score above the
best snapshots the weights; only *progress* resets the patience: the held-out rows, compared
one by one with their results at the last progress, better beyond their noise (more rows
right by more than one standard error of the rows that changed, or a mean loss lower by 1%
and by more than one standard error of the per-row falls: :func:`beyond_noise`), so a new
best that one lucky row or a loss creeping down makes does not keep a phase going.
``patience`` evaluations without progress multiply the learning rate by ``lr_factor``
(after a drop, half as many, rounded up: a drop's gain shows in its first scores; a fifth
fewer steps, the median over 16 user apps, at their accuracy: ``benchmarks/plateau_rule.py``);
the patience running out after ``lr_drops`` drops, or ``max_steps`` steps, ends the phase at
its best snapshot after training began (the starting weights are scored but never kept). A
phase may go on from another's tracker, snapshot and steps
(:class:`PhaseStart`: the optimizer probe's winner goes on). Scores are higher-is-better:
accuracy (ties broken by the loss), or minus the loss for float targets.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from dq_flower.model_ops import finite_since

__all__ = ["PlateauRule", "PlateauTracker", "PhaseResult", "HeldOutScores", "PhaseStart",
           "train_phase", "score_of", "beyond_noise", "LOSS_TIE_BREAK", "LOSS_PROGRESS",
           "SURE_LOSS"]

#: Weight of the loss in the score of class targets: a tie-breaker below one row in 1,000.
LOSS_TIE_BREAK = 1e-4
#: Relative fall of the held-out loss below which no fall counts as progress.
LOSS_PROGRESS = 0.01
#: Mean held-out loss below which, every row right, a fall is no progress (about 99% on
#: the right class with cross-entropy).
SURE_LOSS = 0.01


@dataclass(frozen=True)
class PlateauRule:
    """When a training phase on the store stops (see the module docstring).

    ``evidence``: the standard errors a paired gain must exceed to count as progress in a
    phase (:func:`beyond_noise`); ``min_delta``: the rise of a plain score that counts where
    no held-out rows are given (:meth:`PlateauTracker.observe` alone).
    """

    eval_every: int = 50
    patience: int = 4
    lr_drops: int = 1
    lr_factor: float = 0.1
    max_steps: int = 2000
    min_delta: float = 0.99
    evidence: float = 1.0

    def for_rows(self, rows: int, batch: int, max_epochs: float) -> PlateauRule:
        """The rule of a phase on ``rows`` training rows in minibatches of ``batch``.

        Scores every ``eval_every`` steps or every ``1 / patience`` of a pass over the rows,
        the longer (the patience spans a pass at least: on a large store progress shows over
        passes; a next-character model on 45,000 windows stopped each phase within a third
        of a pass at 25.6%, 38.1% now); at most ``max_epochs`` passes or ``max_steps`` steps,
        the more.
        """
        return replace(self, max_steps=max(self.max_steps, math.ceil(max_epochs * rows / batch)),
                       eval_every=max(self.eval_every, math.ceil(rows / (self.patience * batch))))

    def patience_now(self, drops: int) -> int:
        """Scores without progress that end the wait: ``patience``, halved after a drop.

        Rounded up; what a drop gains shows in its first scores.
        """
        return self.patience if drops == 0 else (self.patience + 1) // 2

    def __post_init__(self) -> None:
        for name in ("eval_every", "patience", "max_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.lr_drops < 0:
            raise ValueError(f"lr_drops must be >= 0, got {self.lr_drops}")
        if not 0 < self.lr_factor < 1:
            raise ValueError(f"lr_factor must be in (0, 1), got {self.lr_factor}")


@dataclass
class PlateauTracker:
    """Feeds on held-out scores: whether to snapshot, and what the phase does next."""

    rule: PlateauRule
    best: float = -math.inf
    best_step: int = 0
    level: float = -math.inf  # the score at the last progress (plain scores)
    mark: HeldOutScores | None = None  # the held-out results at the last progress
    waited: int = 0
    drops: int = 0

    def observe(self, step: int, score: float, progressed: bool | None = None
                ) -> tuple[bool, str]:
        """Record the scores after ``step`` steps: ``(snapshot, what the phase does next)``.

        ``score`` picks the snapshot (any rise); ``progressed`` (default: ``score`` rose more
        than ``min_delta`` above its value at the last progress) resets the patience.
        """
        snapshot = score > self.best
        if snapshot:
            self.best, self.best_step = float(score), int(step)
        if progressed is None:
            progressed = score > self.level + self.rule.min_delta
            if progressed:
                self.level = float(score)
        if progressed:
            self.waited = 0
            return snapshot, "progress"
        self.waited += 1
        if self.waited < self.rule.patience_now(self.drops):
            return snapshot, "wait"
        if self.drops < self.rule.lr_drops:
            self.drops += 1
            self.waited = 0
            return snapshot, "drop"
        return snapshot, "stop"


@dataclass(frozen=True)
class HeldOutScores:
    """Per-row results of the model on the held-out rows."""

    loss: np.ndarray  # (n,) per-row loss
    correct: np.ndarray | None  # (n,) bool for class targets, None for float targets
    nodes: np.ndarray  # (n,) origin node ids
    floor: np.ndarray | None = None  # (n,) a loss with an offset: its floor (.loss_floor)
    #: (n,) float targets of many values a row: the loss at the row's level (.loss_floor)
    scale: np.ndarray | None = None

    @property
    def excess(self) -> np.ndarray:
        """Per-row loss above its floor: what relative figures read (the loss, no floor)."""
        return self.loss if self.floor is None else self.loss - self.floor

    @property
    def score(self) -> float:
        """The phase's higher-is-better score (see :func:`score_of`)."""
        return score_of(self)

    def node_loss(self) -> dict[int, float]:
        """Mean held-out loss per origin node."""
        return {int(n): float(self.excess[self.nodes == n].mean()) for n in np.unique(self.nodes)}

    @classmethod
    def concat(cls, parts: list[HeldOutScores]) -> HeldOutScores:
        """``parts`` one after the other (none: no rows)."""
        if not parts:
            return cls(np.zeros(0), None, np.zeros(0, dtype=np.uint64))
        correct = [p.correct for p in parts if p.correct is not None]
        floors = [p.floor for p in parts if p.floor is not None]
        scales = [p.scale for p in parts if p.scale is not None]
        return cls(np.concatenate([p.loss for p in parts]),
                   np.concatenate(correct) if correct else None,
                   np.concatenate([p.nodes for p in parts]),
                   np.concatenate(floors) if len(floors) == len(parts) else None,
                   np.concatenate(scales) if len(scales) == len(parts) else None)


def score_of(scores: HeldOutScores) -> float:
    """Accuracy minus a loss tie-break (class targets), or minus the mean loss (float)."""
    if not scores.loss.size:
        return -math.inf
    loss = float(scores.loss.mean())
    if scores.correct is None:
        return -loss
    return float(scores.correct.mean()) - LOSS_TIE_BREAK * min(loss, 1e3)


def beyond_noise(now: HeldOutScores, mark: HeldOutScores | None, z: float) -> bool:
    """Whether ``now`` beats ``mark`` on the same held-out rows by more than their noise.

    Paired on the rows: the rows right (class targets) rise by at least one and by more than
    ``z`` standard errors (the square root of the rows whose verdict changed), or the mean
    per-row loss falls by 1% of the mark's and by more than ``z`` standard errors of the
    per-row falls; once every row was right at the mark and its mean loss below
    :data:`SURE_LOSS`, only the rows count (on separable rows the loss falls for as long as
    the margins grow: a phase of four sound snippets ran to its 2,000-step cap each round at
    100% held-out accuracy). No mark (the phase's first score): progress; no rows: none.
    """
    if not now.loss.size:
        return False
    if mark is None or mark.loss.shape != now.loss.shape:
        return True
    if now.correct is not None and mark.correct is not None:
        gained = int((now.correct & ~mark.correct).sum())
        lost = int((mark.correct & ~now.correct).sum())
        if gained - lost >= 1 and gained - lost > z * math.sqrt(gained + lost):
            return True
        if mark.correct.all() and float(mark.loss.mean()) < SURE_LOSS:  # margins growing
            return False
    if not np.isfinite(now.loss).all():
        return False
    if not np.isfinite(mark.loss).all():
        return True
    fall = mark.loss - now.loss
    mean = float(fall.mean())
    spread = float(fall.std(ddof=1)) / math.sqrt(fall.size) if fall.size > 1 else 0.0
    return mean > LOSS_PROGRESS * float(mark.excess.mean()) and mean > z * spread


@dataclass
class PhaseResult:
    """What one training phase did."""

    steps: int = 0
    best_step: int = 0
    best_score: float = -math.inf
    evaluations: int = 0
    lr_drops: int = 0
    losses: list[float] = field(default_factory=list)
    initial: HeldOutScores | None = None
    final: HeldOutScores | None = None
    #: whether the plateau rule ended it (not the step cap)
    stopped: bool = False
    #: where a later phase can go on from (a ``keep_going`` phase only)
    resume: PhaseStart | None = None
    #: chunks of steps undone as they left the model non-finite (``recover``)
    diverged: int = 0


def _set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


@dataclass
class PhaseStart:
    """Where a phase goes on from: another phase's result, tracker and best snapshot."""

    result: PhaseResult
    tracker: PlateauTracker
    best_state: dict[str, torch.Tensor]
    lr: float


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A copy of the model's state."""
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def train_phase(model: torch.nn.Module, optimizer: torch.optim.Optimizer, base_lr: float,
                rule: PlateauRule, steps: Callable[[int], Sequence[float]],
                evaluate: Callable[[], HeldOutScores],
                start: PhaseStart | None = None, keep_going: bool = False,
                recover: bool = True) -> PhaseResult:
    """Run one phase: ``steps(n)`` takes ``n`` steps (their losses), ``evaluate()`` scores.

    The model ends at the best snapshot after training began, the learning rate at ``base_lr``.
    ``start``: go on from it (its steps count against ``rule.max_steps``); ``keep_going``:
    leave the model where training stopped (not at the snapshot) and fill ``start``-like
    fields in :attr:`PhaseResult.resume` for a later phase. ``recover``: steps that leave
    the model non-finite are undone, the optimizer's state (momentum) cleared and the step
    size cut tenfold, and the phase goes on (:attr:`PhaseResult.diverged` counts them; an
    optimizer probe passes ``False``: a candidate that diverges is out).
    """
    if start is None:
        tracker = PlateauTracker(rule)
        lr = base_lr
        # the starting point is scored (for the paired gain) but is no candidate: a lucky
        # score of the old model on a small held-out set cannot throw the new rows' training
        # away
        result = PhaseResult(evaluations=1, initial=evaluate())
        best_state: dict[str, torch.Tensor] = {}
        best_scores = result.initial
    else:
        tracker, result, best_state, lr = (replace(start.tracker, rule=rule), start.result,
                                           start.best_state, start.lr)
        best_scores = result.final if result.final is not None else result.initial
    _set_lr(optimizer, lr)
    stopped = False
    good = _weights(model) if recover else {}
    while result.steps < rule.max_steps:
        chunk = min(rule.eval_every, rule.max_steps - result.steps)
        losses = [float(v) for v in steps(chunk)]
        result.steps += chunk
        if recover and not (all(map(math.isfinite, losses)) and finite_since(model, good)):
            # undone, momentum cleared, a tenth of the step size
            model.load_state_dict(good)
            optimizer.state.clear()
            lr *= 0.1
            _set_lr(optimizer, lr)
            result.diverged += 1
            continue
        result.losses.extend(losses)
        if recover:
            good = _weights(model)
        scores = evaluate()
        result.evaluations += 1
        progressed = beyond_noise(scores, tracker.mark, rule.evidence)
        if progressed:
            tracker.mark = scores
        snapshot, action = tracker.observe(result.steps, scores.score, progressed)
        if snapshot or not best_state:
            best_state, best_scores = _weights(model), scores
        if action == "drop":
            lr *= rule.lr_factor
            _set_lr(optimizer, lr)
            result.lr_drops += 1
        elif action == "stop":
            stopped = True
            break
    result.best_step, result.best_score = tracker.best_step, tracker.best
    result.final = best_scores
    if keep_going:
        result.resume = PhaseStart(result, tracker, best_state, lr)
    elif best_state:
        model.load_state_dict(best_state)
    result.stopped = stopped
    _set_lr(optimizer, base_lr)
    return result
