"""One server round, the same steps for every strategy of the package.

:class:`RoundPipeline` is the round as a template method: :class:`RoundLedger` (what was
sent), :func:`screen_replies` (screens and decodes replies), the strategy's hooks;
:class:`ServerFigures` is what Flower's ``start`` and the harness need of every strategy;
:class:`FailureWatch` stops a run whose every sampled client keeps failing;
:class:`UpdateFigures` counts what an update round's replies carried.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from logging import INFO
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from flwr.app import ArrayRecord, Message, MetricRecord, MetricRecordValues
from flwr.common.logger import log

from dq_flower.server.client_errors import (
    FAILED_REPLIES,
    failed_node,
    failure_cause,
    one_traceback_per_cause,
)
from dq_flower.server.common import (
    REPLY_ERRORS,
    ClientFailureError,
    FedAvgArgs,
    NodeConfigurationError,
    log_rejected,
    log_round,
)
from dq_flower.wire.node_errors import node_config_problem
from dq_flower.wire.partition import without_partition

if TYPE_CHECKING:
    import torch
    from flwr.app import ConfigRecord
    from flwr.serverapp import Grid
    from flwr.serverapp.strategy import Result

__all__ = ["RoundLedger", "origin_problem", "Screened", "screen_replies", "FailureWatch",
           "ServerFigures", "ServerRound", "RoundPipeline", "ModelRounds", "UpdateFigures"]

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
        self.limit, self.name, self.announce = int(limit), name, announce
        self.streak, self.first_error = 0, ""

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



class ServerFigures:
    """What the harness and Flower's ``start`` need of every strategy of the package.

    Under ``start``, the :meth:`aggregate_round` metrics not in :attr:`client_metric_keys`
    and the :meth:`record_figures` join the ServerApp-side metrics (``evaluate_fn``'s win).
    """

    #: Keys of ``aggregate_round``'s metrics aggregated from the clients' replies; ``None``
    #: when all of them are (nothing moves).
    client_metric_keys: tuple[str, ...] | None = None
    #: The run's number of rounds, where the strategy plans ahead (set by ``start``).
    num_rounds: int | None = None
    #: Whether the strategy stops a run whose sampled clients all fail (else its driver does).
    watches_failures = False
    _round_figures: dict[int, dict[str, Any]] | None = None
    _figures_apart = False  # under ``start``: server-side metrics go to the figures
    #: FedAvg's other arguments (its metrics functions: on the accepted replies' records)
    fedavg = FedAvgArgs()
    _accepted_nodes: list[int] | None = None  # the last round's accepted replies' nodes

    @property
    def finished(self) -> bool:
        """Whether the strategy has nothing left to do (a driver may stop the run)."""
        return False

    def state_dict(self) -> dict:
        """What a resumed run needs (nothing here)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Inverse of :meth:`state_dict`."""

    def aggregate_round(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The round's new arrays and every metric of it (the strategy's hook)."""
        raise NotImplementedError

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Flower's ``aggregate_train``: :meth:`aggregate_round`, split under ``start``.

        A ``train_metrics_aggr_fn``'s metrics join the train metrics (its keys win).
        """
        replies = list(replies)
        arrays, metrics = self.aggregate_round(server_round, replies)
        fn = self.fedavg.train_metrics_aggr_fn
        users = None if fn is None else self.fedavg.aggregate(
            fn, replies, self._accepted_nodes or [], "train")
        keys = self.client_metric_keys
        if self._figures_apart and keys is not None and metrics is not None:
            keep = {k: v for k, v in metrics.items() if k in keys}
            self.record_figures(server_round, {k: v for k, v in metrics.items()
                                               if k not in keep})
            metrics = MetricRecord(keep) if keep else None
        if users is None:
            return arrays, metrics
        return arrays, MetricRecord({**(dict(metrics.items()) if metrics else {}), **users})

    def record_figures(self, server_round: int, figures: Mapping[str, Any]) -> None:
        """Keep ``figures`` of ``server_round`` for the ServerApp-side metrics."""
        if self._round_figures is None:
            self._round_figures = {}
        self._round_figures.setdefault(int(server_round), {}).update(figures)

    def round_figures(self, server_round: int) -> dict[str, Any]:
        """The figures recorded for ``server_round`` (empty if none)."""
        return dict((self._round_figures or {}).get(int(server_round), {}))

    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3,
              timeout: float = 3600, train_config: ConfigRecord | None = None,
              evaluate_config: ConfigRecord | None = None,
              evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
              ) -> Result:
        """Flower's ``Strategy.start`` (documented there), the figures joined in."""

        def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
            res = evaluate_fn(server_round, arrays) if evaluate_fn is not None else None
            figures = self.round_figures(server_round)
            if not figures:
                return res
            own = dict(res.items()) if res is not None else {}
            return MetricRecord({**own, **{k: v for k, v in figures.items() if k not in own}})

        self.num_rounds = int(num_rounds)
        self._figures_apart = True
        try:
            with one_traceback_per_cause():
                return super().start(grid, initial_arrays, num_rounds,  # type: ignore[misc]
                                     timeout, train_config, evaluate_config, evaluate)
        finally:
            self._figures_apart = False


P = TypeVar("P")


@dataclass
class ServerRound(Generic[P]):
    """One round as it goes through :class:`RoundPipeline`'s hooks."""

    number: int
    sent: dict[int, Message] | None  # what the strategy sent, by node (from its ledger)
    plan: P  # what :meth:`RoundPipeline.begin_round` took for the round (the strategy's type)
    replies: list[Message] = field(default_factory=list)  # every reply, as they came
    screened: Screened = field(default_factory=Screened)


class RoundPipeline(ServerFigures):
    """A server round as a template method: ledger, screen and decode, bound, aggregate."""

    ledger: RoundLedger

    def aggregate_round(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The template: see the class docstring."""
        replies = list(replies)
        rnd = ServerRound(int(server_round), self.ledger.take(server_round),
                          self.begin_round(int(server_round), replies), replies)
        rnd.screened = screen_replies(rnd.replies, lambda msg: self.decode_reply(rnd, msg),
                                      rnd.sent)
        self.observe_failures(rnd)
        out = self.aggregate_and_step(rnd, self.bound(rnd))
        self._accepted_nodes = rnd.screened.nodes
        return out

    def begin_round(self, server_round: int, replies: list[Message]) -> Any:
        """The round's plan, taken before its replies are decoded (here ``None``)."""
        return None

    def decode_reply(self, rnd: ServerRound, msg: Message) -> Any:
        """One reply decoded and checked; any exception rejects it with its reason."""
        raise NotImplementedError

    def observe_failures(self, rnd: ServerRound) -> None:
        """Count the round's failed replies (nothing here: the driver watches)."""

    def bound(self, rnd: ServerRound) -> Any:
        """The decoded replies checked against each other (here: all of them)."""
        return rnd.screened.accepted

    def aggregate_and_step(
        self, rnd: ServerRound, kept: Any
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Combine what :meth:`bound` kept and step the model: the round's result."""
        raise NotImplementedError


class ModelRounds(RoundPipeline):
    """A round pipeline around the user's model: the arrays it returns, and loads back."""

    model: torch.nn.Module
    _returned: ArrayRecord | None = None

    def _load_arrays(self, arrays: ArrayRecord | None) -> None:
        """Load arrays that did not come from this strategy (``initial_arrays``)."""
        if arrays is None or len(arrays) == 0 or arrays is self._returned:
            return
        self.model.load_state_dict(arrays.to_torch_state_dict(), strict=True)
        self._returned = arrays

    def _return_arrays(self) -> ArrayRecord:
        """The model's arrays for the round's result (known to :meth:`_load_arrays` again)."""
        self._returned = ArrayRecord(self.model.state_dict())  # Flower copies to the CPU
        return self._returned


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
