"""Client side of data quantization: select, quantize, compensate, reply.

:func:`dq_train` is called from a Flower app's own ``@app.train()`` handler with the
device's own data and (where the round needs it) the user's model::

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        return dq_flower.client.dq_train(msg, context, load_local_data(), model=Net())

The candidates are the local rows but those the message says the server holds (by the
client's identity, :func:`node_key`), so a lost reply is uploaded again and a restarted
client goes on where it stopped; the selection depends only on the round seed, round,
identity, held set and received model.

``Context.state`` keeps the ``dq-ef-`` error-feedback entries (``compensation``, ``refresh``,
``gradient``; snapshotted per round, so a replayed round gets the same reply) and, under
``compensation-mode="refresh"``, the samples sent in each round.

A data round with the ``uniform`` scorer and no compensation imports no PyTorch; the knobs
that need the model (:func:`model_knob`) import it (``scoring``) only where used, and fail
before any work, naming the knob, where it is missing.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any

import numpy as np
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict

from dq_flower.client_state import begin_round, encode_with_feedback, end_round
from dq_flower.codecs import Payload, make
from dq_flower.codecs.affine import denormalise, normalise
from dq_flower.config import read
from dq_flower.data_input import Keys, as_inputs, forward_keys, target_parts
from dq_flower.dq.client.reference import reference_rows
from dq_flower.dq.client.selection import select
from dq_flower.dq.client.sent import (
    coding_ranges,
    forget_from,
    holes_of,
    keep_sent,
    num_classes_of,
    repeated_rows,
    row_names,
    send_holes,
    sent_rows,
    spec_of,
    with_nan,
)
from dq_flower.dq.client.tokens import check_token_round, id_vocab, token_upload
from dq_flower.dq.config import CLIENT_KEYS, DQConfig, auto_bits
from dq_flower.dq.scorer_choice import (
    CAN_SCORE_KEY,
    RUN_MODEL_KNOB_KEY,
    model_knob,
    node_rule,
    node_scorer,
)
from dq_flower.input_arrays import fixed_draws
from dq_flower.node import node_key
from dq_flower.seeding import round_rng
from dq_flower.text_input import token_windows
from dq_flower.torch_support import require_torch
from dq_flower.wire.dq_batch import (
    GRADIENT_KEY,
    MIXED_UNITS_KEY,
    RANGES_KEY,
    REFRESH_KEY,
    SPEC_KEY,
    DataSpec,
    range_mode,
    ranges_record,
    spec_record,
)
from dq_flower.wire.dq_upload import encode_batch
from dq_flower.wire.held import VALUE_BOUND_KEY, held_for
from dq_flower.wire.input_parts import INPUT_NAMES_KEY, ONE_INPUT_KEY, nan_mode
from dq_flower.wire.node_errors import NodeConfigError
from dq_flower.wire.partition import names_partition
from dq_flower.wire.targets import LABEL_BASE_KEY, MODEL_OUTPUTS_KEY, model_targets
from dq_flower.wire.token_batch import tokens_payload

if TYPE_CHECKING:
    import torch

    from dq_flower.model_ops import LossFn

__all__ = ["dq_train", "model_knob", "node_key", "round_config"]

#: Prefix of the error-feedback entries, snapshotted round by round
STATE_PREFIX = "dq-ef-"
REFRESH_EF_KEY = STATE_PREFIX + "refresh"
EF_KEY = STATE_PREFIX + "compensation"
GRAD_EF_KEY = STATE_PREFIX + "gradient"


def round_config(msg: Message) -> dict[str, Any]:
    """The message's ``config`` record as a dict; ``ValueError`` if it has none."""
    if "config" not in msg.content.config_records:
        raise ValueError("the train message carries no 'config' record; is the server running "
                         "a dq_flower strategy?")
    return dict(msg.content.config_records["config"].items())


def _coded_residual(r: RoundInput, cfg: DQConfig, model: torch.nn.Module, x: np.ndarray,
                    xq: np.ndarray, y: np.ndarray, w: np.ndarray, ef_key: str) -> Payload:
    """``sum_i w_i [grad f(x_i) - grad f(xq_i)]``, coded with error feedback at ``ef_key``."""
    from dq_flower.dq.client.scoring import quantization_residual  # PyTorch: deferred

    shape = (-1, *r.spec.sample_shape)
    delta = quantization_residual(model, x.reshape(shape), xq.reshape(shape), y, w, r.loss_fn)
    codec = make(cfg.compensation, **cfg.compensation_kwargs)
    return encode_with_feedback(codec, delta, r.rng, r.context, ef_key)


