"""Checks of DQ data replies, alone and against the round's others.

:func:`check_upload` decodes and checks one reply in one pass (:class:`Rules`, the node's
:class:`History`) or raises :class:`~dq_flower.codecs.PayloadError` with the reason;
:func:`agree` screens the round's together: counts, weights, the data spec and the value
bound. ``docs/reliability.md`` gives the measurements behind the factors.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from operator import attrgetter

import numpy as np
from flwr.app import MetricRecord, RecordDict

from dq_flower.codecs import Codec, Payload, PayloadError
from dq_flower.codecs.affine import denormalise
from dq_flower.codecs.uniform import plain_payload
from dq_flower.dq.scorer_choice import CAN_SCORE_KEY
from dq_flower.dq.server.planner import reply_bits
from dq_flower.dq.server.token_intake import check_id_samples, check_token_upload
from dq_flower.wire.dq_batch import (
    INFO_KEY,
    REFRESH_KEY,
    SAMPLES_KEY,
    DataReply,
    DataSpec,
    SampleBatch,
    read_reply,
    reply_spec,
)

__all__ = ["Upload", "Rules", "History", "Agreement", "check_upload", "agree",
           "decode_compensation", "decode_vector", "VALUE_FACTOR", "BY_PARTITION", "keep_rows",
           "kept_rows", "EXAMPLES_FACTOR", "SHARE_FACTOR", "MAX_LOCAL_ID", "OverBoundError",
           "count_claim", "MAX_SAMPLE_WEIGHT_FACTOR"]

#: Largest per-client sample id the server accepts (ids are client-local row numbers).
MAX_LOCAL_ID = 1 << 31
#: ``sample`` selection floors scores at 1e-3 of their mean, so an honest row never stands
#: for more than 1000 times the candidates it was drawn from (see ``dq.selection``).
MAX_SAMPLE_WEIGHT_FACTOR = 1000.0
#: The learned value bound: this many times the median scale of the first round's uploads.
VALUE_FACTOR = 10.0
#: A ``num-examples`` above this many times the nodes' lower median is counted as that many.
EXAMPLES_FACTOR = 100.0
#: A node's weight in a round is clipped to this many times the median node's examples.
SHARE_FACTOR = 4.0


@dataclass(frozen=True)
class Upload:
    """One checked data reply: its batch, decoded rows, claims and what it would adopt."""

    batch: SampleBatch
    x: np.ndarray
    candidates: int
    delta: np.ndarray | None
    node: int = 0  # the client's identity, which keys all per-client state
    partition: int = 0
    examples: int = 0
    reply_bits: int = 0
    ranges: tuple[np.ndarray, ...] | None = None
    refresh: np.ndarray | None = None
    holdout: np.ndarray | None = None  # which rows the store holds out (adaptive schedule)
    source: int = 0  # the Flower node id the reply came from
    spec: DataSpec | None = None  # the data spec it carries
    scale: float = 0.0  # the largest absolute value it can decode to
    weight_scale: float = 1.0  # below 1 where its claimed weight was clipped
    label_bits: int = 0  # bits per class label as sent
    plain: Payload | None = None  # the samples, lossless coder undone (plain_payload)
    can_score: bool = False  # the node holds the model (its ``can-score`` metric)
    copies: int = 0  # rows not stored as copies of rows the client sent before
    resent: int = 0  # rows dropped as the server held them already (a late reply, a replay)
    claimed: int | None = None  # the ``num-examples`` it reported, where a bound took it down


#: The order a round's uploads are taken in: by partition id, then client identity.
BY_PARTITION = attrgetter("partition", "node")
Check = Callable[[DataSpec, Upload], int]  # check(spec, upload) -> classes, or PayloadError


@dataclass(frozen=True)
class Rules:
    """What a data reply is checked against: the server's knobs and what it adopted."""

    bits: int
    dither: bool
    selection_rule: str
    ranges: str = "auto"
    resend: bool = False
    spec: DataSpec | None = None
    num_classes: int | None = None
    value_bound: float | None = None
    comp_codec: Codec | None = None  # decodes compensations (None: none may come)
    num_params: int = 0  # values of a compensation or refreshed residual
    refresh: bool = False  # whether a refreshed residual may come (a control variate)
    measuring: bool = False  # whether a reply's size is measured (gradient and auto modes)


