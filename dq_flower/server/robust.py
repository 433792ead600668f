"""Robust aggregation and plausibility bounds for the vectors clients send.

Every bound derives from what honest clients send in the same run (no tuning): a norm
screen against recent median norms (:class:`NormScreen`), clipping to the round's median
norm (:func:`clip_to_median`), leaving out nodes that keep pointing against the others
(:class:`DirectionScreen`), capped example weights (:func:`cap_weights`) and the robust
rules of :func:`aggregate`; :func:`bound_vectors` applies the screens to one round's
vectors, :class:`UpdateScreens` keeps them across a strategy's rounds.
"""

from __future__ import annotations

import copy
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from logging import WARNING
from typing import Any, TypeVar

import numpy as np
from flwr.common.logger import log
from flwr.serverapp.strategy.fedtrimmedavg import trim_mean

from dq_flower.server.pipeline import RoundLedger, Screened

__all__ = ["AGGREGATIONS", "aggregate", "weighted_mean", "trimmed_weighted_mean", "clip_norms",
           "clip_to_median", "cosines_with_others", "cap_weights", "hold_against",
           "DirectionScreen", "NormScreen", "StepGuard", "Bounded", "bound_vectors",
           "UpdateScreens"]

T = TypeVar("T")

#: A vector against its round whose norm exceeds this many times the median is scaled to
#: the median (:func:`hold_against`).
HOLD_ABOVE = 2.0
#: Aggregation rules of client vectors.
AGGREGATIONS = ("mean", "median", "trimmed-mean")


def clip_norms(vectors: list[np.ndarray], clip: float) -> list[np.ndarray]:
    """Scale every vector whose L2 norm exceeds ``clip`` down to norm ``clip`` (0: off)."""
    if clip <= 0:
        return vectors
    return [v if (norm := float(np.linalg.norm(v))) <= clip
            else (v * np.float32(clip / norm)).astype(np.float32) for v in vectors]


def clip_to_median(vectors: list[np.ndarray], factor: float) -> list[np.ndarray]:
    """Scale every vector down to at most ``factor`` times the median norm (0: off, < 3)."""
    if factor <= 0 or len(vectors) < 3:
        return vectors
    median = float(np.median([float(np.linalg.norm(v)) for v in vectors]))
    return clip_norms(vectors, factor * median) if median > 0 else vectors


def cosines_with_others(vectors: list[np.ndarray]) -> list[float | None]:
    """Each vector's cosine with the sum of the others (``None`` where a norm is zero)."""
    total = np.sum(np.stack([v.astype(np.float64) for v in vectors]), axis=0)
    out: list[float | None] = []
    for v in vectors:
        others = total - v
        norm, o_norm = float(np.linalg.norm(v)), float(np.linalg.norm(others))
        out.append(None if norm == 0 or o_norm == 0
                   else float(np.dot(v, others)) / (norm * o_norm))
    return out


class DirectionScreen:
    """Leave out nodes whose mean cosine with the others' mean is below ``min_cosine``.

    Over a node's last ``window`` rounds (at least ``warmup``), in rounds of three or more
    vectors (``<= -1``: off); a round where no node passes keeps every vector.
    :attr:`against` marks the vectors of the last round whose own cosine is below
    ``min_cosine``, whatever their node's history (see :func:`hold_against`).
    """

    def __init__(self, min_cosine: float = -0.1, window: int = 10, warmup: int = 3) -> None:
        self.min_cosine, self.window, self.warmup = float(min_cosine), int(window), int(warmup)
        self.cosines: dict[int, deque[float]] = {}
        self.against: list[bool] = []

    def keep(self, nodes: Sequence[int], vectors: list[np.ndarray]) -> list[bool]:
        """Which vectors go into the round's mean; records their nodes' cosines."""
        self.against = [False] * len(vectors)
        if self.min_cosine <= -1 or len(vectors) < 3:
            return [True] * len(vectors)
        out = []
        cosines = cosines_with_others(vectors)
        self.against = [c is not None and c < self.min_cosine for c in cosines]
        for node, cos in zip(nodes, cosines, strict=True):
            history = self.cosines.setdefault(int(node), deque(maxlen=self.window))
            if cos is not None:
                history.append(cos)
            out.append(len(history) < self.warmup
                       or float(np.mean(history)) >= self.min_cosine)
        return out if any(out) else [True] * len(vectors)

    def state_dict(self) -> dict:
        """Checkpointed state: each node's recent cosines."""
        return {"cosines": {node: list(c) for node, c in self.cosines.items()}}

    def load_state_dict(self, state: dict) -> None:
        """Inverse of :meth:`state_dict`."""
        self.cosines = {int(node): deque((float(c) for c in values), maxlen=self.window)
                        for node, values in state.get("cosines", {}).items()}


