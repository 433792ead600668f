"""Pieces every strategy of this package shares: node sampling, reply screening, optimizers.

Also the failure watch (a run whose every sampled client fails for several consecutive
rounds stops with the first client error) and Flower-style federated evaluation.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from logging import INFO, WARNING
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result

from dq_flower.codecs import PayloadError
from dq_flower.seeding import round_rng  # re-exported: its old home

__all__ = [
    "sample_node_ids",
    "wait_for_nodes",
    "make_optimizer",
    "log_rejected",
    "screen_replies",
    "FailureWatch",
    "ClientFailureError",
    "FederatedEvaluation",
    "ModelStrategy",
    "ServerFigures",
    "round_rng",
]

#: What a reply validator may raise for a malformed reply.
REPLY_ERRORS = (PayloadError, ValueError, KeyError, TypeError)


def wait_for_nodes(grid: Grid, min_nodes: int, timeout: float = 3600.0) -> list[int]:
    """Connected node ids, after waiting (up to ``timeout`` s) for ``min_nodes`` of them."""
    start = time.monotonic()
    while len(nodes := sorted(int(n) for n in grid.get_node_ids())) < min_nodes:
        if time.monotonic() - start > timeout:
            raise RuntimeError(f"only {len(nodes)} nodes connected after {timeout:.0f} s; "
                               f"min-available-nodes is {min_nodes}")
        log(INFO, "waiting for nodes to connect: %d connected (minimum %d)", len(nodes),
            min_nodes)
        time.sleep(1.0)
    return nodes


def sample_node_ids(
    grid: Grid, fraction: float, min_nodes: int, rng: np.random.Generator,
    stage: str = "configure_train",
) -> list[int]:
    """Seeded sample of ``ceil(fraction * connected)`` nodes (at least ``min_nodes``).

    Waits for ``min_nodes`` connected nodes first and logs the line Flower's strategies
    log (``configure_train: Sampled 4 nodes (out of 4)``, ``stage`` naming the step).
    """
    nodes = wait_for_nodes(grid, min_nodes)
    if not nodes:
        return []
    k = min(len(nodes), max(min_nodes, int(np.ceil(fraction * len(nodes))), 1))
    log(INFO, "%s: Sampled %s nodes (out of %s)", stage, k, len(nodes))
    if k == len(nodes):
        return nodes
    # Draw positions, not ids: Flower's node ids are unsigned 64-bit, which numpy would
    # turn into float64 (losing digits) when ids on both sides of 2**63 are mixed.
    return sorted(nodes[int(i)] for i in rng.choice(len(nodes), size=k, replace=False))


def make_optimizer(
    name: str, params, lr: float, momentum: float, weight_decay: float
) -> torch.optim.Optimizer:
    """SGD with momentum and weight decay, or Adam."""
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)
    raise ValueError(f"optimizer must be sgd or adam, got {name!r}")


def log_rejected(node_id: int, reason: str) -> None:
    """Log a rejected reply with its reason."""
    log(WARNING, "rejected reply from node %d: %s", node_id, reason)


def screen_replies(
    replies: Iterable[Message], validate: Callable[[Message], Any]
) -> tuple[list[tuple[int, Any]], int, int]:
    """Validate every reply: ``([(node, validate(msg)), ...], rejected, failed)``.

    Replies carrying an error count as failed (their reason is logged); a reply ``validate``
    raises on is rejected, with its reason logged, and so is a second reply from a node that
    already answered.
    """
    valid, rejected, failed = [], 0, 0
    seen: set[int] = set()
    for msg in replies:
        node = msg.metadata.src_node_id
        if msg.has_error():
            failed += 1
            log(WARNING, "reply from node %d failed: %s", node, msg.error.reason)
            continue
        if node in seen:  # one reply per node and round: a second is not used twice
            rejected += 1
            log_rejected(node, "a second reply from this node in the same round")
            continue
        seen.add(node)
        try:  # every exception a reply can cause is caught here: the round goes on
            valid.append((node, validate(msg)))
        except Exception as exc:  # noqa: BLE001
            rejected += 1
            reason = str(exc) if isinstance(exc, REPLY_ERRORS) else (
                f"{type(exc).__name__}: {exc}")
            log_rejected(node, reason)
    return valid, rejected, failed


def log_round(name: str, server_round: int, text: str) -> None:
    """One progress line per round."""
    log(INFO, "[%s] round %d: %s", name, server_round, text)


class ClientFailureError(RuntimeError):
    """Every sampled client failed for several consecutive rounds."""


class FailureWatch:
    """Stop a run whose every sampled client fails ``limit`` rounds in a row.

    ``limit`` 0 never stops. The error quotes the first client error seen in that streak,
    which is usually the cause (an unknown model, a missing data file, a bad shape). With
    ``announce`` each round logs the line Flower's strategies log
    (``aggregate_train: Received 4 results and 0 failures``).
    """

    def __init__(self, limit: int, name: str, announce: bool = True) -> None:
        self.limit = int(limit)
        self.name = name
        self.announce = announce
        self.streak = 0
        self.first_error = ""

    def observe(self, replies: list[Message]) -> None:
        """Record one round's replies; raise :class:`ClientFailureError` at the limit."""
        if self.announce:
            failed = sum(1 for m in replies if m.has_error())
            log(INFO, "aggregate_train: Received %s results and %s failures",
                len(replies) - failed, failed)
        if not replies or not all(m.has_error() for m in replies):
            self.streak, self.first_error = 0, ""
            return
        self.streak += 1
        if not self.first_error:
            self.first_error = str(replies[0].error.reason)
        if self.limit and self.streak >= self.limit:
            raise ClientFailureError(
                f"[{self.name}] every sampled client failed for {self.streak} consecutive "
                f"rounds; first client error: {self.first_error}")


