"""One server round's replies, the same steps for every strategy of the package.

:func:`screen_replies` screens and decodes replies; :class:`FailureWatch` stops a run whose
every sampled client keeps failing; :func:`bound_vectors` screens, clips and weighs uploaded
vectors.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from logging import INFO, WARNING
from typing import Any, Generic, Protocol, TypeVar

import numpy as np
from flwr.app import Message, MetricRecordValues
from flwr.common.logger import log

from dq_flower.server.client_errors import FAILED_REPLIES, failed_node, failure_cause
from dq_flower.server.common import (
    REPLY_ERRORS,
    ClientFailureError,
    NodeConfigurationError,
    log_rejected,
    log_round,
)
from dq_flower.server.robust import (
    DirectionScreen,
    NormScreen,
    cap_weights,
    clip_norms,
    clip_to_median,
    hold_against,
)
from dq_flower.wire.node_errors import node_config_problem
from dq_flower.wire.partition import without_partition

__all__ = ["RoundLedger", "origin_problem", "Screened", "screen_replies", "FailureWatch",
           "Bounded", "bound_vectors", "UpdateScreens", "UpdateFigures"]

T = TypeVar("T")


class RoundLedger:
    """What a strategy sent in each round (by node, stamped with the round's ``group_id``)."""

    def __init__(self) -> None:
        self._rounds: dict[int, dict[int, Message]] = {}

    def record(self, server_round: int, messages: Iterable[Message]) -> list[Message]:
        """Keep ``messages`` as the round's, stamped with the round; return them."""
        out = list(messages)
        for msg in out:
            msg.metadata.group_id = str(int(server_round))
        self._rounds[int(server_round)] = {int(m.metadata.dst_node_id): m for m in out}
        return out

    def take(self, server_round: int) -> dict[int, Message] | None:
        """The round's messages by node (``None``: the round was not configured here)."""
        return self._rounds.pop(int(server_round), None)


def origin_problem(reply: Message, sent: dict[int, Message] | None) -> str | None:
    """Why ``reply`` does not answer what was sent this round (``None``: it does, or unknown)."""
    if sent is None:
        return None
    meta = reply.metadata
    asked = sent.get(int(meta.src_node_id))
    if asked is None:
        kind = next(iter(sent.values())).metadata.message_type if sent else "train"
        return f"no {kind} message was sent to this node this round (it was not sampled)"
    if meta.message_type != asked.metadata.message_type:
        return (f"a {meta.message_type!r} reply to a {asked.metadata.message_type!r} "
                "message")
    if asked.metadata.group_id and meta.group_id != asked.metadata.group_id:
        return f"a reply for round {meta.group_id!r}, not round {asked.metadata.group_id}"
    if asked.metadata.message_id and meta.reply_to_message_id != asked.metadata.message_id:
        return "the reply answers another message than the one sent to this node"
    return None


@dataclass
class Screened(Generic[T]):
    """A round's replies after screening: the decoded ones, and what happened to the rest."""

    accepted: list[T] = field(default_factory=list)
    nodes: list[int] = field(default_factory=list)  # the node of each accepted reply
    rejected: int = 0
    failed: int = 0  # error replies and silent nodes
    silent: int = 0  # sampled nodes that sent nothing before the round's timeout
    failed_nodes: list[int] = field(default_factory=list)  # those, and error replies' nodes
    replies: list[Message] = field(default_factory=list)  # every reply, as received
    started: float = field(default_factory=time.perf_counter)  # when screening began

    def reject(self, node: int, reason: str) -> None:
        """Count and log one rejected reply."""
        self.rejected += 1
        log_rejected(node, reason)

    def keep(self, reasons: Sequence[str | None]) -> None:
        """Keep the accepted replies whose reason is ``None``; reject the others with it."""
        for node, reason in zip(self.nodes, reasons, strict=True):
            if reason is not None:
                self.reject(node, reason)
        self.accepted = [a for a, r in zip(self.accepted, reasons, strict=True) if r is None]
        self.nodes = [n for n, r in zip(self.nodes, reasons, strict=True) if r is None]

    def keep_uncontested(self, identity: Callable[[T], int], contested: set[int],
                         order: Callable[[T], Any], node: Callable[[T], int]) -> None:
        """Accepted replies in ``order``; those of a ``contested`` ``identity`` rejected."""
        self.accepted = sorted(self.accepted, key=order)
        self.nodes = [node(a) for a in self.accepted]
        self.keep([f"client identity {identity(a)} was contested this round: granted to "
                   "neither" if identity(a) in contested else None for a in self.accepted])


def screen_replies(replies: Iterable[Message], decode: Callable[[Message], T],
                   sent: dict[int, Message] | None = None) -> Screened[T]:
    """Screen one round's replies and decode the good ones (an exception rejects just one)."""
    out: Screened[T] = Screened(replies=list(replies))
    seen: set[int] = set()
    for msg in out.replies:
        node = int(msg.metadata.src_node_id)
        problem = origin_problem(msg, sent)
        if problem is not None:
            out.reject(node, problem)
            continue
        if node in seen:  # one reply per node and round: a second is not used twice
            out.reject(node, "a second reply from this node in the same round")
            continue
        seen.add(node)
        if msg.has_error():
            out.failed += 1
            out.failed_nodes.append(node)
            FAILED_REPLIES.log(node, str(msg.error.reason))
            continue
        try:
            decoded = decode(msg)
        except Exception as exc:  # noqa: BLE001  (any reply error rejects just that reply)
            out.reject(node, str(exc) if isinstance(exc, REPLY_ERRORS) else
                       f"{type(exc).__name__}: {exc}")
            continue
        out.accepted.append(decoded)
        out.nodes.append(node)
    if sent is not None:
        out.silent = len(set(sent) - seen)
        out.failed += out.silent
        out.failed_nodes += sorted(set(sent) - seen)
    return out


class FailureWatch:
    """Stop a run whose every sampled client fails ``limit`` rounds in a row (0: never)."""

    def __init__(self, limit: int, name: str, announce: bool = True) -> None:
        self.limit = int(limit)
        self.name = name
        self.announce = announce
        self.streak = 0
        self.first_error = ""

    def observe(self, replies: list[Message], silent: int = 0, counts: bool = True) -> None:
        """Record one round's replies (``silent``: nodes that sent nothing); raise at the limit."""
        errors = [m for m in replies if m.has_error()]
        if self.announce:
            log(INFO, "aggregate_train: Received %s results and %s failures",
                len(replies) - len(errors), len(errors) + silent)
        for message in errors:
            reason = str(message.error.reason)
            problem = node_config_problem(reason)
            if problem is not None:
                raise NodeConfigurationError(
                    f"[{self.name}] {failed_node(message.metadata.src_node_id, reason)} cannot "
                    f"run as configured: {without_partition(problem)}")
        if not counts or (not replies and not silent):
            return
        if len(errors) < len(replies):
            self.streak, self.first_error = 0, ""
            return
        self.streak += 1
        if not self.first_error:
            self.first_error = (self._first(errors[0]) if errors else
                                f": no reply from the {silent} sampled node(s) before the "
                                "round's timeout")
        if self.limit and self.streak >= self.limit:
            raise ClientFailureError(
                f"[{self.name}] every sampled client failed for {self.streak} consecutive "
                f"rounds; first client error{self.first_error}")

    @staticmethod
    def _first(error: Message) -> str:
        """``, from node 5 (partition 2): ValueError: ...`` for a failed reply."""
        reason = str(error.error.reason)
        return (f", from {failed_node(error.metadata.src_node_id, reason)}: "
                f"{failure_cause(reason)}")


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