def hold_against(vectors: list[np.ndarray], weights: list[float], against: Sequence[bool],
                 above: float = HOLD_ABOVE) -> tuple[list[np.ndarray], list[float]]:
    """Vectors ``against`` the round at the median weight at most, large ones at its norm.

    Large: a norm above ``above`` times the round's median; such a vector is scaled to the
    median norm. A node's good rounds (or the direction screen's warm-up) cannot buy a
    large reversed step; honest updates that point against the others now and then
    (non-IID data) keep their size. The others are returned as they are.
    """
    if not any(against) or len(vectors) < 3:
        return vectors, [float(w) for w in weights]
    norm = float(np.median([float(np.linalg.norm(v)) for v in vectors]))
    weight = float(np.median(weights))
    out = [(v * np.float32(norm / n)).astype(np.float32)
           if a and (n := float(np.linalg.norm(v))) > above * norm else v
           for v, a in zip(vectors, against, strict=True)]
    return out, [min(float(w), weight) if a else float(w)
                 for w, a in zip(weights, against, strict=True)]


def weighted_mean(vectors: list[np.ndarray], weights: list[float]) -> np.ndarray:
    """``sum_k w_k v_k / sum_k w_k`` accumulated in float64, returned as float32."""
    total = float(sum(weights))
    acc = np.zeros(vectors[0].size, dtype=np.float64)
    for v, w in zip(vectors, weights, strict=True):
        acc += (float(w) / total) * v.astype(np.float64)
    return acc.astype(np.float32)


def aggregate(vectors: list[np.ndarray], weights: list[float], rule: str = "mean",
              trim_fraction: float = 0.2) -> np.ndarray:
    """Combine client vectors by ``rule`` (``mean`` is weighted by ``weights``)."""
    if not vectors:
        raise ValueError("nothing to aggregate")
    if rule == "mean":
        return weighted_mean(vectors, weights)
    stacked = np.stack([v.astype(np.float32) for v in vectors])
    if rule == "median":
        return np.median(stacked, axis=0).astype(np.float32)
    if rule == "trimmed-mean":
        return np.asarray(trim_mean(stacked, trim_fraction), dtype=np.float32)
    raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {rule!r}")


def trimmed_weighted_mean(values: list[float], weights: list[float], trim: float) -> float:
    """The weighted mean of ``values`` without their ``floor(trim * n)`` lowest and highest.

    With ``trim > 0`` and too few values to trim one (three or four at 0.2), the lowest and
    the highest are bounded by the others: within their span widened by that span and a
    quarter of the median's size, so honest figures pass as they are and one node's 1e30 does
    not set the figure.
    """
    n = len(values)
    if n == 0 or len(weights) != n:
        raise ValueError("trimmed_weighted_mean needs one weight per value, at least one")
    k = int(np.floor(max(trim, 0.0) * n + 1e-9)) if n > 2 else 0
    order = sorted(range(n), key=lambda i: values[i])
    if k == 0 and trim > 0 and n > 2:
        slack = 0.25 * abs(float(np.median(values)))
        above, below = [values[i] for i in order[:-1]], [values[i] for i in order[1:]]
        high = max(above) + (max(above) - min(above)) + slack
        low = min(below) - (max(below) - min(below)) - slack
        values = [min(max(v, low), high) for v in values]
    kept = order[k:n - k]
    total = math.fsum(weights[i] for i in kept)
    return math.fsum(weights[i] * values[i] for i in kept) / total