@dataclass(frozen=True)
class History:
    """A node's examples (0: unknown), rows held, ranges, ids received and their weight."""

    examples: int = 0
    stored: int = 0
    ranges: tuple[np.ndarray, ...] | None = None
    received: np.ndarray | None = None
    weight: float = 0.0


@dataclass(frozen=True)
class Agreement:
    """A round's verdict: accepted and refused uploads, and what the server adopts."""

    accepted: list[Upload]
    refused: list[tuple[Upload, str]]
    spec: DataSpec | None = None  # a spec to adopt (None: known already, or none agreed)
    classes: int | None = None  # the classes (or target width) the model check gave it
    value_bound: float | None = None  # a bound to adopt (None: known, or nothing to learn)
    counted: list[tuple[Upload, str]] = field(default_factory=list)  # counts taken lower


class OverBoundError(PayloadError):
    """A reply whose values reach past the value bound (its node is asked within it)."""


# ------------------------------------------------------------------ the server's view of a batch
@dataclass
class _KeptBatch(SampleBatch):
    """A validated batch of which only the payload rows ``kept`` are used."""

    kept: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))


def keep_rows(batch: SampleBatch, keep: np.ndarray) -> SampleBatch:
    """``batch`` cut to the rows where ``keep`` is true (the payload stays as sent)."""
    idx = np.flatnonzero(np.asarray(keep, dtype=bool))
    base = kept_rows(batch)
    values = {f.name: getattr(batch, f.name) for f in fields(SampleBatch)}
    values.update(labels=batch.labels[idx], ids=batch.ids[idx], weights=batch.weights[idx])
    return _KeptBatch(**values, kept=idx if base is None else base[idx])


def kept_rows(batch: SampleBatch) -> np.ndarray | None:
    """The payload rows a batch uses (``None``: all of them)."""
    return batch.kept if isinstance(batch, _KeptBatch) else None


# ------------------------------------------------------------------ one reply
def read_counts(metrics: MetricRecord | None, rows: int, history: History,
                resend: bool) -> tuple[int, int, int]:
    """``(candidates, examples, partition)`` of a reply, checked against the node's history."""
    if metrics is None:
        raise PayloadError("reply misses its 'metrics' record")
    cand = metrics.get("candidates")
    if not isinstance(cand, int) or not rows <= cand <= MAX_LOCAL_ID:
        raise PayloadError(f"'candidates'={cand!r} is inconsistent with the upload")
    partition = metrics.get("partition-id", MAX_LOCAL_ID)
    if not isinstance(partition, int):
        raise PayloadError(f"'partition-id'={partition!r} is not an int")
    examples = metrics.get("num-examples", cand)
    if not isinstance(examples, int) or not cand <= examples <= MAX_LOCAL_ID:
        raise PayloadError(f"'num-examples'={examples!r} is inconsistent with the upload")
    # a late or replayed reply was drawn before its own rows were stored: they count as
    # not held (the server drops them as duplicates afterwards)
    if not resend and cand > examples - history.stored + rows:
        raise PayloadError(f"'candidates'={cand} exceeds the {examples - history.stored} of "
                           f"its {examples} examples the server does not hold (plus the "
                           f"reply's own {rows} rows)")
    return cand, examples, partition


def check_weights(batch: SampleBatch, candidates: int, rule: str) -> None:
    """Row weights an honest client can send: ``candidates / k`` (``topk``, ``threshold``).

    ``sample``, ``auto``: ``1 / pi_i`` in ``[1, 1000 * candidates]`` (scores floored at 1e-3).
    """
    rows = len(batch)
    if not rows:
        return
    w = batch.weights.astype(np.float64)
    if rule in ("sample", "auto"):  # auto: some nodes sample, the others draw uniformly
        top = MAX_SAMPLE_WEIGHT_FACTOR * max(candidates, 1)
        if w.min() < 1.0 - 1e-4 or w.max() > top:
            raise PayloadError(f"sample weights outside [1, {top:g}] for {candidates} "
                               "candidates")
    elif not np.allclose(w, candidates / rows, rtol=1e-4):
        raise PayloadError(f"weights must be candidates / rows = {candidates}/{rows}"
                           f" under {rule!r} selection")