class FederatedEvaluation:
    """Flower-style federated evaluation, mixed into the package's strategies.

    With ``fraction_evaluate > 0`` the sampled nodes get the global model as a state-dict
    ``ArrayRecord`` under ``arrays`` and a config under ``config`` (the layout of Flower's
    ``FedAvg``, so a ClientApp's usual ``@app.evaluate()`` handler works), and their
    ``MetricRecord`` replies are averaged weighted by ``num-examples``.
    """

    fraction_evaluate: float = 0.0
    min_evaluate_nodes: int = 1
    seed: int = 0

    def configure_evaluate(  # noqa: D102
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> list[Message]:
        if self.fraction_evaluate <= 0:
            return []
        nodes = sample_node_ids(grid, self.fraction_evaluate, self.min_evaluate_nodes,
                                round_rng(self.seed, server_round, 0, purpose=5),
                                stage="configure_evaluate")
        cfg = ConfigRecord(dict(config.items()))
        cfg["server-round"] = server_round
        return [Message(content=RecordDict({"arrays": arrays, "config": cfg}),
                        message_type=MessageType.EVALUATE, dst_node_id=n) for n in nodes]

    def aggregate_evaluate(  # noqa: D102
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        totals: dict[str, float] = {}
        weight = 0.0
        for msg in replies:
            if msg.has_error():
                continue
            records = list(msg.content.metric_records.values())
            if len(records) != 1:
                log_rejected(msg.metadata.src_node_id, "evaluate reply needs one MetricRecord")
                continue
            rec = records[0]
            n = rec.get("num-examples")
            if isinstance(n, bool) or not isinstance(n, (int, float)) or not 0 < n < 2**31:
                log_rejected(msg.metadata.src_node_id, f"evaluate num-examples={n!r}")
                continue
            values = {k: float(v) for k, v in rec.items()
                      if k != "num-examples" and isinstance(v, (int, float))
                      and not isinstance(v, bool) and np.isfinite(v)}
            for key, value in values.items():
                totals[key] = totals.get(key, 0.0) + float(n) * value
            weight += float(n)
        if not weight:
            return None
        return MetricRecord({k: v / weight for k, v in totals.items()})


class ServerFigures:
    """Server-side figures of each round, reported where Flower reports the ServerApp's own.

    A strategy records its round's figures (payload bits, rejected replies, server time)
    with :meth:`record_figures`; ``start`` adds them to the round's ServerApp-side metrics
    (``Result.evaluate_metrics_serverapp``, beside what ``evaluate_fn`` returns, whose keys
    win), not to the aggregated ClientApp-side train metrics. A strategy whose
    ``aggregate_train`` returns both kinds lists the client-side keys in
    :attr:`client_metric_keys`: under ``start`` the other keys move to the figures (a
    driver calling ``aggregate_train`` itself, as the harness does, still gets them all).
    """

    #: Keys of ``aggregate_train``'s metrics aggregated from the clients' replies; ``None``
    #: when all of them are (nothing moves).
    client_metric_keys: tuple[str, ...] | None = None

    def record_figures(self, server_round: int, figures: Mapping[str, Any]) -> None:
        """Keep ``figures`` of ``server_round`` for the ServerApp-side metrics."""
        store: dict[int, dict[str, Any]] = self.__dict__.setdefault("_round_figures", {})
        store.setdefault(int(server_round), {}).update(figures)

    def round_figures(self, server_round: int) -> dict[str, Any]:
        """The figures recorded for ``server_round`` (empty if none)."""
        return dict(self.__dict__.get("_round_figures", {}).get(int(server_round), {}))

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
            out = MetricRecord(dict(res.items()) if res is not None else {})
            for key, value in figures.items():
                if key not in out:
                    out[key] = value
            return out

        client_keys = self.client_metric_keys
        if client_keys is not None:
            aggregate = self.aggregate_train  # type: ignore[has-type]

            def split(server_round: int, replies: Iterable[Message]):
                arrays, metrics = aggregate(server_round, replies)
                if metrics is None:
                    return arrays, None
                keep = {k: v for k, v in metrics.items() if k in client_keys}
                self.record_figures(server_round, {k: v for k, v in metrics.items()
                                                   if k not in keep})
                return arrays, MetricRecord(keep) if keep else None

            self.aggregate_train = split  # for this run only
        try:
            return super().start(grid, initial_arrays, num_rounds,  # type: ignore[misc]
                                 timeout, train_config, evaluate_config, evaluate)
        finally:
            self.__dict__.pop("aggregate_train", None)


class ModelStrategy(ServerFigures, FederatedEvaluation):
    """What the package's strategies share around the user's model.

    Seeded sampling settings, federated evaluation, loading ``initial_arrays`` (or any
    arrays the strategy did not return itself) into the model at the start of a round, and
    server-side figures reported with the ServerApp's own (:class:`ServerFigures`; every
    metric of the round is the server's unless :attr:`client_metric_keys` lists it).
    """

    client_metric_keys: tuple[str, ...] | None = ()

    def _setup(self, model: torch.nn.Module, *, seed: int, fraction_train: float,
               min_available_nodes: int, fraction_evaluate: float,
               min_evaluate_nodes: int) -> None:
        """Check and keep the arguments every strategy of the package takes."""
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if not 0 < fraction_train <= 1:
            raise ValueError(f"fraction_train must be in (0, 1], got {fraction_train}")
        if not 0 <= fraction_evaluate <= 1:
            raise ValueError(f"fraction_evaluate must be in [0, 1], got {fraction_evaluate}")
        if min_available_nodes < 1:
            raise ValueError(f"min_available_nodes must be >= 1, got {min_available_nodes}")
        self.model = model
        self.seed = int(seed)
        self.fraction_train = float(fraction_train)
        self.min_available_nodes = int(min_available_nodes)
        self.fraction_evaluate = float(fraction_evaluate)
        self.min_evaluate_nodes = int(min_evaluate_nodes)
        self._returned: ArrayRecord | None = None

    def _load_arrays(self, arrays: ArrayRecord | None) -> None:
        """Load arrays that did not come from this strategy (``initial_arrays``)."""
        if arrays is None or len(arrays) == 0 or arrays is self._returned:
            return
        self.model.load_state_dict(arrays.to_torch_state_dict(), strict=True)
        self._returned = arrays