def _needed(model: torch.nn.Module | None, what: str) -> torch.nn.Module:
    """``model``; ``ValueError`` where the server did not send it."""
    if model is None:
        raise ValueError(f"{what} needs the model; the server did not send it")
    return model


def _reply(r: RoundInput, content: RecordDict, bits: int, metrics: dict[str, Any]) -> Message:
    """``content`` with the data spec and the round's metrics (``metrics`` in the middle)."""
    content[SPEC_KEY] = spec_record(r.spec)
    content["metrics"] = MetricRecord({
        "num-examples": int(r.x.shape[0]), "partition-id": int(r.key), **metrics,
        "up-payload-bits": int(bits), "client-time-s": time.process_time() - r.t0})
    return Message(content=content, reply_to=r.msg)


@dataclasses.dataclass(frozen=True)
class RoundInput:
    """What one round of :func:`dq_train` works from, read once from the message."""

    msg: Message
    context: Context
    config: dict[str, Any]  # the round config as sent
    cfg: DQConfig  # the knobs the node reads, the scorer resolved for this node
    knob: str | None  # the knob that needs the model this round (None: no model needed)
    x: np.ndarray  # the node's inputs, as given
    y: np.ndarray
    spec: DataSpec
    model: torch.nn.Module | None
    loss_fn: LossFn | None
    server_round: int
    key: int  # the node's client identity (partition-id)
    rng: np.random.Generator  # the round's generator: every draw of the round, in order
    t0: float  # when the round began (client-time-s)


def _gradient_round(r: RoundInput) -> Message:
    """Reply to a gradient round: a coded minibatch gradient at the server's model."""
    from dq_flower.dq.client.scoring import batch_gradient, received_model  # PyTorch: deferred

    model = _needed(received_model(r.msg, r.model,
                                   "a gradient round (upload-mode gradient or auto)"),
                    "a gradient round")
    x, y, cfg = r.x, r.y, r.cfg
    size = min(cfg.gradient_batch_size, x.shape[0])
    idx = np.sort(r.rng.choice(x.shape[0], size=size, replace=False))
    loss, grad = batch_gradient(model, x[idx], y[idx], r.loss_fn)
    codec = make(cfg.gradient_codec, **cfg.gradient_codec_kwargs)
    payload = encode_with_feedback(codec, grad, r.rng, r.context, GRAD_EF_KEY)
    return _reply(r, RecordDict({GRADIENT_KEY: payload.to_record()}), payload.nbits,
                  {"train-loss": float(loss)})