def decode_rows(wire: DataReply, bits: int, known: tuple[np.ndarray, ...] | None
                ) -> tuple[np.ndarray, Payload]:
    """Decoded float rows ``(n, dim)`` of a reply's batch, and its plain samples."""
    assert wire.batch is not None
    plain = plain_payload(wire.batch.samples, bits)  # the stream decoded once, here and to store
    x = wire.decoder.decode(plain)
    if wire.mode == "feature":
        if wire.ranges is not None and known is not None and not np.array_equal(
                np.concatenate(wire.ranges), np.concatenate(known)):  # flags included
            raise PayloadError("the node's feature ranges changed since it first sent them")
        use = wire.ranges if wire.ranges is not None else known
        if use is None and len(wire.batch):
            raise PayloadError("reply misses its feature ranges")
        if use is not None:
            x = denormalise(x, *use)
    if not np.isfinite(x).all():
        raise PayloadError("samples decode to non-finite values")
    return x, plain


def data_scale(x: np.ndarray, ranges: tuple[np.ndarray, ...] | None) -> float:
    """The largest absolute value rows can take: ``max(|lo|, |lo + span|)`` with ranges."""
    largest = float(np.abs(x).max()) if x.size else 0.0
    if ranges is not None:
        lo, span = (a.astype(np.float64) for a in ranges[:2])
        largest = max(largest, float(np.maximum(np.abs(lo), np.abs(lo + span)).max()))
    return largest


def check_upload(content: RecordDict, node: int, rules: Rules, history: History,
                 max_rows: int, source: int = 0) -> Upload:
    """Decode and check one data reply in one pass: the record the round and store take.

    Rows the node sent before are dropped unless ``rules.resend``; ``source``: the Flower
    node it came from. Adopts nothing (the round's replies together do: :func:`agree`).
    """
    if not {SAMPLES_KEY, INFO_KEY} & set(content.array_records):  # no row: counts, spec
        spec, metrics = reply_spec(content, rules.spec), content.metric_records.get("metrics")
        if (counts := read_counts(metrics, 0, history, rules.resend))[0]:
            raise PayloadError(f"a reply without samples claims {counts[0]} candidates")
        return Upload(SampleBatch.empty(rules.bits, spec.dim), np.zeros((0, spec.dim), np.float32),
                      0, None, node, counts[2], counts[1], reply_bits(content) if rules.measuring
                      else 0, source=source, spec=spec)
    wire = read_reply(content, rules.spec, rules.ranges, rules.bits, rules.num_classes,
                      max_rows, MAX_LOCAL_ID)
    spec, ranges, metrics = wire.spec, wire.ranges, content.metric_records.get("metrics")
    if wire.batch is None:  # windows of token ids, sent exactly (.token_intake)
        batch, x, plain, can_score = check_token_upload(content, spec, max_rows, MAX_LOCAL_ID)
        cand, examples, partition = read_counts(metrics, len(batch), history, rules.resend)
        check_weights(batch, cand, rules.selection_rule)
        scale = float(x.max(initial=0.0))
    elif spec.vocab:  # labelled samples of ids, sent exactly (.token_intake)
        batch = wire.batch
        cand, examples, partition = read_counts(metrics, len(batch), history, rules.resend)
        check_weights(batch, cand, rules.selection_rule)
        x, plain = check_id_samples(batch, spec, max_rows)
        scale = float(x.max(initial=0))
        can_score = metrics is not None and metrics.get(CAN_SCORE_KEY) == 1
    else:
        batch = wire.batch
        cand, examples, partition = read_counts(metrics, len(batch), history, rules.resend)
        if (batch.samples.meta.get("dither_seed") is not None) != rules.dither:
            raise PayloadError("samples carry a dither setting the server did not configure")
        check_weights(batch, cand, rules.selection_rule)
        x, plain = decode_rows(wire, rules.bits, history.ranges)
        if spec.target == "inputs":  # an autoencoder's: the rows as decoded are the targets
            batch = dataclasses.replace(batch, labels=x.reshape(len(x), -1))
        scale = data_scale(x, ranges if ranges is not None else history.ranges)
        if rules.value_bound is not None and scale > rules.value_bound:
            raise OverBoundError(f"sample values reach {scale:g}, over the bound "
                               f"{rules.value_bound:g} (max-abs-value)")
        can_score = metrics is not None and metrics.get(CAN_SCORE_KEY) == 1
    delta = decode_compensation(batch, rules.comp_codec, rules.num_params)
    refresh = decode_refresh(content, rules, history)
    resent = 0
    if not rules.resend and history.received is not None:
        held = np.isin(np.asarray(batch.ids, dtype=np.int64), history.received)
        if held.any():
            batch, x, resent = keep_rows(batch, ~held), x[~held], int(held.sum())
    return Upload(batch, x, cand, delta, node, partition, examples,
                  reply_bits(content) if rules.measuring else 0, ranges, refresh,
                  source=source, spec=spec, scale=scale, label_bits=batch.label_bits,
                  plain=plain, can_score=can_score, resent=resent)


