"""Training to a plateau of the held-out score: one *phase* of the server's training.

A *phase* (one per adaptive upload round) steps from the base
learning rate and scores the held-out rows every ``eval_every`` steps. A score above the
best snapshots the weights; only *progress* resets the patience: more held-out rows right
than ever before in the phase, or a held-out loss 1% below its lowest so far (the loss alone
for float targets), so a loss creeping down by less at equal accuracy does not keep a phase
going. ``patience`` evaluations without progress multiply the learning rate by
``lr_factor``; the patience running out after ``lr_drops`` drops, or ``max_steps`` steps,
ends the phase at its best snapshot after training began (the starting weights are scored
but never kept). A phase may go on from another's tracker, snapshot and steps
(:class:`PhaseStart`: the optimizer probe's winner goes on). Scores are higher-is-better:
accuracy (ties broken by the loss), or minus the loss for float targets.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import torch

__all__ = ["PlateauRule", "PlateauTracker", "PhaseResult", "HeldOutScores", "PhaseStart",
           "train_phase", "score_of", "progress_of", "LOSS_TIE_BREAK", "LOSS_PROGRESS"]

#: Weight of the loss in the score of class targets: a tie-breaker below one row in 1,000.
LOSS_TIE_BREAK = 1e-4
#: Relative fall of the held-out loss that counts as one unit of progress.
LOSS_PROGRESS = 0.01


@dataclass(frozen=True)
class PlateauRule:
    """When a training phase on the store stops (see the module docstring).

    ``min_delta``: the rise in :func:`progress_of` units that counts as progress (0.99:
    one held-out row, or a 1% lower loss, the small margin for the loss's float rounding).
    """

    eval_every: int = 50
    patience: int = 4
    lr_drops: int = 1
    lr_factor: float = 0.1
    max_steps: int = 2000
    min_delta: float = 0.99

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
    marks: tuple[float, ...] = ()
    waited: int = 0
    drops: int = 0

    def observe(self, step: int, score: float, progress: tuple[float, ...] | None = None
                ) -> tuple[bool, str]:
        """Record the scores after ``step`` steps: ``(snapshot, what the phase does next)``.

        ``score`` picks the snapshot (any rise); ``progress`` (default ``(score,)``) resets
        the patience where one of its parts rises more than ``min_delta`` above its mark
        (the part's highest value at a progress so far).
        """
        snapshot = score > self.best
        if snapshot:
            self.best, self.best_step = float(score), int(step)
        values = (score,) if progress is None else progress
        if not self.marks:
            self.marks = tuple(-math.inf for _ in values)
        if any(v > m + self.rule.min_delta for v, m in zip(values, self.marks, strict=True)):
            self.marks = tuple(max(v, m) for v, m in zip(values, self.marks, strict=True))
            self.waited = 0
            return snapshot, "progress"
        self.waited += 1
        if self.waited < self.rule.patience:
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

    @property
    def score(self) -> float:
        """The phase's higher-is-better score (see :func:`score_of`)."""
        return score_of(self)

    def node_loss(self) -> dict[int, float]:
        """Mean held-out loss per origin node."""
        return {int(n): float(self.loss[self.nodes == n].mean()) for n in np.unique(self.nodes)}

    @classmethod
    def concat(cls, parts: list[HeldOutScores]) -> HeldOutScores:
        """``parts`` one after the other (none: no rows)."""
        if not parts:
            return cls(np.zeros(0), None, np.zeros(0, dtype=np.uint64))
        correct = [p.correct for p in parts if p.correct is not None]
        return cls(np.concatenate([p.loss for p in parts]),
                   np.concatenate(correct) if correct else None,
                   np.concatenate([p.nodes for p in parts]))


def score_of(scores: HeldOutScores) -> float:
    """Accuracy minus a loss tie-break (class targets), or minus the mean loss (float)."""
    if not scores.loss.size:
        return -math.inf
    loss = float(scores.loss.mean())
    if scores.correct is None:
        return -loss
    return float(scores.correct.mean()) - LOSS_TIE_BREAK * min(loss, 1e3)


def progress_of(scores: HeldOutScores) -> tuple[float, ...]:
    """``-log`` of the held-out loss in 1% steps, and the held-out rows right (class targets)."""
    if not scores.loss.size:
        return (-math.inf,) if scores.correct is None else (-math.inf, -math.inf)
    loss = float(scores.loss.mean())
    fall = (-math.log(max(loss, 1e-30)) / -math.log(1.0 - LOSS_PROGRESS)
            if math.isfinite(loss) else -math.inf)
    if scores.correct is None:
        return (fall,)
    return (fall, float(scores.correct.sum()))


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


def train_phase(model: torch.nn.Module, optimizer: torch.optim.Optimizer, base_lr: float,
                rule: PlateauRule, steps: Callable[[int], Sequence[float]],
                evaluate: Callable[[], HeldOutScores],
                start: PhaseStart | None = None, keep_going: bool = False) -> PhaseResult:
    """Run one phase: ``steps(n)`` takes ``n`` steps (their losses), ``evaluate()`` scores.

    The model ends at the best snapshot after training began, the learning rate at ``base_lr``.
    ``start``: go on from it (its steps count against ``rule.max_steps``); ``keep_going``:
    leave the model where training stopped (not at the snapshot) and fill ``start``-like
    fields in :attr:`PhaseResult.resume` for a later phase.
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
    while result.steps < rule.max_steps:
        chunk = min(rule.eval_every, rule.max_steps - result.steps)
        result.losses.extend(float(v) for v in steps(chunk))
        result.steps += chunk
        scores = evaluate()
        result.evaluations += 1
        snapshot, action = tracker.observe(result.steps, scores.score, progress_of(scores))
        if snapshot or not best_state:
            best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            best_scores = scores
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
