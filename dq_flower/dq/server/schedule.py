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
  beyond its uncertainty); still flat: the wait doubles;
- once every node has sent all its rows (**exhausted**), every ``probe_after`` rounds a
  probe asks ``max_growth - 1`` times the store of a node that may have more by now (its
  data may grow: a sensor stream); the wait doubles after each probe, and rows it brings
  resume the schedule.

A phase's new model is dropped where ``d + z s < 0`` (:func:`significantly_worse`). Errors
are ``1 - accuracy`` for class targets (``min_gain`` in accuracy points per doubling) and
the held-out loss relative to the loss before for float targets. :func:`allocate` splits
the total ask over the clients. The training to a plateau is :mod:`.plateau`'s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dq_flower.dq.server.plateau import HeldOutScores

__all__ = ["AdaptiveSchedule", "PairedGain", "paired_gain", "pooled", "significantly_worse",
           "allocate", "Z_ONE_SIDED", "POOLED", "MIN_GROWTH"]

#: One-sided 95% normal quantile: the confidence of a stop and of a rollback.
Z_ONE_SIDED = 1.645
#: Comparisons pooled into the schedule's evidence (the most recent ones).
POOLED = 3
#: A round's new rows below this share of the store train no phase: the gain of a doubling
#: times log2(1.01) is far below what the held-out rows can show.
MIN_GROWTH = 0.01


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
    else:  # float targets: the loss reduction relative to the loss before (above its floor)
        lo, ln = before.loss.astype(np.float64), after.loss.astype(np.float64)
        floor = 0.0 if before.floor is None else before.floor.astype(np.float64)
        scale = max(float((lo - floor).mean()), 1e-12)
        diff = (lo - ln) / scale
        e0, e1 = float((lo - floor).mean()), float((ln - floor).mean())
    if not np.isfinite(diff).all():
        return PairedGain(0.0, math.inf, e0, e1, n)
    var = float(diff.var(ddof=1)) if n > 1 else math.inf
    if after.correct is not None:  # as if one more row told them apart: 0 of n is no proof
        var = max(var, 1.0 / (n + 1))
    return PairedGain(float(diff.mean()), math.sqrt(var / n), e0, e1, n)


