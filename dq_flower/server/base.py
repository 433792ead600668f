"""What the package's strategies share around Flower's ``Strategy``: figures, rounds, model."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result

from dq_flower.config import StrategyConfig, field_keys, read, refuse_unknown
from dq_flower.server.client_errors import one_traceback_per_cause
from dq_flower.server.common import FedAvgArgs
from dq_flower.server.evaluation import FederatedEvaluation
from dq_flower.server.pipeline import RoundLedger, Screened, screen_replies

__all__ = ["DrivenStrategy", "ServerFigures", "ServerRound", "RoundPipeline", "ModelStrategy",
           "strategy_kwargs"]


class DrivenStrategy(Protocol):
    """What a driver of rounds (the harness) calls on a strategy (see :class:`ServerFigures`)."""

    num_rounds: int | None
    watches_failures: bool

    @property
    def finished(self) -> bool: ...  # noqa: D102

    def configure_train(self, server_round: int, arrays: ArrayRecord,  # noqa: D102
                        config: ConfigRecord, grid: Grid) -> Iterable[Message]: ...

    def aggregate_train(self, server_round: int, replies: Iterable[Message],  # noqa: D102
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]: ...

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord,  # noqa: D102
                           config: ConfigRecord, grid: Grid) -> Iterable[Message]: ...

    def aggregate_evaluate(self, server_round: int,  # noqa: D102
                           replies: Iterable[Message]) -> MetricRecord | None: ...

    def round_figures(self, server_round: int) -> dict[str, Any]: ...  # noqa: D102

    def state_dict(self) -> dict: ...  # noqa: D102

    def load_state_dict(self, state: dict) -> None: ...  # noqa: D102


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
            out = MetricRecord(dict(res.items()) if res is not None else {})
            for key, value in figures.items():
                if key not in out:
                    out[key] = value
            return out

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


class ModelStrategy(RoundPipeline, FederatedEvaluation):
    """What the package's strategies share around the user's model: sampling, evaluation."""

    client_metric_keys: tuple[str, ...] | None = ()
    watches_failures = True

    def _setup(self, model: torch.nn.Module, args: StrategyConfig,
               fedavg: FedAvgArgs | None = None) -> None:
        """Keep the model and the arguments every strategy of the package takes (checked)."""
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if any(t.dtype == torch.bfloat16 for t in model.state_dict().values()):
            raise ValueError("the model holds bfloat16 tensors, which Flower's ArrayRecord "
                             "cannot carry: keep it in float32 (DQ's server-autocast knob "
                             "computes its steps in bfloat16 where that is faster)")
        self.model, self.fedavg = model, fedavg or FedAvgArgs()
        self.seed, self.fraction_train = args.seed, args.fraction_train
        self.min_available_nodes = args.min_available_nodes
        self.fraction_evaluate, self.min_evaluate_nodes = (args.fraction_evaluate,
                                                           args.min_evaluate_nodes)
        self._returned: ArrayRecord | None = None

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


#: Run-config keys every strategy accepts without reading them (``strategy.start`` takes
#: the number of rounds; nearly every Flower app's run config has it).
FLOWER_KEYS = frozenset({"num-server-rounds"})


def strategy_kwargs(owner: str, config_cls: type, run_config: Mapping[str, Any],
                    overrides: Mapping[str, Any], *, args_cls: type | None = None,
                    defaults: Mapping[str, Any] | None = None,
                    app_keys: Iterable[str] = ()) -> dict[str, Any]:
    """Keyword arguments of strategy ``owner`` read from a run config (``from_run_config``).

    The knobs of ``config_cls`` go into ``config=``, those of ``args_cls`` (a
    :class:`StrategyConfig`) as keyword arguments where given; ``defaults`` apply where a
    key is missing, ``overrides`` win. A bad value or an unknown key (any but
    ``num-server-rounds`` and ``app_keys``) raises ``ValueError`` naming it. A key in
    ``app_keys`` is the app's own, not read as a knob of the same name (an app's ``lr``).
    """
    args = field_keys(args_cls) if args_cls is not None else set()
    own = {k.replace("_", "-") for k in app_keys}
    refuse_unknown(run_config, field_keys(config_cls) | args, owner=owner,
                   also=FLOWER_KEYS | own)
    given = {k.replace("_", "-"): v for k, v in run_config.items()
             if k.replace("_", "-") not in own}
    kwargs: dict[str, Any] = {"config": read(config_cls, {**(defaults or {}), **given})}
    if args_cls is not None:  # checked as the strategy will check them, passed where given
        values = read(args_cls, {k: v for k, v in given.items() if k in args})
        kwargs.update((k.replace("-", "_"), getattr(values, k.replace("-", "_")))
                      for k in args if k in given)
    return {**kwargs, **overrides}
