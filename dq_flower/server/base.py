"""What the package's strategies share around Flower's ``Strategy``: driver, model, reading.

The round itself, its template and figures, is :mod:`dq_flower.server.pipeline`'s.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid

from dq_flower.config import StrategyConfig, field_keys, read, refuse_unknown
from dq_flower.server.common import FedAvgArgs
from dq_flower.server.evaluation import FederatedEvaluation
from dq_flower.server.pipeline import ModelRounds

__all__ = ["DrivenStrategy", "ModelStrategy", "strategy_kwargs"]


class DrivenStrategy(Protocol):
    """What a driver of rounds (the harness) calls on a strategy (see ``ServerFigures``)."""

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


class ModelStrategy(ModelRounds, FederatedEvaluation):
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
