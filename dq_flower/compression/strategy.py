"""``CompressedUpdates``: compressed model updates for any Flower strategy.

Train messages carry the codec settings; every reply is screened and decoded into weights
(sent plus update) for the inner strategy. Evaluation is the inner strategy's.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from dq_flower.codecs import PayloadError, make
from dq_flower.compression.config import MESSAGE_PREFIX, CompressionConfig
from dq_flower.config import build_config
from dq_flower.server.base import strategy_kwargs
from dq_flower.server.common import log_rejected
from dq_flower.server.evaluation import MAX_METRIC_KEYS, common_keys, read_evaluation
from dq_flower.server.majority import bounded_parts, winsorize
from dq_flower.server.pipeline import RoundPipeline, ServerRound, UpdateFigures, screen_replies
from dq_flower.server.robust import UpdateScreens, cap_weights
from dq_flower.wire.compressed_update import (
    LAYOUT_KEY,
    MODEL_KEY,
    RAW_KEY,
    UPDATE_KEY,
    Layout,
    single_array_record,
)
from dq_flower.wire.gradient import decode_update, update_keys
from dq_flower.wire.model_buffers import statistic_problem

__all__ = ["CompressedUpdates", "MAX_EXAMPLES"]

#: Largest example count a reply may claim; weights are further capped at ``weight-cap``
#: times the round's median (``dq_flower.server.robust.cap_weights``).
MAX_EXAMPLES = 1 << 31
#: Evaluate replies' counts are capped at this many times their median (as the package's
#: own strategies cap theirs, ``FederatedEvaluation.evaluate_weight_cap``).
EVAL_WEIGHT_CAP = 2.0
NAME = "compressed-updates"


@dataclass
class _Sent:
    """What the wrapper sent one node: the model's layout and the weights it decodes."""

    layout: Layout
    reference: np.ndarray
    down_bits: int
    raw: dict[str, np.ndarray]  # the arrays sent as they are (BatchNorm statistics, ...)


@dataclass
class _Decoded:
    """One screened reply, decoded."""

    msg: Message
    metric_name: str
    metric_keys: frozenset[str]
    weight: float
    update: np.ndarray  # the decoded update (weights = reference + update)
    payload_bits: int
    raw_bits: int
    raw: dict[str, np.ndarray]  # the arrays returned as they are, checked


@dataclass(frozen=True)
class _Kept:
    """A round's rebuilt replies, the figures of all it decoded, and how many were left out."""

    decoded: list[_Decoded]
    figures: UpdateFigures
    misaligned: int


def _numeric(value: Any) -> bool:
    values = value if isinstance(value, list) else [value]
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v)
               for v in values)