@names_partition
def dq_train(msg: Message, context: Context, data: Any, *,
             model: torch.nn.Module | None = None,
             loss_fn: LossFn | None = None, keys: Keys | None = None,
             window: int | None = None, tokenizer: Any = None,
             vocab: int | None = None) -> Message:
    """Answer one DQ round with this device's quantized samples (and a compensation).

    Parameters
    ----------
    msg : Message
        The train message a :class:`dq_flower.DQStrategy` sent.
    context : Context
        The node's context: its ``node_config`` names the client (``partition-id``, also
        added to the message of any error raised here), its ``state`` keeps error-feedback
        memory (never which rows were uploaded: the message says which rows the server
        holds).
    data : tuple, Dataset or DataLoader
        The device's own training data (see :mod:`dq_flower.data_input`), used as given.
    model : torch.nn.Module, optional
        The same architecture as the server's. Needed only where the round uses it: the
        ``loss`` or ``gradnorm`` scorer, compensation, gradient rounds; its weights are
        overwritten with the server's. Under ``scorer="auto"`` (the default) a node given
        it scores its rows (or token windows) by the model once the server sends it.
    loss_fn : callable, optional
        ``loss_fn(outputs, targets)`` returning per-sample losses; the default is
        cross-entropy for integer labels and mean squared error for float targets.
    keys : tuple, optional
        ``(input key, target key)`` of dict samples (``("img", "label")``), or ``(input
        keys, target key)`` for columns of one number each (``(["age", "bmi"], "label")``);
        by default found from common names (see :mod:`dq_flower.data_input`).
    window : int, optional
        Token samples: ``data`` is the device's text (strings, a ``datasets.Dataset`` of
        strings, or token ids; see :mod:`dq_flower.text_input`) and the samples are its
        consecutive windows of ``window`` tokens, sent exactly.
    tokenizer : callable or tokenizer, optional
        With ``window``: ``str -> ids`` (or an object with ``encode``); default UTF-8 bytes.
    vocab : int, optional
        With ``window``: the vocabulary size (default: the tokenizer's; needed for ids).

    Returns
    -------
    Message
        The reply: packed samples, their labels or targets, ids and weights, the optional
        compensation, the data spec and the metrics (``num-examples``, ``selected``, ...).
    """
    t0 = time.process_time()
    config = round_config(msg)
    if window is not None:
        return _token_round(msg, context, data, config, t0, _Text(window, tokenizer, vocab),
                            model, loss_fn)
    needed = config.get(RUN_MODEL_KNOB_KEY)
    if model is None and needed:  # before any work, from the first round on
        require_torch(str(needed))  # a node without PyTorch fails alone, naming the knob
        raise NodeConfigError(f"{needed} needs the model: pass model= (your nn.Module) "
                              "to dq_train")
    cfg = _client_config(config)
    scorer = node_scorer(cfg.scorer, model is not None)  # "auto" sent as it is: resolve here
    cfg = dataclasses.replace(cfg, scorer=scorer,
                              selection_rule=node_rule(cfg.selection_rule, scorer))
    knob = model_knob({**config, "scorer": scorer})
    if knob is not None:  # before any work: name the knob where PyTorch is missing
        require_torch(knob)
    server_round, key = int(config["server-round"]), node_key(context)
    rng = round_rng(int(config.get("round-seed", 0)), server_round, key)
    one_input = bool(config.get(ONE_INPUT_KEY))  # the server's model takes one input
    if keys is None and (names := config.get(INPUT_NAMES_KEY)):  # forward(x, length)
        keys = forward_keys(data, str(names).split(","))  # dicts holding its inputs by name
    with fixed_draws():  # a transform that draws as it reads: the same rows each round
        x_all, y, inputs = as_inputs(data, keys, one_input,  # several inputs: side by side
                                     nan=nan_mode(config))  # NaN values as its model reads them
        parts = target_parts(data)  # a dict target's, named (its first item read again)
    if inputs and model is not None:
        from dq_flower.model_inputs import split_inputs  # PyTorch: deferred (a model is given)

        split_inputs(model, inputs)
    y = model_targets(y, int(config.get(MODEL_OUTPUTS_KEY, 0) or 0),  # where asked for
                      int(config.get(LABEL_BASE_KEY, 0) or 0))
    vocab = id_vocab(config, x_all)  # a text classifier's word ids: sent exactly, as int64
    x_all = x_all.astype(np.int64) if vocab else x_all
    pinned = config.get(MIXED_UNITS_KEY)  # the server's, once it holds a spec
    spec = spec_of(x_all, y, vocab, cfg.bits or auto_bits(None),
                   None if pinned is None else bool(pinned), inputs, parts)
    if loss_fn is None and model is not None and (spec.target == "binary" or spec.target_shape):
        from dq_flower.losses import binary_loss, element_loss  # PyTorch: deferred

        loss_fn = binary_loss if spec.target == "binary" else element_loss  # 0/1: logits
    r = RoundInput(msg, context, config, cfg, knob, x_all, y, spec,
                   model, loss_fn, server_round, key, rng, t0)
    begin_round(context, server_round, STATE_PREFIX)
    gradient = config.get("round-mode", "data") == "gradient"
    reply = _gradient_round(r) if gradient else _data_round(r)
    end_round(context, server_round, STATE_PREFIX)
    return reply


def _client_config(config: dict[str, Any]) -> DQConfig:
    """The knobs a node reads from the round's config."""
    return read(DQConfig, {k: config[k] for k in CLIENT_KEYS if k in config})


