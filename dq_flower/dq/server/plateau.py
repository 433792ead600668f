"""Train on the store until the held-out rows stop improving.

A *phase* (one per adaptive upload round) steps from the base learning rate and scores
the held-out rows every ``eval_every`` steps. A score beating the best by more than
``min_delta`` resets the patience and snapshots the weights; ``patience`` evaluations
without one multiply the learning rate by ``lr_factor``; the patience running out after
``lr_drops`` drops, or ``max_steps`` steps, ends the phase at its best snapshot after
training began (the starting weights are scored but never kept). Scores are
higher-is-better: accuracy (ties broken by the loss), or minus the loss for float targets.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

__all__ = ["PlateauRule", "PlateauTracker", "PhaseResult", "HeldOutScores", "train_phase",
           "score_of"]

#: Weight of the loss in the score of class targets: a tie-breaker below one row in 1,000.
LOSS_TIE_BREAK = 1e-4


@dataclass(frozen=True)
class PlateauRule:
    """When a training phase on the store stops (see the module docstring)."""

    eval_every: int = 50
    patience: int = 4
    lr_drops: int = 2
    lr_factor: float = 0.1
    max_steps: int = 2000
    min_delta: float = 0.0

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
    """Feeds on held-out scores; answers ``improved``, ``wait``, ``drop`` or ``stop``."""

    rule: PlateauRule
    best: float = -math.inf
    best_step: int = 0
    waited: int = 0
    drops: int = 0

    def observe(self, step: int, score: float) -> str:
        """Record the score after ``step`` steps and say what the phase does next."""
        if score > self.best + self.rule.min_delta:
            self.best, self.best_step, self.waited = float(score), int(step), 0
            return "improved"
        self.waited += 1
        if self.waited < self.rule.patience:
            return "wait"
        if self.drops < self.rule.lr_drops:
            self.drops += 1
            self.waited = 0
            return "drop"
        return "stop"


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


def _set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def train_phase(model: torch.nn.Module, optimizer: torch.optim.Optimizer, base_lr: float,
                rule: PlateauRule, step: Callable[[], float],
                evaluate: Callable[[], HeldOutScores]) -> PhaseResult:
    """Run one phase: ``step()`` takes a step (its loss), ``evaluate()`` scores held-out rows.

    The model ends at the best snapshot after training began, the learning rate at ``base_lr``.
    """
    tracker = PlateauTracker(rule)
    result = PhaseResult()
    lr = base_lr
    _set_lr(optimizer, lr)
    # the starting point is scored (for the paired gain) but is no candidate: a lucky score
    # of the old model on a small held-out set cannot throw the new rows' training away
    first = evaluate()
    best_state: dict[str, torch.Tensor] = {}
    best_scores = first
    result.initial = first
    result.evaluations = 1
    while result.steps < rule.max_steps:
        chunk = min(rule.eval_every, rule.max_steps - result.steps)
        for _ in range(chunk):
            result.losses.append(float(step()))
        result.steps += chunk
        scores = evaluate()
        result.evaluations += 1
        action = tracker.observe(result.steps, scores.score)
        if action == "improved" or not best_state:
            best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            best_scores = scores
        elif action == "drop":
            lr *= rule.lr_factor
            _set_lr(optimizer, lr)
            result.lr_drops += 1
        elif action == "stop":
            break
    if best_state:
        model.load_state_dict(best_state)
    _set_lr(optimizer, base_lr)
    result.best_step, result.best_score = tracker.best_step, tracker.best
    result.final = best_scores
    return result