class CompressedUpdates(RoundPipeline, UpdateScreens, Strategy):
    """Wrap any Flower strategy so that clients upload coded updates instead of weights.

    Use it with :func:`dq_flower.compression_mod`; the inner strategy works unchanged and
    sees each reply's weights as the weights it sent plus the decoded update.

    Parameters
    ----------
    strategy : flwr.serverapp.strategy.Strategy
        The strategy to wrap (``FedAvg``, ``FedProx``, ``FedAdam``, ...); its train messages
        carry one ``ArrayRecord`` (the model).
    codec : str
        Registry codec of the update (``qsgd``, ``terngrad``, ``ef-sign``, ``topk``, ...).
    codec_params : dict or str, optional
        The codec's parameters (``{"levels": 1}`` or ``"levels=1,bucket=512"``).
    entropy_coder : str
        Lossless coding of every payload: ``none``, ``zlib`` (default), ``lzma``, ``zstd``.
    error_feedback : bool or str, optional
        ``None``/``"auto"`` (for biased codecs), ``True``/``"on"``, ``False``/``"off"``.
    downlink : str, optional
        ``None``/``"float32"`` as broadcast, or ``"fp16"`` (updates against the decoded model).
    config : CompressionConfig, optional
        All knobs; the arguments above and ``**knobs`` override it.
    """

    def __init__(self, strategy: Strategy, *, codec: str | None = None,
                 codec_params: dict[str, Any] | str | None = None,
                 entropy_coder: str | None = None, error_feedback: bool | str | None = None,
                 downlink: str | None = None, config: CompressionConfig | None = None,
                 **knobs: Any) -> None:
        super().__init__()
        if not isinstance(strategy, Strategy):
            raise TypeError(f"strategy must be a Flower Strategy, got {type(strategy).__name__}")
        if codec is None and config is None:
            raise TypeError("CompressedUpdates needs codec= (e.g. 'qsgd') or config=")
        feedback = (("on" if error_feedback else "off") if isinstance(error_feedback, bool)
                    else error_feedback)
        self.strategy = strategy
        self.cfg: CompressionConfig = build_config(
            config, CompressionConfig, knobs, codec=codec, codec_params=codec_params,
            entropy_coder=entropy_coder, error_feedback=feedback, downlink=downlink)
        self.codec = self.cfg.make_codec()  # once: every reply is decoded with it
        self._message_config = self.cfg.message_config()
        self.weight_key = str(getattr(strategy, "weighted_by_key", "num-examples"))
        self._screens(self.cfg)
        self._sent: dict[int, dict[int, _Sent]] = {}

    @classmethod
    def from_run_config(cls, strategy: Strategy, run_config: Any,
                        *, app_keys: Iterable[str] = (), **overrides: Any) -> CompressedUpdates:
        """The wrapper with its knobs read from a run config (``context.run_config``).

        As :func:`dq_flower.server.base.strategy_kwargs` reads them, ``overrides`` winning.
        """
        return cls(strategy, **strategy_kwargs(cls.__name__, CompressionConfig, run_config,
                                               overrides, app_keys=app_keys))

    def __repr__(self) -> str:
        return f"CompressedUpdates({self.strategy!r}, codec={self.codec!r})"

    # ------------------------------------------------------------------ Strategy API
    def summary(self) -> None:
        """Log the compression settings, then the inner strategy's summary."""
        log(INFO, "\t├──> Compressed updates: codec %s, entropy coder %s, error feedback %s, "
            "downlink %s", self.codec, self.cfg.entropy_coder, self.cfg.error_feedback,
            self.cfg.downlink)
        self.strategy.summary()

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """The inner strategy's train messages, with the codec settings in their config."""
        config.update(self._message_config)
        messages = list(self.strategy.configure_train(server_round, arrays, config, grid))
        prepared: dict[int, _Sent] = {}
        sent: dict[int, _Sent] = {}
        for msg in messages:
            entry = prepared.get(id(msg.content))
            if entry is None:  # Flower's strategies share one RecordDict between messages
                entry = prepared[id(msg.content)] = self._prepare(msg)
            sent[int(msg.metadata.dst_node_id)] = entry
        self._sent[server_round] = sent
        return self.ledger.record(server_round, messages)

    def begin_round(self, server_round: int, replies: list[Message]) -> dict[int, _Sent]:
        """Take what each node was sent this round (its layout and reference weights)."""
        return self._sent.pop(server_round, {})

    def bound(self, rnd: ServerRound[dict[int, _Sent]]) -> _Kept:
        """Consistent metric keys, norm screen, clip, direction screen, weight cap; rebuild.

        The arrays sent as they are (BatchNorm statistics, counters) are bounded per element
        by the kept replies' majority and what was sent (:mod:`dq_flower.server.majority`),
        the metrics but the count by the kept replies' majority (with ``weight-cap``).
        """
        screened, sent = rnd.screened, rnd.plan
        decoded: list[_Decoded] = screened.accepted
        figures = UpdateFigures.decoded(screened, decoded)
        decoded, dropped = self._consistent(decoded)
        screened.rejected += dropped
        # a valid reply that keeps pointing against the others: not rejected, left out
        decoded, bounded = self._bound(
            screened, decoded, [d.update for d in decoded], [d.weight for d in decoded],
            [int(d.msg.metadata.src_node_id) for d in decoded],
            clip_factor=self.cfg.clip_factor, weight_cap=self.cfg.weight_cap)
        entries = [sent[int(d.msg.metadata.src_node_id)] for d in decoded]
        one = len({id(e) for e in entries}) == 1  # one broadcast: its arrays set bounds too
        raws = bounded_parts([d.raw for d in decoded], entries[0].raw if one else None)
        for d, e, update, weight, raw in zip(decoded, entries, bounded.vectors,
                                             bounded.weights, raws, strict=True):
            self._rebuild(d, e, update, weight, raw)
        if self.cfg.weight_cap > 0:  # the fedavg-* methods' (0): Flower's plain mean
            self._bound_metrics(decoded)
        return _Kept(decoded, figures, len(bounded.misaligned))

    def aggregate_and_step(
        self, rnd: ServerRound[dict[int, _Sent]], kept: _Kept
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The inner strategy aggregates the rebuilt replies (and the error replies)."""
        screened, figures = rnd.screened, kept.figures
        passed = [m for m in screened.replies if m.has_error()] + [d.msg for d in kept.decoded]
        arrays, metrics = self.strategy.aggregate_train(rnd.number, passed)
        sent = list(rnd.plan.values())
        if arrays is not None and sent:  # integer buffers averaged into floats go back
            arrays = sent[0].layout.with_dtypes(arrays)
        finite = arrays is None or all(
            np.isfinite(a.numpy()).all() for a in arrays.values()
            if str(a.dtype) in ("float16", "float32", "float64"))
        if not finite:
            log(WARNING, "[%s] round %d: the aggregate is not finite; the model stays as it "
                "was", NAME, rnd.number)
            arrays = None
        figures.down_payload_bits = sum(e.down_bits for e in sent)
        figures.close(screened, len(kept.decoded))
        misaligned = kept.misaligned
        self.record_figures(rnd.number, {**figures.metrics(), "misaligned": misaligned})
        figures.log(NAME, rnd.number, f"{len(kept.decoded)} updates decoded", misaligned)
        return arrays, metrics

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        """The inner strategy's evaluate messages."""
        return self.strategy.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(self, server_round: int,
                           replies: Iterable[Message]) -> MetricRecord | None:
        """The inner strategy's evaluation aggregate of the screened replies.

        As :class:`dq_flower.server.evaluation.FederatedEvaluation` bounds its own: a reply
        needs one ``MetricRecord`` of at most ``MAX_METRIC_KEYS`` keys and a count in range;
        the inner strategy sees the keys at least half the replies hold (a reply lacking
        one is rejected), counts capped at ``EVAL_WEIGHT_CAP`` times their median and each
        value outside the span of the middle replies' values
        (:func:`dq_flower.server.majority.winsorize`) replaced by their median, its reply
        counted at most the median count.
        """
        replies = list(replies)
        screened = screen_replies(
            replies, lambda m: (m, *read_evaluation(m, self.weight_key)))
        passed = [m for m in replies if m.has_error()] + self._bounded_evaluations(
            screened.accepted)
        return self.strategy.aggregate_evaluate(server_round, passed)

    def state_dict(self) -> dict:
        """The screens' references (the inner strategy keeps its own state)."""
        return self._screens_state()

    def load_state_dict(self, state: dict) -> None:
        """Inverse of :meth:`state_dict`."""
        self.norms.load_state_dict(state["norms"])
        self.directions.load_state_dict(state.get("directions", {}))

    # ------------------------------------------------------------------ internals
    def _prepare(self, msg: Message) -> _Sent:
        """Note what a train message carries; with ``downlink="fp16"`` code its model."""
        content = msg.content
        key = single_array_record(content.array_records, "the inner strategy's train message")
        record = content.array_records[key]
        layout = Layout.of(key, record)
        reference = layout.flat(record)
        sent_raw = {layout.names[i]: record[layout.names[i]].numpy() for i in layout.raw}
        if self.cfg.downlink == "float32":
            return _Sent(layout, reference, 32 * layout.dim, sent_raw)
        coder = make("fp16", entropy=self.cfg.entropy_coder)  # the registry: zlib for fp16
        payload = coder.encode(reference)
        reference = np.asarray(coder.decode(payload), np.float32).reshape(-1)
        raw = layout.raw_record(record)
        del content[key]
        content[MODEL_KEY] = payload.to_record()
        if len(raw):
            content[RAW_KEY] = raw
        for cfg in content.config_records.values():
            if f"{MESSAGE_PREFIX}codec" in cfg:
                cfg[LAYOUT_KEY] = layout.to_json()
        return _Sent(layout, reference, int(payload.nbits), sent_raw)

    def decode_reply(self, rnd: ServerRound[dict[int, _Sent]], msg: Message) -> _Decoded:
        """Check one reply and decode it against what its node was sent (or PayloadError)."""
        node = int(msg.metadata.src_node_id)
        entry = rnd.plan.get(node)
        if entry is None:
            raise PayloadError("no train message was sent to this node this round")
        content = msg.content
        if len(content.metric_records) != 1:
            raise PayloadError(f"reply carries {len(content.metric_records)} MetricRecords, "
                               "expected 1")
        name, metrics = next(iter(content.metric_records.items()))
        if len(metrics) > MAX_METRIC_KEYS:
            raise PayloadError(f"reply carries {len(metrics)} metrics; at most "
                               f"{MAX_METRIC_KEYS}")
        weight = metrics.get(self.weight_key)
        if not _numeric(weight) or isinstance(weight, list) or \
                not 0 < float(weight) < MAX_EXAMPLES:  # type: ignore[arg-type]
            raise PayloadError(f"{self.weight_key}={weight!r} is not a number in "
                               f"(0, {MAX_EXAMPLES})")
        bad = [k for k, v in metrics.items() if not _numeric(v)]
        if bad:
            raise PayloadError(f"metrics {bad} are not finite numbers")
        layout = entry.layout
        keys = update_keys(self.cfg, len(layout.coded), UPDATE_KEY)
        expected = set(keys) | ({RAW_KEY} if layout.raw else set())
        if set(content.array_records) != expected:
            raise PayloadError(f"reply carries records {sorted(content.array_records)}, "
                               f"expected {sorted(expected)} (is compression_mod in the "
                               "ClientApp's mods?)")
        raw = layout.read_raw(content.array_records.get(RAW_KEY) if layout.raw else None)
        for array, values in raw.items():
            problem = statistic_problem(array, values)
            if problem is not None:
                raise PayloadError(f"{RAW_KEY}[{array!r}] {problem}")
        sizes = layout.coded_sizes if self.cfg.segmented else [layout.dim]
        vec, nbits, raw_bits = decode_update(content.array_records, keys, sizes, self.codec)
        if not np.isfinite(entry.reference + vec).all():
            raise PayloadError("the decoded weights are not finite")
        return _Decoded(msg, name, frozenset(metrics.keys()), float(weight),  # type: ignore[arg-type]
                        vec, nbits, raw_bits, raw)

    def _rebuild(self, d: _Decoded, entry: _Sent, update: np.ndarray, weight: float,
                 raw: dict[str, np.ndarray]) -> None:
        """Put the weights ``entry.reference + update``, ``raw`` and a capped weight in."""
        content = d.msg.content
        if weight < d.weight:
            content.metric_records[d.metric_name][self.weight_key] = float(weight)
        record = entry.layout.rebuild(entry.reference + update, ArrayRecord(
            {name: Array(np.array(values, order="C")) for name, values in raw.items()}))
        for name in list(content.array_records):
            del content[name]
        content[entry.layout.key] = record

    def _bound_metrics(self, decoded: list[_Decoded]) -> None:
        """Each metric but the count clipped to the span of the kept replies' middle values.

        (:func:`dq_flower.server.majority.winsorize`, per element of a list); a value within
        it is left as sent, so no one node sets what the inner strategy averages.
        """
        records = [d.msg.content.metric_records[d.metric_name] for d in decoded]
        for key in sorted(decoded[0].metric_keys - {self.weight_key}) if decoded else ():
            values = [np.asarray(r[key], np.float64) for r in records]
            if len({v.shape for v in values}) != 1:
                continue  # lists of different lengths: the inner strategy's to judge
            for record, value, clipped in zip(records, values, winsorize(values), strict=True):
                if not np.array_equal(value, clipped):
                    sent = record[key]
                    whole = isinstance(sent, int) or (
                        isinstance(sent, list) and bool(sent) and isinstance(sent[0], int))
                    record[key] = (np.rint(clipped).astype(np.int64) if whole
                                   else clipped).tolist()

    def _bounded_evaluations(self, accepted: list[tuple[Message, float, dict[str, float]]]
                             ) -> list[Message]:
        """Evaluate replies with common keys only, capped counts and bounded values."""
        keys = common_keys([values for _, _, values in accepted])
        full = []
        for item in accepted:
            if keys <= item[2].keys():
                full.append(item)
            else:
                log_rejected(item[0].metadata.src_node_id, "evaluate metrics lack "
                             f"{sorted(keys - item[2].keys())[:8]}, which the others report")
        weights = cap_weights([n for _, n, _ in full], EVAL_WEIGHT_CAP)
        bounded = {k: winsorize([np.asarray(values[k]) for _, _, values in full])
                   for k in sorted(keys)}
        # a value outside the middle replies' span counts as their median, and its reply no
        # more than the median reply: one node moves the figure by the median's distance
        # from the mean at most, not by the span's edge
        for k, clipped in bounded.items():
            middle = float(np.median([float(values[k]) for _, _, values in full]))
            bounded[k] = [np.asarray(middle) if float(c) != float(values[k]) else c
                          for c, (_, _, values) in zip(clipped, full, strict=True)]
        median = float(np.median(weights)) if weights else 0.0
        moved = [any(float(v[i]) != float(values[k]) for k, v in bounded.items())
                 for i, (_, _, values) in enumerate(full)]
        weights = [min(w, median) if m else w for w, m in zip(weights, moved, strict=True)]
        out = []
        for i, ((msg, _n, _), weight) in enumerate(zip(full, weights, strict=True)):
            name = next(iter(msg.content.metric_records))
            claimed = msg.content.metric_records[name][self.weight_key]
            count: int | float = (max(1, int(weight)) if isinstance(claimed, int)
                                  else float(weight))
            msg.content[name] = MetricRecord(
                {self.weight_key: count, **{k: float(v[i]) for k, v in bounded.items()}})
            out.append(msg)
        return out

    def _consistent(self, decoded: list[_Decoded]) -> tuple[list[_Decoded], int]:
        """Keep the replies with the most common metric keys (Flower refuses mixed ones)."""
        if not decoded:
            return decoded, 0
        counts = Counter(d.metric_keys for d in decoded)
        top = max(counts.values())
        common = next(d.metric_keys for d in decoded if counts[d.metric_keys] == top)
        kept = [d for d in decoded if d.metric_keys == common]
        for d in decoded:
            if d.metric_keys != common:
                log_rejected(d.msg.metadata.src_node_id,
                             f"metric keys {sorted(d.metric_keys)} differ from the other "
                             f"replies' {sorted(common)}")
        return kept, len(decoded) - len(kept)