def decode_refresh(content: RecordDict, rules: Rules, history: History) -> np.ndarray | None:
    """A refreshed residual, checked like a compensation; only where one was asked."""
    record = content.array_records.get(REFRESH_KEY)
    if record is None:
        return None
    if not rules.refresh or rules.comp_codec is None:  # no control variate to refresh
        raise PayloadError("unexpected refreshed residual")
    residual = decode_vector(Payload.from_record(record), rules.comp_codec,
                             rules.num_params, "refreshed residual")
    return residual if history.weight > 0 else None  # rows evicted: nothing to correct


def decode_vector(payload: Payload, codec: Codec, num_params: int, what: str) -> np.ndarray:
    """A flat model-sized vector (a compensation, a refreshed residual) decoded and checked."""
    if payload.codec != codec.name:
        raise PayloadError(f"{what} made by {payload.codec!r}")
    if math.prod(payload.shape) != num_params:
        raise PayloadError(f"{what} declares {payload.shape}, the model has {num_params} "
                           "parameters")
    vector = codec.decode(payload).reshape(-1)
    if vector.size != num_params or not np.isfinite(vector).all():
        raise PayloadError(f"{what} has the wrong size or non-finite values")
    return vector


def decode_compensation(batch: SampleBatch, codec: Codec | None,
                        num_params: int) -> np.ndarray | None:
    """The reply's decoded compensation, required exactly where one is configured."""
    if batch.compensation is None:
        if codec is not None and len(batch):
            raise PayloadError("reply misses its compensation")
        return None
    if codec is None:
        raise PayloadError("unexpected compensation payload")
    return decode_vector(batch.compensation, codec, num_params, "compensation")