def cap_weights(weights: list[float], factor: float = 2.0) -> list[float]:
    """Weights capped at ``factor`` times their median (unchanged with one or two)."""
    if len(weights) < 3 or factor <= 0:
        return [float(w) for w in weights]
    cap = factor * float(np.median(weights))
    return [min(float(w), cap) for w in weights]


class NormScreen:
    """Reject vectors whose norm exceeds ``factor`` (0: off) times a robust reference.

    The reference is the largest of the last ``history`` accepted medians (a first round:
    its own, from three vectors; with ``round_first`` a round of three or more is its own);
    a round rejecting every vector raises it ``growth`` times.
    """

    def __init__(self, factor: float = 5.0, history: int = 5, growth: float = 2.0,
                 round_first: bool = False) -> None:
        self.factor, self.growth, self.round_first = float(factor), float(growth), bool(round_first)
        self.medians: deque[float] = deque(maxlen=history)

    def reference(self, norms: list[float]) -> float | None:
        """The reference norm for a round whose valid vectors have ``norms``."""
        if self.round_first and len(norms) >= 3:
            return float(np.median(norms))
        if self.medians:
            return max(self.medians)
        return float(np.median(norms)) if len(norms) >= 3 else None

    def keep(self, norms: list[float]) -> list[bool]:
        """Which vectors pass; records the round's median for later rounds."""
        if self.factor <= 0 or not norms:
            return [True] * len(norms)
        ref = self.reference(norms)
        keep = [True] * len(norms) if ref is None or ref == 0 else [
            n <= self.factor * ref for n in norms]
        passed = [n for n, k in zip(norms, keep, strict=True) if k]
        if passed:
            self.medians.append(float(np.median(passed)))
        elif ref is not None and ref > 0:
            self.medians.append(self.growth * ref)
        return keep

    def state_dict(self) -> dict:
        """Checkpointed state: the recorded medians."""
        return {"medians": list(self.medians)}

    def load_state_dict(self, state: dict) -> None:
        """Inverse of :meth:`state_dict`."""
        self.medians.clear()
        self.medians.extend(float(m) for m in state.get("medians", []))


class StepGuard:
    """Undo a round's optimizer steps that left a parameter or buffer non-finite."""

    def __init__(self, model, optimizer) -> None:
        self.model = model
        self.optimizer = optimizer
        self._saved: tuple[dict, Any, dict | None] | None = None

    def begin(self) -> None:
        """Snapshot the model, and the optimizer with its state, before the round's steps."""
        opt = copy.deepcopy(self.optimizer.state_dict()) if self.optimizer is not None else None
        self._saved = ({k: v.detach().clone() for k, v in self.model.state_dict().items()},
                       self.optimizer, opt)

    def finite_or_restore(self) -> bool:
        """``True`` if the model is finite; else restore the snapshot and return ``False``."""
        from dq_flower.model_ops import finite_since  # PyTorch: only where a model is at hand

        finite = finite_since(self.model, {} if self._saved is None else self._saved[0])
        if not finite:
            self.restore()
        return finite

    def restore(self) -> None:
        """Put back the snapshot :meth:`begin` took (none taken: nothing).

        An optimizer the steps switched to (the optimizer probe's choice) keeps its own
        settings and starts afresh: its moments were of steps undone, and the state of
        another kind of optimizer would break its next step.
        """
        if self._saved is None:
            return
        model_state, optimizer, opt_state = self._saved
        self.model.load_state_dict(model_state)
        if self.optimizer is None:
            return
        if self.optimizer is not optimizer:
            self.optimizer.state.clear()
        elif opt_state is not None:
            self.optimizer.load_state_dict(opt_state)

    def run(self, steps: Callable[[], float]) -> tuple[float, str | None]:
        """``steps()``'s loss and ``None``, or NaN and what went wrong (restored).

        Steps that left the model non-finite, or in which the user's model raised on the
        rows it trained on (a category index past its embedding's rows: a hostile node's
        table can decode to one), are undone; the run goes on.
        """
        self.begin()
        try:
            loss = steps()
        except (RuntimeError, IndexError, ValueError) as exc:  # the user's model on the rows
            self.restore()
            return float("nan"), f"raised {type(exc).__name__}: {exc}"
        return (loss, None) if self.finite_or_restore() else (float("nan"),
                                                              "made the model non-finite")


