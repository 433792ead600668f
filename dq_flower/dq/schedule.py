"""DQ's adaptive upload schedule: ask for more samples only while they pay.

After each round's uploads the server trains on its store to a plateau
(:mod:`dq_flower.dq.plateau`) and compares the new model with the one it had before the
upload on the rows held out of this round's uploads (a paired comparison on rows neither
model trained on, and neither phase chose its weights by). That gain, and the store sizes
before and after, decide the next round's ask:

- the first upload round has nothing to compare with: the next ask grows the store by
  ``max_growth``;
- a gain whose upper confidence bound (mean plus one standard error of the per-row
  differences; for class targets the variance is floored at ``1 / (n + 1)``, as if one
  more of the ``n`` rows told the models apart) is below ``min_gain`` means the learning
  curve is flat: the schedule stops asking, and later rounds cost no uplink;
- otherwise a power law ``e(N) = a N^-b`` through the two points (error before and after,
  at the two store sizes) predicts the store size ``N*`` at which doubling it would gain
  less than ``min_gain``; the next ask is ``N* - N``, kept between ``min_growth - 1`` and
  ``max_growth - 1`` times the store size ``N``.

Errors are ``1 - accuracy`` for class targets (``min_gain`` in accuracy points, e.g.
0.005 = half a point) and the held-out loss for float targets (``min_gain`` relative to
the loss before). The total ask is split over the clients by :func:`allocate`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dq_flower.dq.plateau import HeldOutScores

__all__ = ["AdaptiveSchedule", "PairedGain", "paired_gain", "allocate"]


@dataclass(frozen=True)
class PairedGain:
    """The held-out gain of the new model over the old one, with its standard error."""

    gain: float
    stderr: float
    error_before: float
    error_after: float
    rows: int


def paired_gain(before: HeldOutScores, after: HeldOutScores) -> PairedGain:
    """Gain of ``after`` over ``before`` scored on the same held-out rows.

    Where ``after.fresh`` marks the rows held out of the round's own uploads, only those
    count: neither model was trained on them, and neither phase chose its weights by
    them (the old model's best snapshot was chosen on the older held-out rows, which
    would flatter it).
    """
    n = int(after.loss.size)
    if n == 0 or before.loss.size != n:
        return PairedGain(0.0, math.inf, math.nan, math.nan, n)
    keep = np.ones(n, dtype=bool) if after.fresh is None else after.fresh.astype(bool)
    n = int(keep.sum())
    if n == 0:
        return PairedGain(0.0, math.inf, math.nan, math.nan, 0)
    if after.correct is not None and before.correct is not None:
        old = 1.0 - before.correct[keep].astype(np.float64)
        new = 1.0 - after.correct[keep].astype(np.float64)
        diff = old - new
        e0, e1 = float(old.mean()), float(new.mean())
    else:  # float targets: the loss reduction relative to the loss before
        lo, ln = before.loss[keep].astype(np.float64), after.loss[keep].astype(np.float64)
        scale = max(float(lo.mean()), 1e-12)
        diff = (lo - ln) / scale
        e0, e1 = float(lo.mean()), float(ln.mean())
    var = float(diff.var(ddof=1)) if n > 1 else math.inf
    if after.correct is not None:  # as if one more row told them apart: 0 of n is no proof
        var = max(var, 1.0 / (n + 1))
    stderr = math.sqrt(var / n)
    if not np.isfinite(diff).all():
        return PairedGain(0.0, math.inf, e0, e1, n)
    return PairedGain(float(diff.mean()), stderr, e0, e1, n)


@dataclass
class AdaptiveSchedule:
    """The total number of samples to ask for next round, from the observed gains.

    Parameters
    ----------
    min_gain : float
        Gain below which (with confidence) an upload did not pay.
    max_growth, min_growth : float
        Bounds on the store's growth factor from one upload round to the next.
    """

    min_gain: float = 0.005
    max_growth: float = 1.5
    min_growth: float = 1.1
    next_total: int | None = None
    done: bool = False
    #: why the schedule stopped asking: ``flat`` (the learning curve) or ``exhausted``
    reason: str = ""
    curve: list[dict[str, float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.min_gain <= 0:
            raise ValueError(f"min_gain must be > 0, got {self.min_gain}")
        if not 1 < self.min_growth <= self.max_growth:
            raise ValueError("need 1 < min_growth <= max_growth, got "
                             f"{self.min_growth}, {self.max_growth}")

    def after_upload(self, stored_before: int, stored_after: int,
                     gain: PairedGain | None) -> None:
        """Update the next ask after a round that added rows (``gain`` None: first one)."""
        n0, n1 = int(stored_before), int(stored_after)
        point: dict[str, float] = {"stored": float(n1)}
        if gain is None or n0 <= 0:
            self.next_total = max(int(math.ceil(n1 * (self.max_growth - 1))), 1)
            point["ask"] = float(self.next_total)
            self.curve.append(point)
            return
        point.update(gain=gain.gain, stderr=gain.stderr, error=gain.error_after)
        if gain.gain + gain.stderr < self.min_gain:
            self.stop("flat")
        else:
            self.next_total = self._ask(n0, n1, gain)
        point["ask"] = float(self.next_total or 0)
        self.curve.append(point)

    def stop(self, reason: str) -> None:
        """Stop asking: ``flat`` learning curve, or every node ``exhausted``."""
        self.done, self.next_total, self.reason = True, 0, reason

    def _ask(self, n0: int, n1: int, gain: PairedGain) -> int:
        lo = n1 * (self.min_growth - 1)
        hi = n1 * (self.max_growth - 1)
        e0, e1 = gain.error_before, gain.error_after
        want = hi
        if 0 < e1 < e0 and n1 > n0 and math.isfinite(e0):
            b = math.log(e0 / e1) / math.log(n1 / n0)
            per_doubling = e1 * (1 - 2.0 ** -b)  # predicted gain of doubling N
            if per_doubling > 0 and b > 1e-6:
                star = n1 * (per_doubling / self.min_gain) ** (1 / b)
                want = star - n1
        return max(int(math.ceil(min(max(want, lo), hi))), 1)

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps."""
        return {"next_total": self.next_total, "done": self.done, "reason": self.reason,
                "curve": [dict(p) for p in self.curve]}

    def load_state(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`state`."""
        self.next_total = state["next_total"]
        self.done = bool(state["done"])
        self.reason = str(state.get("reason", ""))
        self.curve = [dict(p) for p in state["curve"]]


def allocate(total: int, left: dict[int, int | None], fit: dict[int, float]) -> dict[int, int]:
    """Split ``total`` samples over nodes, in proportion to what each has left and fits worst.

    ``left[node]`` is the number of samples the node has not uploaded (``None``: unknown,
    counted as the mean of the known ones, or 1 if none is known). ``fit[node]`` is the
    node's mean held-out loss (missing: the mean of the others); a node's weight is
    ``left * fit``. No node is asked for more than it has left; what a full node cannot
    take goes to the others (largest remainders break rounding). Deterministic.
    """
    nodes = sorted(left)
    known = [v for v in left.values() if v is not None]
    mean_left = float(np.mean(known)) if known else 1.0
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
