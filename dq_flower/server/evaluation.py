"""Flower-style federated evaluation, mixed into the package's strategies."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from logging import WARNING
from typing import Any, cast

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from dq_flower.codecs import PayloadError
from dq_flower.seeding import Purpose, round_rng
from dq_flower.server.common import FedAvgArgs, sample_node_ids
from dq_flower.server.pipeline import RoundLedger, screen_replies
from dq_flower.server.robust import cap_weights, trimmed_weighted_mean

__all__ = ["FederatedEvaluation", "MAX_METRIC_KEYS", "common_keys", "read_evaluation"]

#: Largest ``num-examples`` an evaluate reply may claim.
MAX_EVAL_EXAMPLES = 1 << 31
#: Largest magnitude of a metric value that is used (larger ones are dropped, as NaN is):
#: every weighted sum of them stays finite.
MAX_METRIC = 1e30


#: Most metrics one evaluate reply may carry; a reply with more is rejected before any is
#: read (Flower's own evaluation figures are a handful).
MAX_METRIC_KEYS = 256


def read_evaluation(msg: Message, weight_key: str = "num-examples"
                    ) -> tuple[float, dict[str, float]]:
    """``(weight_key's count, finite numeric metrics)`` of one evaluate reply.

    Raises :class:`PayloadError` for anything but one ``MetricRecord`` of at most
    :data:`MAX_METRIC_KEYS` keys whose count is in ``(0, MAX_EVAL_EXAMPLES)``; other values
    (lists, non-finite or beyond :data:`MAX_METRIC`) are left out.
    """
    records = list(msg.content.metric_records.values())
    if len(records) != 1:
        raise PayloadError("evaluate reply needs one MetricRecord")
    rec = records[0]
    if len(rec) > MAX_METRIC_KEYS:
        raise PayloadError(f"evaluate reply carries {len(rec)} metrics; at most "
                           f"{MAX_METRIC_KEYS}")
    n = rec.get(weight_key)
    if isinstance(n, bool) or not isinstance(n, (int, float)) or not 0 < n < MAX_EVAL_EXAMPLES:
        raise PayloadError(f"evaluate {weight_key}={n!r}")
    values = {k: float(v) for k, v in rec.items()
              if k != weight_key and isinstance(v, (int, float))
              and not isinstance(v, bool) and abs(float(v)) <= MAX_METRIC}
    return float(n), values


def common_keys(values: Sequence[Mapping[str, float]]) -> set[str]:
    """The keys at least half of ``values`` hold: one reply of three or more adds none."""
    counts = Counter(k for v in values for k in v)
    return {k for k, c in counts.items() if 2 * c >= len(values)}


class FederatedEvaluation:
    """Flower-style federated evaluation.

    Each metric at least half the replies report is averaged weighted by ``num-examples``
    (capped at ``evaluate_weight_cap`` times the median) without the lowest and highest
    ``evaluate_trim`` of its values (with too few to trim one, three or four, the extremes
    bounded by the others: :func:`~dq_flower.server.robust.trimmed_weighted_mean`).
    """

    fraction_evaluate: float = 0.0
    min_evaluate_nodes: int = 1
    seed: int = 0
    evaluate_weight_cap: float = 2.0
    evaluate_trim: float = 0.2
    fedavg = FedAvgArgs()  # the messages' keys, the weighting key, the user's aggregation

    _eval_ledger: RoundLedger | None = None

    def _evaluate_ledger(self) -> RoundLedger:
        if self._eval_ledger is None:
            self._eval_ledger = RoundLedger()
        return self._eval_ledger

    def evaluate_config(self) -> dict[str, int]:
        """Keys the strategy adds to every evaluate message's config (none here)."""
        return {}

    def configure_evaluate(  # noqa: D102
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> list[Message]:
        if self.fraction_evaluate <= 0:
            return []
        nodes = sample_node_ids(grid, self.fraction_evaluate, self.min_evaluate_nodes,
                                round_rng(self.seed, server_round, 0,
                                          Purpose.EVALUATE_SAMPLE),
                                stage="configure_evaluate")
        cfg = ConfigRecord({**dict(config.items()), **self.evaluate_config()})
        cfg["server-round"] = server_round
        return self._evaluate_ledger().record(server_round, [
            Message(content=RecordDict({self.fedavg.arrayrecord_key: arrays,
                                        self.fedavg.configrecord_key: cfg}),
                    message_type=MessageType.EVALUATE, dst_node_id=n) for n in nodes])

    def aggregate_evaluate(  # noqa: D102
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        replies, key = list(replies), self.fedavg.weighted_by_key
        screened = screen_replies(replies, lambda msg: read_evaluation(msg, key),
                                  self._evaluate_ledger().take(server_round))
        if not screened.accepted:
            return None
        if self.fedavg.evaluate_metrics_aggr_fn is not None:  # the user's, as FedAvg calls it
            return self.fedavg.aggregate(self.fedavg.evaluate_metrics_aggr_fn, replies,
                                         screened.nodes, "evaluate")
        counts = [n for n, _ in screened.accepted]
        weights = cap_weights(counts, self.evaluate_weight_cap)
        per_key: dict[str, tuple[list[float], list[float], list[float]]] = {}
        keys = common_keys([values for _, values in screened.accepted])
        for weight, (count, values) in zip(weights, screened.accepted, strict=True):
            for key, value in values.items():
                if key not in keys:
                    continue
                vals, wts, raw = per_key.setdefault(key, ([], [], []))
                vals.append(value)
                wts.append(weight)
                raw.append(count)
        out = {key: trimmed_weighted_mean(vals, wts, self.evaluate_trim)
               for key, (vals, wts, _) in per_key.items()}
        self._say_plain(server_round, out, {key: trimmed_weighted_mean(vals, raw, 0.0)
                                            for key, (vals, _, raw) in per_key.items()})
        return MetricRecord(cast(dict[str, Any], out))

    def _say_plain(self, server_round: int, robust: dict[str, float],
                   plain: dict[str, float]) -> None:
        """Log once a run where the robust figures differ from Flower's plain weighted mean.

        Honest nodes of other data (a large site whose figures are its own) move the plain
        mean where the trim and the count cap leave them out; the user is told both.
        """
        moved = {k: (v, plain[k]) for k, v in robust.items()
                 if not math.isclose(v, plain[k], rel_tol=1e-9, abs_tol=1e-12)}
        if moved and not getattr(self, "_said_plain", False):
            self._said_plain = True
            log(WARNING, "federated evaluation, round %d: %s is the robust mean (the lowest "
                "and highest %g of the nodes' figures left out, counts capped at %g times the "
                "median); Flower's weighted mean of the same replies: %s (evaluate_trim = 0 "
                "and evaluate_weight_cap = 0 give it; said once)", server_round,
                ", ".join(f"{k} {v:.4g}" for k, (v, _) in moved.items()), self.evaluate_trim,
                self.evaluate_weight_cap, ", ".join(f"{k} {p:.4g}" for k, (_, p) in moved.items()))