@dataclass
class Bounded:
    """Vectors that passed :func:`bound_vectors`, clipped, with their capped weights."""

    vectors: list[np.ndarray]
    weights: list[float]
    reasons: list[str | None]  # per input vector: why it was rejected (None: kept)
    agree: list[bool] = field(default_factory=list)  # per kept vector: in the mean
    misaligned: list[int] = field(default_factory=list)  # nodes left out for direction

    @property
    def keep(self) -> list[bool]:
        """Per input vector: whether it passed the norm and direction screens."""
        return [r is None for r in self.reasons]


def bound_vectors(vectors: list[np.ndarray], weights: list[float], screen: NormScreen,
                  *, clip_factor: float, clip_norm: float = 0.0, weight_cap: float = 2.0,
                  directions: DirectionScreen | None = None, what: str = "update",
                  nodes: Sequence[int] | None = None) -> Bounded:
    """Norm screen, clip to ``clip_factor`` x the median norm, direction screen, cap weights.

    A vector against this round's others (:attr:`DirectionScreen.against`) is held to the
    median weight, and to the median norm if it is large (:func:`hold_against`), even where
    its node's history keeps it in the mean.
    """
    nodes = list(nodes) if nodes is not None else list(range(len(vectors)))
    norms = [float(np.linalg.norm(v)) for v in vectors]
    passed = screen.keep(norms)
    kept = [v for v, k in zip(vectors, passed, strict=True) if k]
    kept = clip_norms(clip_to_median(kept, clip_factor), clip_norm)
    kept_nodes = [n for n, k in zip(nodes, passed, strict=True) if k]
    # directions compared at no more than the median norm whatever the clip: one scaled,
    # reversed vector must not turn the "mean of the others" of every honest one around
    agree = (directions.keep(kept_nodes, clip_to_median(kept, 1.0)) if directions is not None
             else [True] * len(kept))
    kept_w = [w for w, k in zip(weights, passed, strict=True) if k]
    if directions is not None:  # this round's reversals: at most a median step and weight
        kept, kept_w = hold_against(kept, kept_w, directions.against)
    reasons: list[str | None] = [
        None if k else (f"{what} norm is implausibly large against the other clients' "
                        "(norm-bound-factor)") for k in passed]
    left_out = [n for n, a in zip(kept_nodes, agree, strict=True) if not a]
    for node in left_out:
        log(WARNING, "node %d's %s points against the round's other updates: left out of "
            "this round's mean (min-cosine, over its recent rounds)", node, what)
    kept_w = [w for w, a in zip(kept_w, agree, strict=True) if a]
    kept = [v for v, a in zip(kept, agree, strict=True) if a]
    return Bounded(kept, cap_weights(kept_w, weight_cap), reasons, agree, left_out)


class UpdateScreens:
    """The norm and direction screens of a strategy's update vectors, across rounds."""

    def _screens(self, cfg: Any) -> None:
        """The round ledger, and the screens of ``cfg``'s ``norm-bound-factor``, ``min-cosine``."""
        self.ledger = RoundLedger()
        self.norms = NormScreen(cfg.norm_bound_factor)
        self.directions = DirectionScreen(cfg.min_cosine)

    def _bound(self, screened: Screened[T], items: list[T], vectors: list[np.ndarray],
               weights: list[float], nodes: list[int], **clips: Any
               ) -> tuple[list[T], Bounded]:
        """``items`` (of ``nodes``) as accepted, bounded: those left in the mean, the bounds."""
        screened.accepted, screened.nodes = items, nodes
        bounded = bound_vectors(vectors, weights, self.norms, directions=self.directions,
                                nodes=nodes, **clips)
        screened.keep(bounded.reasons)
        return [i for i, a in zip(screened.accepted, bounded.agree, strict=True) if a], bounded

    def _screens_state(self) -> dict:
        return {"norms": self.norms.state_dict(), "directions": self.directions.state_dict()}