# ------------------------------------------------------------------ the round together
def median_of(values: Sequence[float], lower: bool = False) -> float:
    ordered = sorted(values)
    return float(ordered[(len(ordered) - 1) // 2] if lower else np.median(ordered))


def clip_share(upload: Upload, cap: float) -> Upload:
    """``upload`` with its weight (candidates and row weights) clipped to ``cap``."""
    total = max(float(upload.candidates), float(upload.batch.weights.astype(np.float64).sum()))
    if total <= cap:
        return upload
    factor = cap / total
    batch = dataclasses.replace(upload.batch,
                                weights=(upload.batch.weights * factor).astype(np.float32))
    return dataclasses.replace(upload, batch=batch, weight_scale=factor,
                               candidates=max(min(upload.candidates, int(cap)), len(batch)))


def count_claim(examples: int, values: Sequence[int], sent: int = 0) -> tuple[int, str | None]:
    """``examples``, at most ``EXAMPLES_FACTOR`` x the lower median or 2 x the rows ``sent``."""
    bound = max(int(EXAMPLES_FACTOR * (low := median_of(values, lower=True))), 2 * sent)
    why = (f"'num-examples'={examples} is over {EXAMPLES_FACTOR:g} times the median node's "
           f"{low:g}: counted as {bound:,}")
    return (examples, None) if examples <= bound else (bound, why)


def screen_claims(uploads: list[Upload], known: Mapping[int, int],
                  sent: Mapping[int, int] | None = None
                  ) -> tuple[list[Upload], list[tuple[Upload, str]]]:
    """Counts taken down (:func:`count_claim`, with why), over-large weights clipped.

    A weight is clipped to ``SHARE_FACTOR`` x the median's examples or the rows ``sent`` (and now).
    """
    values = [v for v in {**known, **{u.node: u.examples for u in uploads}}.values() if v > 0]
    if not values:
        return list(uploads), []
    sent = sent or {}
    taken = [count_claim(u.examples, values, sent.get(u.node, 0)) for u in uploads]
    counted = [(u, why) for u, (_, why) in zip(uploads, taken, strict=True) if why]
    kept = [dataclasses.replace(u, examples=n, claimed=u.examples) if n != u.examples else u
            for u, (n, _) in zip(uploads, taken, strict=True)]
    values = [v for v in {**known, **{u.node: u.examples for u in kept}}.values() if v > 0]
    cap = SHARE_FACTOR * median_of(values)
    return [clip_share(u, max(cap, sent.get(u.node, 0) + len(u.batch))) for u in kept], counted


def readable(uploads: list[Upload], read: Callable[[Upload], object]
             ) -> tuple[list[Upload], list[tuple[Upload, str]]]:
    """The uploads whose rows ``read`` (the model, on every row) takes, and the others refused.

    Where the model reads a table's label-encoded columns with embeddings, a code past an
    embedding's rows makes it raise, in training as here: such a reply is refused with why.
    """
    kept: list[Upload] = []
    refused: list[tuple[Upload, str]] = []
    for u in uploads:
        try:
            read(u)
        except (RuntimeError, IndexError, ValueError) as exc:
            refused.append((u, f"the model cannot read its rows: {type(exc).__name__}: {exc}"))
        else:
            kept.append(u)
    return kept, refused


def agree_spec(uploads: list[Upload], check: Check
               ) -> tuple[DataSpec | None, int | None, list[Upload], list[tuple[Upload, str]]]:
    """The spec most uploads with rows carry that the model check confirms.

    Ties go to the first upload's spec; a spec none of whose uploads passes the check gives
    way to the next. Uploads of other specs are refused.
    """
    groups: dict[DataSpec, list[Upload]] = {}
    for u in uploads:
        if len(u.batch) and u.spec is not None:
            groups.setdefault(u.spec, []).append(u)
    refused: list[tuple[Upload, str]] = []
    agreed, passed, classes = None, [], None
    for spec, members in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        for u in members:
            try:
                classes = check(spec, u)
                if spec.target == "class" and u.label_bits > (top := u.batch.label_top(classes)):
                    raise PayloadError(f"labels use {u.label_bits} bits; at most "
                                       f"{top} for {classes} classes")
                passed.append(u)
            except PayloadError as exc:
                refused.append((u, str(exc)))
        if passed:
            agreed = spec
            break
    ok = {id(u) for u in passed}
    tried = ok | {id(u) for u, _ in refused}  # untried: empty, or of a lower-ranked spec
    kept = [u for u in uploads
            if id(u) in ok or (id(u) not in tried and agreed in (None, u.spec))]
    refused += [(u, f"its data ({u.spec}) is not the round's, agreed on ({agreed}) by "
                    f"{len(passed)} of {len(uploads)} uploads")
                for u in uploads if id(u) not in tried and agreed not in (None, u.spec)]
    return agreed, classes, kept, refused


def agree(uploads: list[Upload], rules: Rules, known: Mapping[int, int],
          check: Check, sent: Mapping[int, int] | None = None,
          read: Callable[[DataSpec, Upload], object] | None = None) -> Agreement:
    """The round's verdict on its checked uploads, in (partition id, node) order.

    ``known``: examples of the nodes accepted before; ``sent``: the rows they uploaded;
    ``check(spec, upload)``: the model check, run only while no spec is known;
    ``read(spec, upload)``: the model on every row of a quantized table (:func:`readable`).
    """
    order = sorted(uploads, key=BY_PARTITION)
    (kept, counted), refused, new_spec, classes = screen_claims(order, known, sent), [], None, None
    if rules.spec is None:
        new_spec, classes, kept, more = agree_spec(kept, check)
        refused += more
    new_bound = None
    spec = rules.spec or new_spec  # token ids are names, not magnitudes: no bound
    if (rules.value_bound is None and spec is not None and spec.target != "tokens"
            and not spec.vocab):
        scales = [u.scale for u in kept if len(u.batch) or u.ranges is not None]
        middle = (median_of(scales) or max(scales)) if scales else 0.0
        if middle > 0:  # the bound learned: VALUE_FACTOR times the median upload's scale
            new_bound = VALUE_FACTOR * middle
            refused += [(u, f"sample values reach {u.scale:g}, over {VALUE_FACTOR:g} times "
                            f"the median upload's (max-abs-value {new_bound:g})")
                        for u in kept if u.scale > new_bound]
            kept = [u for u in kept if u.scale <= new_bound]
    if read is not None and spec is not None and spec.target != "tokens" and not spec.vocab:
        kept, more = readable(kept, lambda u: read(spec, u))
        refused += more
    return Agreement(kept, refused, new_spec, classes, new_bound, counted)