def significantly_worse(gain: PairedGain, z: float = Z_ONE_SIDED) -> bool:
    """Whether the new model is worse than the old one beyond ``z`` standard errors."""
    return gain.gain + z * gain.stderr < 0


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
    #: rows stored by rounds that trained no phase since the last one (:meth:`grew_enough`),
    #: and those of them the phase about to run follows (its growth counts from before them)
    unseen: int = 0
    behind: int = 0
    #: probes made while exhausted (which node the next one asks)
    probes: int = 0

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
    def exhausted(self) -> bool:
        """Stopped with every node's rows sent (a probe asks whether one has more by now)."""
        return self.done and self.reason == "exhausted"

    @property
    def finished(self) -> bool:
        """Nothing will be asked again: stopped, and ``probe_after`` 0."""
        return self.done and self.probe_after == 0

    def grew_enough(self, new: int, stored: int) -> bool:
        """Whether ``new`` rows and those since the last phase are worth one (:data:`MIN_GROWTH`).

        ``stored``: the store's rows; rows not yet worth a phase are counted until they are.
        """
        self.unseen += int(new)
        if self.unseen < max(MIN_GROWTH * stored, 1):
            return False
        self.behind, self.unseen = self.unseen - int(new), 0
        return True

    def after_upload(self, stored_before: int, stored_after: int,
                     gain: PairedGain | None) -> None:
        """Update the next ask after a round that added rows (``gain`` None: first one)."""
        n0, n1 = int(stored_before) - self.behind, int(stored_after)  # since the last phase
        self.behind = 0
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
                self.probe_in = self.probe_wait
            else:
                self.stop("flat")
        else:
            self.done, self.reason = False, ""
            self.next_total = self._ask(n1, g, s, gain.error_after, gain.rows >= self.min_rows)
        point["ask"] = float(self.next_total or 0)
        self.curve.append(point)

    def shows_flat(self, g: float, s: float, rows: int) -> bool:
        """Whether the pooled evidence shows the curve flat (see the module docstring)."""
        return (len(self.evidence) >= 2 and rows >= self.min_rows
                and g + Z_ONE_SIDED * s < self.min_gain)

    def round_ask(self, stored: int) -> int:
        """The total to ask this round (once per data round; while stopped, counts to a probe).

        A probe while exhausted sets the next wait at once (twice this one): no rows, no
        comparison to set it.
        """
        if not self.done:
            return int(self.next_total or 0)
        if self.probe_after == 0:
            return 0
        self.probe_in -= 1
        if self.probe_in > 0:
            return 0
        if self.exhausted:
            self.probes += 1
            self.probe_wait *= 2
            self.probe_in = self.probe_wait
            return _growth_ask(stored, self.max_growth)
        return _growth_ask(stored, self.min_growth)

    def resume(self, stored: int) -> None:
        """Ask again after an exhausted stop: nodes' data grows (``max_growth`` of ``stored``)."""
        self.done, self.reason = False, ""
        self.next_total = _growth_ask(stored, self.max_growth)

    def stop(self, reason: str) -> None:
        """Stop asking: ``flat`` learning curve, or every node ``exhausted``.

        The first probe comes ``probe_after`` rounds later.
        """
        self.done, self.next_total, self.reason = True, 0, reason
        self.probe_in = self.probe_wait = self.probe_after

    def _ask(self, n1: int, g: float, s: float, e1: float, enough: bool = True) -> int:
        """The next ask from the upper bound ``g + z s`` of the gain per doubling at ``e1``.

        No held-out error left on ``enough`` rows (``min_rows``): no doubling can show a
        gain, the least growth; on fewer (a dozen rows all right) it says little: the most.
        """
        lo = n1 * (self.min_growth - 1)
        hi = n1 * (self.max_growth - 1)
        u = g + Z_ONE_SIDED * s
        want = lo if e1 == 0 and enough else hi
        if math.isfinite(u) and 0 < u < e1 and math.isfinite(e1):
            b = -math.log2(1 - u / e1)  # e(N) = a N^-b gains u per doubling at N1
            if b > 1e-6:  # past max_growth the ask is capped: no power that overflows
                ratio = u / self.min_gain
                want = (hi if math.log(ratio) / b > math.log(self.max_growth)
                        else n1 * ratio ** (1 / b) - n1)
        return max(math.ceil(min(max(want, lo), hi) - 1e-9), 1)

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps."""
        return {"next_total": self.next_total, "done": self.done, "reason": self.reason,
                "curve": [dict(p) for p in self.curve],
                "evidence": [list(p) for p in self.evidence],
                "probe_in": self.probe_in, "probe_wait": self.probe_wait,
                "unseen": self.unseen, "probes": self.probes}

    def load_state(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`state`."""
        self.next_total = state["next_total"]
        self.done = bool(state["done"])
        self.reason = str(state.get("reason", ""))
        self.curve = [dict(p) for p in state["curve"]]
        self.evidence = [(float(g), float(s)) for g, s in state.get("evidence", [])]
        self.probe_in = int(state.get("probe_in", 0))
        self.probe_wait = int(state.get("probe_wait", 0))
        self.unseen = int(state.get("unseen", 0))
        self.probes = int(state.get("probes", 0))


def _growth_ask(stored: int, growth: float) -> int:
    """Rows that grow a store of ``stored`` by the factor ``growth`` (at least one)."""
    return max(math.ceil(stored * (growth - 1) - 1e-9), 1)


def allocate(total: int, left: dict[int, int | None], fit: dict[int, float],
             unknown: float | None = None) -> dict[int, int]:
    """Split ``total`` samples over nodes, in proportion to what each has left and fits worst.

    ``left[node]``: samples not uploaded (``None``: not heard from, counted as holding
    ``unknown``, default the known ones' mean, at least 1); ``fit[node]``: mean held-out
    loss (missing: the others' mean). A node's weight is ``left * fit``; no node is asked
    for more than it has left, or is counted as holding (the rest goes to the others,
    largest remainders break rounding).
    """
    nodes = sorted(left)
    known = [v for v in left.values() if v is not None]
    if unknown is None:
        unknown = float(np.mean(known)) if known else 1.0
    mean_left = max(float(unknown), 1.0)
    caps = np.array([mean_left if (v := left[n]) is None else float(v) for n in nodes])
    mean_fit = float(np.mean(list(fit.values()))) if fit else 1.0
    w = np.array([c * max(float(fit.get(n, mean_fit)), 1e-6)
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