def _token_round(msg: Message, context: Context, data: Any, config: dict[str, Any],
                 t0: float, text: _Text, model: torch.nn.Module | None,
                 loss_fn: LossFn | None) -> Message:
    """Reply to a data round with the device's token windows (scored where ``model`` is)."""
    cfg = _client_config(config)
    scorer = node_scorer(cfg.scorer, model is not None)  # "auto" sent as it is: resolve here
    cfg = dataclasses.replace(cfg, scorer=scorer,
                              selection_rule=node_rule(cfg.selection_rule, scorer))
    check_token_round(config, cfg, model is not None)
    if scorer != "uniform":
        require_torch(f"scorer={scorer!r}")
    windows, vocab = token_windows(data, text.window, text.vocab, text.tokenizer)
    server_round, key = int(config["server-round"]), node_key(context)
    rng = round_rng(int(config.get("round-seed", 0)), server_round, key)
    spec = DataSpec((text.window,), "tokens", vocab)
    r = RoundInput(msg, context, config, cfg, None, windows, windows, spec, model, loss_fn,
                   server_round, key, rng, t0)
    cfg, candidates, _ = _candidates(config, cfg, key, np.arange(len(windows)), len(windows))
    scores = None
    if scorer != "uniform":  # the rounds that score import PyTorch
        from dq_flower.dq.client.scoring import received_model, score_windows  # deferred

        scoring = received_model(msg, model, f"scorer={scorer!r}")
        if scoring is None:
            raise ValueError(f"scorer={scorer!r} needs the model; the server did not send it")
        scores = score_windows(scorer, scoring, windows[candidates], loss_fn)
    content, bits, metrics = token_upload(windows, vocab, cfg, candidates, rng, scores,
                                          can_score=model is not None)
    return _reply(r, content, bits, metrics)


@dataclasses.dataclass(frozen=True)
class _Text:
    """How a device's text becomes windows: ``dq_train``'s ``window``, ``tokenizer``, ``vocab``."""

    window: int
    tokenizer: Any
    vocab: int | None


def _data_round(r: RoundInput) -> Message:
    """Reply to a data round: the chosen rows quantized, with the optional compensation."""
    config, spec, y, rng, context = r.config, r.spec, r.y, r.rng, r.context
    n = r.x.shape[0]
    num_classes = num_classes_of(config, spec, y, n)
    names, named = row_names(context, r.x, y)  # the ids the server knows the rows by
    cfg, candidates, examples = _candidates(config, r.cfg, r.key, names, named,
                                            repeated_rows(r.x, y))
    x_flat, holes = holes_of(config, r.x.reshape(n, int(np.prod(r.x.shape[1:]))))  # 0 rows: no -1
    in_bound, y_in = x_flat, y  # the rows its feature ranges cover
    if (bound := config.get(VALUE_BOUND_KEY)) is not None and not spec.vocab:
        within = np.abs(x_flat).max(axis=1, initial=0.0) <= float(bound)  # outliers stay
        candidates, in_bound, y_in = candidates[within[candidates]], x_flat[within], y[within]
    model, scores = _scores(r, cfg, candidates)
    sel = select(scores, cfg.budget, cfg.selection_rule, rng, cfg.score_threshold)
    chosen = candidates[sel.indices]
    counts = {"num-examples": examples, "candidates": int(candidates.size)}
    if model is not None:  # the server's model at hand: its raw rows against their codes
        from dq_flower.dq.client import fidelity  # PyTorch: deferred
        counts.update(fidelity.round_fit(model, cfg, spec, in_bound, y_in, config, r.key,
                                          r.loss_fn))
    if not candidates.size and not bool(config.get("refresh", False)):  # every row sent
        return _reply(r, RecordDict(), 0, {**counts, "selected": 0,
                                           CAN_SCORE_KEY: int(r.model is not None)})
    represents = sel.weights * max(int(candidates.size), 1)  # 1 / pi_i per row

    coded = (_Coded(None, tokens_payload(x_flat[chosen], spec.vocab), "sample", x_flat[chosen])
             if spec.vocab else _quantize(cfg, spec, x_flat[chosen], in_bound, rng, r))
    if r.model is None:  # no model to compare with: the reference rows the server asks for
        coded.extra.update(reference_rows(cfg, spec, in_bound, y_in, config, r.key, num_classes))
    compensation, sent = None, None if holes is None else holes[chosen]  # its rows' NaN
    if cfg.compensation != "none" and chosen.size:  # on the rows as the model reads them
        compensation = _coded_residual(r, cfg, _needed(model, "compensation"), with_nan(
            coded.xb, sent), with_nan(coded.decoded(), sent), y[chosen], sel.weights, EF_KEY)
    refresh = _refresh(r, cfg, x_flat, model, coded.mode, names)

    content, payload_bits = encode_batch(
        coded.samples, None if spec.target == "inputs" else y[chosen], names[chosen],
        represents, num_classes, named, compensation, spec.target == "binary")
    payload_bits += send_holes(content, sent)  # where its rows hold NaN (asked: nan-mask)
    if refresh is not None:
        content[REFRESH_KEY] = refresh.to_record()
        payload_bits += int(refresh.nbits)
    if cfg.compensation_mode == "refresh" and chosen.size:  # for later refreshed residuals
        keep_sent(context, r.server_round, coded.samples, names[chosen], represents)
    for name, record in coded.extra.items():
        content[name] = record
        payload_bits += 8 * sum(len(a.data) for a in record.values())
    return _reply(r, content, payload_bits, {**counts, "selected": int(chosen.size),
                                             CAN_SCORE_KEY: int(r.model is not None)})


