"""DQ's adaptive upload schedule: ask for more samples only while they pay.

After each upload round the server trains to a plateau and compares the new model with
the one before, **paired on every held-out row**: the gain ``d`` (error before minus after)
and its standard error ``s`` (class targets: variance floored at ``1 / (n + 1)``, so 0 of
``n`` is no proof). Per doubling of the store, ``g = d / log2(N1 / N0)`` and
``sigma = s / log2(N1 / N0)``; the last :data:`POOLED` are pooled by inverse variance
(``G``, ``S``); ``z`` = :data:`Z_ONE_SIDED` (one-sided 95%).

- the first upload round grows the store by ``max_growth``;
- **flat** (stop asking) needs two comparisons, ``min_rows`` held-out rows and
  ``G + z S < min_gain``;
- otherwise the ask is sized optimistically from ``u = G + z S``: the power law
  ``e(N) = a N^-b`` gaining ``u`` per doubling predicts the ``N*`` where a doubling gains
  less than ``min_gain``; the ask ``N* - N`` is kept within ``[min_growth - 1,
  max_growth - 1]`` times ``N``;
- while flat, every ``probe_after`` rounds a probe asks ``min_growth - 1`` times the store;
  its comparison joins the evidence (replaces it where its own gain is above ``min_gain``
  beyond its uncertainty); still flat: the wait doubles.

A phase's new model is dropped where ``d + z s < 0`` (:func:`significantly_worse`). Errors
are ``1 - accuracy`` for class targets (``min_gain`` in accuracy points per doubling) and
the held-out loss relative to the loss before for float targets. :func:`allocate` splits
the total ask over the clients.

Training to a plateau: a *phase* (one per adaptive upload round) steps from the base
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
from typing import Any

import numpy as np
import torch

__all__ = ["AdaptiveSchedule", "PairedGain", "paired_gain", "pooled", "significantly_worse",
           "allocate", "Z_ONE_SIDED", "POOLED", "PlateauRule", "PlateauTracker", "PhaseResult",
           "HeldOutScores", "PhaseStart", "train_phase", "score_of", "progress_of"]

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


#: One-sided 95% normal quantile: the confidence of a stop and of a rollback.
Z_ONE_SIDED = 1.645
#: Comparisons pooled into the schedule's evidence (the most recent ones).
POOLED = 3


@dataclass(frozen=True)
class PairedGain:
    """The held-out gain of the new model over the old one, with its standard error."""

    gain: float
    stderr: float
    error_before: float
    error_after: float
    rows: int


def paired_gain(before: HeldOutScores, after: HeldOutScores) -> PairedGain:
    """Gain of ``after`` over ``before``, paired on every held-out row both were scored on."""
    n = int(after.loss.size)
    if n == 0 or before.loss.size != n:
        return PairedGain(0.0, math.inf, math.nan, math.nan, n)
    if after.correct is not None and before.correct is not None:
        old = 1.0 - before.correct.astype(np.float64)
        new = 1.0 - after.correct.astype(np.float64)
        diff = old - new
        e0, e1 = float(old.mean()), float(new.mean())
    else:  # float targets: the loss reduction relative to the loss before
        lo, ln = before.loss.astype(np.float64), after.loss.astype(np.float64)
        scale = max(float(lo.mean()), 1e-12)
        diff = (lo - ln) / scale
        e0, e1 = float(lo.mean()), float(ln.mean())
    if not np.isfinite(diff).all():
        return PairedGain(0.0, math.inf, e0, e1, n)
    var = float(diff.var(ddof=1)) if n > 1 else math.inf
    if after.correct is not None:  # as if one more row told them apart: 0 of n is no proof
        var = max(var, 1.0 / (n + 1))
    return PairedGain(float(diff.mean()), math.sqrt(var / n), e0, e1, n)


def significantly_worse(gain: PairedGain) -> bool:
    """Whether the new model is worse than the old one beyond the comparison's uncertainty."""
    return gain.gain + Z_ONE_SIDED * gain.stderr < 0


