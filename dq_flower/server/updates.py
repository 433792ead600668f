"""Uploaded update vectors across a server round: bounded, screened, counted.

:func:`bound_vectors` screens, clips and weighs one round's vectors; :class:`UpdateScreens`
keeps the norm and direction screens across rounds; :class:`UpdateFigures` counts what the
round's update replies carried.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from logging import WARNING
from typing import Any, Protocol, TypeVar

import numpy as np
from flwr.app import MetricRecordValues
from flwr.common.logger import log

from dq_flower.server.common import log_round
from dq_flower.server.pipeline import RoundLedger, Screened
from dq_flower.server.robust import (
    DirectionScreen,
    NormScreen,
    cap_weights,
    clip_norms,
    clip_to_median,
    hold_against,
)

__all__ = ["Bounded", "bound_vectors", "UpdateScreens", "UpdateFigures"]

T = TypeVar("T")


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


class Coded(Protocol):
    """A decoded update reply: the bits its payload carried, as sent and before coding."""

    @property
    def payload_bits(self) -> int: ...  # noqa: D102

    @property
    def raw_bits(self) -> int: ...  # noqa: D102


@dataclass
class UpdateFigures:
    """An update round's uplink and screening figures (``replies``: those the round used)."""

    coded_replies: int
    up_payload_bits: int
    up_raw_payload_bits: int
    started: float
    down_payload_bits: int = 0
    replies: int = 0
    rejected: int = 0
    failed: int = 0

    @classmethod
    def decoded(cls, screened: Screened, coded: Sequence[Coded]) -> UpdateFigures:
        """The figures of the replies ``screened`` decoded (``coded``), before bounding."""
        return cls(len(coded), sum(int(c.payload_bits) for c in coded),
                   sum(int(c.raw_bits) for c in coded), screened.started)

    def close(self, screened: Screened, replies: int) -> None:
        """Take the screening's final counts; ``replies``: the replies the round used."""
        self.replies, self.rejected, self.failed = replies, screened.rejected, screened.failed

    def log(self, name: str, server_round: int, lead: str, misaligned: int) -> None:
        """The round's progress line: ``lead``, then what was rejected, left out, sent."""
        log_round(name, server_round, f"{lead}, rejected {self.rejected}, left out "
                  f"{misaligned}, failed {self.failed}, up {self.up_payload_bits} payload bits")

    def metrics(self) -> dict[str, MetricRecordValues]:
        """The figures by their metric keys (``server-time-s`` measured now)."""
        return {
            "up-payload-bits": self.up_payload_bits,
            "up-raw-payload-bits": self.up_raw_payload_bits,
            "down-payload-bits": self.down_payload_bits,
            "replies": self.replies,
            "coded-replies": self.coded_replies,
            "rejected": self.rejected,
            "failed": self.failed,
            "server-time-s": time.perf_counter() - self.started,
        }