def _scores(r: RoundInput, cfg: DQConfig,
            candidates: np.ndarray) -> tuple[torch.nn.Module | None, np.ndarray]:
    """The model the round uses (``None`` where it needs none) and the candidates' scores."""
    if r.knob is None:  # the uniform scorer, no compensation: no model, no PyTorch
        return None, np.ones(candidates.size)
    from dq_flower.dq.client.scoring import received_model, score_candidates  # PyTorch: deferred

    model = received_model(r.msg, r.model, r.knob)
    scores = score_candidates(cfg.scorer, model, r.x[candidates], r.y[candidates], r.loss_fn)
    return model, scores


def _candidates(config: dict[str, Any], cfg: DQConfig, key: int, names: np.ndarray,
                named: int, repeats: np.ndarray | None = None
                ) -> tuple[DQConfig, np.ndarray, int]:
    """The node's ask (its budget), the rows it may send and its examples.

    The rows it may send: by position, those the server lacks, exact repeats of another row
    aside (``repeats``: a row copied ten times was sent ten times, the copies dropped on
    arrival); its examples: the rows the server holds and those it lacks. ``names``: the
    rows' ids (:func:`.row_names`), ``named`` of them given so far.
    """
    held, ask = held_for(config, key, named)  # what the server holds of this client's rows
    if ask is not None and ask >= 1:  # this client's own ask, from the table of every client
        cfg = dataclasses.replace(cfg, budget=int(ask))
    lacked = ~np.isin(names, held) & (True if repeats is None else ~repeats)
    candidates = np.arange(names.size) if cfg.resend else np.flatnonzero(lacked)
    if ask == 0:  # the server asks this client for nothing this round
        candidates = candidates[:0]
    return cfg, candidates, int(np.unique(held).size + lacked.sum())


@dataclasses.dataclass
class _Coded:
    """The chosen rows quantized, as the server will decode them (no quantizer: ids, exact)."""

    quantizer: Any
    samples: Payload
    mode: str
    xb: np.ndarray
    ranges: tuple[np.ndarray, ...] | None = None  # per-feature (lo, span[, scale])
    extra: dict[str, ArrayRecord] = dataclasses.field(default_factory=dict)

    def decoded(self) -> np.ndarray:
        """Exactly the points the server decodes."""
        if self.quantizer is None:
            return self.xb
        xq = self.quantizer.decode(self.samples)
        if self.ranges is not None:  # per-feature ranges
            xq = denormalise(xq, *self.ranges)
        return xq


def _quantize(cfg: DQConfig, spec: DataSpec, xb: np.ndarray, x_flat: np.ndarray,
              rng: np.random.Generator, r: RoundInput) -> _Coded:
    """Quantize the chosen rows ``xb`` (per-feature ranges: :func:`.coding_ranges`)."""
    mode = range_mode(cfg.ranges, spec.sample_shape, spec.mixed_units)
    quantizer = cfg.sample_quantizer(mode, spec.channels,
                                     dither_seed=int(rng.integers(2**31)),
                                     sample_shape=spec.sample_shape)
    if mode != "feature":
        return _Coded(quantizer, quantizer.encode(xb, rng), mode, xb)
    send = bool(r.config.get("send-ranges", True))
    ranges = coding_ranges(r.context, r.config, x_flat, quantizer.bits, send)
    coded = _Coded(quantizer, quantizer.encode(normalise(xb, *ranges), rng), mode, xb, ranges)
    if send:
        coded.extra[RANGES_KEY] = ranges_record(*ranges)
    return coded


def _refresh(r: RoundInput, cfg: DQConfig, x_flat: np.ndarray,
             model: torch.nn.Module | None, mode: str, names: np.ndarray) -> Payload | None:
    """Under ``compensation-mode = "refresh"``: the refreshed residual the round asks for."""
    if cfg.compensation_mode != "refresh":
        return None
    forget_from(r.context, r.server_round)  # rounds the server serves again: it kept none
    if not bool(r.config.get("refresh", False)):
        return None
    model = _needed(model, "a refreshed residual")
    sent = sent_rows(r.context, r.config, x_flat, r.y, mode, names)
    return None if sent is None else _coded_residual(r, cfg, model, *sent, REFRESH_EF_KEY)