def pooled(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Inverse-variance weighted mean of ``(value, stderr)`` points, and its stderr."""
    finite = [(g, s) for g, s in points if math.isfinite(g) and math.isfinite(s) and s > 0]
    if not finite:
        return 0.0, math.inf
    w = np.array([1.0 / s**2 for _, s in finite])
    g = np.array([g for g, _ in finite])
    return float((w * g).sum() / w.sum()), float(1.0 / math.sqrt(w.sum()))


@dataclass
class AdaptiveSchedule:
    """The total number of samples to ask for next round, from the observed gains.

    Parameters
    ----------
    min_gain : float
        Gain per doubling of the store below which (with confidence) uploads do not pay.
    max_growth, min_growth : float
        Bounds on the store's growth factor from one upload round to the next.
    min_rows : int
        Held-out rows a comparison needs before it may show the curve flat.
    probe_after : int
        Rounds without asking, after the curve was found flat, before a probe ask
        (0: never probe; the wait doubles after each probe that finds it still flat).
    """

    min_gain: float = 0.005
    max_growth: float = 1.5
    min_growth: float = 1.1
    min_rows: int = 0
    probe_after: int = 2
    next_total: int | None = None
    done: bool = False
    #: why the schedule stopped asking: ``flat`` (the learning curve) or ``exhausted``
    reason: str = ""
    curve: list[dict[str, float]] = field(default_factory=list)
    #: per comparison: the gain per doubling and its standard error
    evidence: list[tuple[float, float]] = field(default_factory=list)
    #: rounds left before the next probe while flat, and the current wait
    probe_in: int = 0
    probe_wait: int = 0

    def __post_init__(self) -> None:
        if self.min_gain <= 0:
            raise ValueError(f"min_gain must be > 0, got {self.min_gain}")
        if not 1 < self.min_growth <= self.max_growth:
            raise ValueError("need 1 < min_growth <= max_growth, got "
                             f"{self.min_growth}, {self.max_growth}")
        if self.min_rows < 0 or self.probe_after < 0:
            raise ValueError("min_rows and probe_after must be >= 0")

    @property
    def flat(self) -> bool:
        """Stopped on a flat learning curve (a probe may resume asking)."""
        return self.done and self.reason == "flat"

    @property
    def finished(self) -> bool:
        """Nothing will be asked again: every node exhausted, or flat with no probes."""
        return self.done and (self.reason != "flat" or self.probe_after == 0)

    def after_upload(self, stored_before: int, stored_after: int,
                     gain: PairedGain | None) -> None:
        """Update the next ask after a round that added rows (``gain`` None: first one)."""
        n0, n1 = int(stored_before), int(stored_after)
        point: dict[str, float] = {"stored": float(n1)}
        if gain is None or n0 <= 0 or n1 <= n0:
            if not self.done:
                self.next_total = max(int(math.ceil(n1 * (self.max_growth - 1))), 1)
            point["ask"] = float(self.next_total or 0)
            self.curve.append(point)
            return
        doubling = math.log2(n1 / n0)
        new = (gain.gain / doubling, gain.stderr / doubling)
        probing = self.flat
        if probing and new[0] - Z_ONE_SIDED * new[1] > self.min_gain:
            self.evidence = []  # the probe alone shows the curve rising again: start anew
        self.evidence = [*self.evidence, new][-POOLED:]
        g, s = pooled(self.evidence)
        point.update(gain=gain.gain, stderr=gain.stderr, error=gain.error_after,
                     pooled=g, pooled_stderr=s)
        if self.shows_flat(g, s, gain.rows):
            if probing:  # still flat: wait twice as long for the next probe
                self.probe_wait *= 2
            else:
                self.stop("flat")
                self.probe_wait = self.probe_after
            self.probe_in = self.probe_wait
        else:
            self.done, self.reason = False, ""
            self.next_total = self._ask(n1, g, s, gain.error_after)
        point["ask"] = float(self.next_total or 0)
        self.curve.append(point)

    def shows_flat(self, g: float, s: float, rows: int) -> bool:
        """Whether the pooled evidence shows the curve flat (see the module docstring)."""
        return (len(self.evidence) >= 2 and rows >= self.min_rows
                and g + Z_ONE_SIDED * s < self.min_gain)

    def round_ask(self, stored: int) -> int:
        """The total to ask this round (once per data round; while flat, counts to a probe)."""
        if not self.flat:
            return 0 if self.done else int(self.next_total or 0)
        if self.probe_after == 0:
            return 0
        self.probe_in -= 1
        if self.probe_in > 0:
            return 0
        return max(math.ceil(stored * (self.min_growth - 1) - 1e-9), 1)

    def stop(self, reason: str) -> None:
        """Stop asking: ``flat`` learning curve, or every node ``exhausted``."""
        self.done, self.next_total, self.reason = True, 0, reason

    def _ask(self, n1: int, g: float, s: float, e1: float) -> int:
        """The next ask from the upper bound ``g + z s`` of the gain per doubling at ``e1``."""
        lo = n1 * (self.min_growth - 1)
        hi = n1 * (self.max_growth - 1)
        u = g + Z_ONE_SIDED * s
        want = hi
        if math.isfinite(u) and 0 < u < e1 and math.isfinite(e1):
            b = -math.log2(1 - u / e1)  # e(N) = a N^-b gains u per doubling at N1
            if b > 1e-6:
                want = n1 * (u / self.min_gain) ** (1 / b) - n1
        return max(math.ceil(min(max(want, lo), hi) - 1e-9), 1)

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps."""
        return {"next_total": self.next_total, "done": self.done, "reason": self.reason,
                "curve": [dict(p) for p in self.curve],
                "evidence": [list(p) for p in self.evidence],
                "probe_in": self.probe_in, "probe_wait": self.probe_wait}

    def load_state(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`state`."""
        self.next_total = state["next_total"]
        self.done = bool(state["done"])
        self.reason = str(state.get("reason", ""))
        self.curve = [dict(p) for p in state["curve"]]
        self.evidence = [(float(g), float(s)) for g, s in state.get("evidence", [])]
        self.probe_in = int(state.get("probe_in", 0))
        self.probe_wait = int(state.get("probe_wait", 0))


def allocate(total: int, left: dict[int, int | None], fit: dict[int, float],
             unknown: float | None = None) -> dict[int, int]:
    """Split ``total`` samples over nodes, in proportion to what each has left and fits worst.

    ``left[node]``: samples not uploaded (``None``: ``unknown``, default the known ones'
    mean, at least 1); ``fit[node]``: mean held-out loss (missing: the others' mean). A
    node's weight is ``left * fit``; no node is asked for more than it has left (the rest
    goes to the others, largest remainders break rounding).
    """
    nodes = sorted(left)
    known = [v for v in left.values() if v is not None]
    if unknown is None:
        unknown = float(np.mean(known)) if known else 1.0
    mean_left = max(float(unknown), 1.0)
    caps = np.array([math.inf if (v := left[n]) is None else float(v) for n in nodes])
    mean_fit = float(np.mean(list(fit.values()))) if fit else 1.0
    w = np.array([(mean_left if math.isinf(c) else c) * max(float(fit.get(n, mean_fit)), 1e-6)
                  for n, c in zip(nodes, caps, strict=True)])
    share = np.zeros(len(nodes))
    free = (caps > 0) & (w > 0)
    room = float(min(total, caps.sum()))
    while free.any() and room > 1e-9:
        part = room * w[free] / w[free].sum()
        idx = np.flatnonzero(free)
        over = share[idx] + part >= caps[idx]
        if not over.any():
            share[idx] += part
            break
        for i in idx[over]:
            room -= caps[i] - share[i]
            share[i] = caps[i]
            free[i] = False
    asks = np.floor(share + 1e-9).astype(np.int64)
    short = int(min(total, caps.sum()) - asks.sum())
    order = np.argsort(-(share - asks), kind="stable")
    for i in order:
        if short <= 0:
            break
        if asks[i] < caps[i]:
            asks[i] += 1
            short -= 1
    return {n: int(a) for n, a in zip(nodes, asks, strict=True)}
