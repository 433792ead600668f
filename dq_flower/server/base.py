"""What the package's strategies share around Flower's ``Strategy``.

:class:`ServerFigures` reports the server's own figures of a round with the ServerApp-side
metrics; :class:`ModelStrategy` adds the user's model, seeded sampling settings and
federated evaluation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result

from dq_flower.server.evaluation import FederatedEvaluation

__all__ = ["ServerFigures", "ModelStrategy"]


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

