"""The data-quantization strategy, for any ``nn.Module`` and any client data.

One message exchange per round: the server sends the round's config (and the model where
the clients need it), each client replies with quantized samples (and optionally a
compensation), the server validates the replies, stores the samples in packed form and
takes ``server-steps`` optimizer steps. The first step uses the fresh batch plus the
compensation, so its gradient equals the true-data gradient when the compensation codec is
lossless; later steps draw minibatches from the store.

What the server must know about the data (the sample shape, class labels or float targets)
is given, or agreed by the first data round's replies and confirmed by a forward-and-loss of
the model on their rows, and enforced afterwards; the number of classes is given or read off
the model's output width. Replies are checked by :mod:`dq_flower.dq.validation`; nothing a
reply says is adopted unless the whole reply is accepted.

With ``upload-mode`` ``gradient`` or ``auto`` (see :mod:`dq_flower.dq.planner`), a round
may instead ask every client for a minibatch gradient coded by ``gradient-codec``; the
server then takes one step with their example-weighted mean, and the remaining
``server-steps`` from the store when it holds samples.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping
from logging import WARNING
from typing import Any, cast

import numpy as np
import torch
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    MetricRecord,
    MetricRecordValues,
    RecordDict,
)
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from dq_flower.codecs import Payload, PayloadError, make
from dq_flower.config import build_config, strategy_kwargs, to_config_record
from dq_flower.dq.config import CLIENT_KEYS, DQConfig, robust_rule
from dq_flower.dq.control_variate import ControlVariate
from dq_flower.dq.held import EMPTY, HELD_KEY, TABLE_KEY, encode_held, encode_table
from dq_flower.dq.holdout import choose_holdout
from dq_flower.dq.identity import ClientIdentities, RoundClients, reply_identity
from dq_flower.dq.planner import (
    ESTIMATES,
    RoundPlan,
    UploadPlanner,
    first_estimates,
    gradient_estimate,
    reply_bits,
)
from dq_flower.dq.plateau import HeldOutScores, PhaseResult, PlateauRule, train_phase
from dq_flower.dq.rows import RowLayout, keep_rows, kept_rows
from dq_flower.dq.schedule import AdaptiveSchedule, allocate, paired_gain
from dq_flower.dq.store import SampleStore, StoredRows
from dq_flower.dq.validation import (
    MAX_LOCAL_ID,
    MAX_SAMPLE_WEIGHT_FACTOR,
    SHARE_FACTOR,
    VALUE_FACTOR,
    History,
    Rules,
    Upload,
    agree,
    check_model,
    check_upload,
    decode_compensation,
    decode_vector,
    placeholder_rows,
    reply_spec,
)
from dq_flower.model_ops import (
    LossFn,
    apply_flat_grad,
    per_sample_results,
    state_arrays,
    weighted_loss_grad,
)
from dq_flower.protocol.dq_batch import (
    GRADIENT_KEY,
    REFRESH_KEY,
    SampleBatch,
    denormalise,
    range_mode,
)
from dq_flower.protocol.gradient_reply import GradientDecoder, GradientUpdate
from dq_flower.protocol.model import MODEL_KEY, model_record
from dq_flower.protocol.spec import SPEC_KEY, DataSpec
from dq_flower.seeding import Purpose, round_rng
from dq_flower.server.base import ModelStrategy
from dq_flower.server.common import (
    FailureWatch,
    log_rejected,
    log_round,
    make_optimizer,
    sample_node_ids,
)
from dq_flower.server.pipeline import RoundLedger, Screened, bound_vectors, screen_replies
from dq_flower.server.robust import NormScreen, StepGuard, aggregate, clip_norms

__all__ = ["DQStrategy", "Upload", "MAX_LOCAL_ID", "MAX_SAMPLE_WEIGHT_FACTOR"]


class DQStrategy(ModelStrategy, Strategy):
    """Train ``model`` on quantized data samples uploaded by the clients.

    Parameters
    ----------
    model : torch.nn.Module
        The user's model; the server trains it in place (``start`` loads
        ``initial_arrays`` into it first).
    loss_fn : callable, optional
        ``loss_fn(outputs, targets)`` returning per-sample losses; default: cross-entropy
        for integer labels, mean squared error for float targets.
    seed : int
        Root of every random choice (node sampling, round seeds, minibatches).
    fraction_train : float
        Fraction of the connected nodes sampled each round.
    min_available_nodes : int
        Nodes that must be connected before a round samples (as in Flower's strategies).
    fraction_evaluate, min_evaluate_nodes
        Federated evaluation (off by default): see
        :class:`~dq_flower.server.common.FederatedEvaluation`.
    num_classes : int, optional
        Classes of integer targets; default: the width of the model's output.
    data_spec : DataSpec, optional
        Sample shape and target kind; default: what most of the first data round's
        replies carry, if the model trains on it.
    config : DQConfig, optional
        The method's knobs; ``**knobs`` (underscore names, e.g. ``bits=2``) override it.
    augment : callable, optional
        ``augment(x) -> x`` applied to every server minibatch (a float tensor shaped like
        the samples, batch first) before the step, e.g. random shifts for images (see
        :func:`dq_flower.augment.random_shift`); never to the held-out rows.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        loss_fn: LossFn | None = None,
        seed: int = 0,
        fraction_train: float = 1.0,
        min_available_nodes: int = 1,
        fraction_evaluate: float = 0.0,
        min_evaluate_nodes: int = 1,
        num_classes: int | None = None,
        data_spec: DataSpec | None = None,
        config: DQConfig | None = None,
        augment: Callable[[torch.Tensor], torch.Tensor] | None = None,
        **knobs: Any,
    ) -> None:
        if num_classes is not None and num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {num_classes}")
        self._setup(model, seed=seed, fraction_train=fraction_train,
                    min_available_nodes=min_available_nodes,
                    fraction_evaluate=fraction_evaluate, min_evaluate_nodes=min_evaluate_nodes)
        self.cfg: DQConfig = build_config(config, knobs, DQConfig)
        self.loss_fn = loss_fn
        self.num_classes = num_classes
        self.num_rounds: int | None = None
        cfg = self.cfg
        self.optimizer = make_optimizer(cfg.optimizer, model.parameters(), cfg.lr,
                                        cfg.momentum, cfg.weight_decay)
        self.comp_codec = (make(cfg.compensation, **cfg.compensation_kwargs)
                           if cfg.compensation != "none" else None)
        self.grad_codec = (make(cfg.gradient_codec, **cfg.gradient_codec_kwargs)
                           if cfg.upload_mode != "data" else None)
        self.num_params = sum(p.numel() for p in model.parameters())
        # Reply sizes feed the planner's estimates, which only gradient and auto modes use:
        # plain data runs neither encode synthetic replies nor serialize replies twice.
        self.measuring = cfg.upload_mode != "data"
        estimates: dict[str, Any] = dict.fromkeys(ESTIMATES, 0.0)  # UploadPlanner's floats
        if self.grad_codec is not None:
            estimates["gradient_bits"] = gradient_estimate(self.grad_codec, self.num_params,
                                                           self.seed)
        self.planner = UploadPlanner(cfg.upload_mode, cfg.budget, cfg.resend, **estimates)
        self.spec: DataSpec | None = None
        self.mode = "sample"
        self.layout: RowLayout | None = None
        self.store: SampleStore | None = None
        self.ranges: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.plans: dict[int, RoundPlan] = {}
        #: per round, the number of samples asked of each node
        self.asked: dict[int, dict[int, int]] = {}
        self.augment = augment
        self.schedule = (AdaptiveSchedule(cfg.min_gain, cfg.max_growth) if cfg.adaptive
                         else None)
        self.plateau = PlateauRule(cfg.plateau_eval_every, cfg.plateau_patience, cfg.lr_drops,
                                   cfg.lr_factor, cfg.max_server_steps)
        #: mean held-out loss per node after the last training phase (adaptive asks)
        self.node_fit: dict[int, float] = {}
        self.last_phase: PhaseResult | None = None
        self._round_ids: dict[int, np.ndarray] = {}  # this round's uploaded ids per node
        #: whether the last phase's model was worse on its fresh held-out rows than the one
        #: before it, which the server then kept
        self.reverted = False
        self.failures = FailureWatch(cfg.max_failed_rounds, "dq")
        # gradient-round gradients against recent rounds; compensations and refreshed
        # residuals, which grow between rounds of long server training, against their round
        self.norms = NormScreen(cfg.norm_bound_factor)
        self.comp_norms = NormScreen(cfg.norm_bound_factor, round_first=True)
        self.refresh_norms = NormScreen(cfg.norm_bound_factor, round_first=True)
        self.ledger = RoundLedger()
        self._gradient_bits: dict[int, int] = {}  # this round's gradient replies' sizes
        self.guard = StepGuard(model, self.optimizer)
        self.value_bound = float(cfg.max_abs_value) or None
        self._given_classes = num_classes
        #: what was learned from replies and is forgotten while no row is stored
        self._provisional = {"spec": False, "bound": False}
        self.rolled_back = 0
        self.cv = (ControlVariate(self.num_params, cfg.compensation_decay)
                   if cfg.compensation_mode != "first-step" else None)
        #: which client (identity) each node id is; everything per client is keyed by it
        self.identities = ClientIdentities()
        self._round_tables: dict[int, tuple[set[int], dict[int, int], int]] = {}
        self._configured = 0  # the round last configured
        self._held_bytes = 0  # bytes of held sets and tables the last round sent
        self._duplicates = 0  # rows of this round's replies the server already held
        if data_spec is not None:
            self._fix_spec(data_spec)

    # ------------------------------------------------------------------ Strategy API
    @classmethod
    def from_run_config(cls, model: torch.nn.Module, run_config: Mapping[str, Any],
                        **overrides: Any) -> DQStrategy:
        """The strategy with its knobs read from a run config (``context.run_config``).

        Every :class:`DQConfig` field and scalar argument (``seed``, ``fraction-train``,
        ...) is read from its hyphenated key where present, other keys are ignored and
        ``overrides`` win (:func:`dq_flower.config.strategy_kwargs`); a value of the wrong
        type raises ``ValueError`` naming its key.
        """
        return cls(model, **strategy_kwargs(cls, DQConfig, run_config, overrides))

    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3,
              *args: Any, **kwargs: Any) -> Result:
        """Flower's ``Strategy.start``; the planner learns the number of rounds from it."""
        self.num_rounds = int(num_rounds)
        return super().start(grid, initial_arrays, num_rounds, *args, **kwargs)

    def summary(self) -> None:
        """Log the configuration."""
        log_round("dq", 0, f"config {self.cfg}")

    @property
    def needs_model(self) -> bool:
        """Whether clients need the model (compensation or model-based importance)."""
        return self.cfg.compensation != "none" or self._scorer_now() != "uniform"

    def _scorer_now(self) -> str:
        """The round's scorer (``uniform`` while an adaptive run's store is empty).

        An untrained model's scores carry no information, so the first upload round of the
        adaptive schedule sends no model.
        """
        if self.schedule is not None and self.stored == 0:
            return "uniform"
        return self.cfg.scorer

    @property
    def finished(self) -> bool:
        """The adaptive schedule stopped asking and the store is trained to a plateau."""
        return self.schedule is not None and self.schedule.done

    @property
    def stored(self) -> int:
        """Samples in the store."""
        return 0 if self.store is None else len(self.store)

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Send the sampled nodes the round config (and the model where needed).

        In a data round, clients known to have uploaded all their samples are not asked,
        and each message says which of the client's rows the server holds (``held``), or,
        to a node id the server cannot name yet, gives the table of every client identity
        it may be (``held-table``; see :mod:`dq_flower.dq.identity`).
        """
        self._load_arrays(arrays)
        nodes = sample_node_ids(grid, self.fraction_train, self.min_available_nodes,
                                round_rng(self.seed, server_round, 0, Purpose.SAMPLE))
        self._configured = server_round
        self.identities.observe(grid.get_node_ids())
        clients = self.identities.split([int(n) for n in nodes], self._known_identities())
        rounds_left = (self.num_rounds - server_round + 1) if self.num_rounds else 1
        plan = self.planner.plan(clients.keys, max(rounds_left, 1))
        self.plans[server_round] = plan
        cfg = ConfigRecord(dict(config.items()))
        knobs = to_config_record(self.cfg)
        for key in CLIENT_KEYS:
            if key in knobs:
                cfg[key] = knobs[key]
        cfg["server-round"] = server_round
        seed_rng = round_rng(self.seed, server_round, 0, Purpose.ROUND_SEED)
        cfg["round-seed"] = int(seed_rng.integers(2**31))
        cfg["round-mode"] = plan.mode
        if self.num_classes:
            cfg["num-classes"] = int(self.num_classes)
        refresh = self._refresh_round(server_round)
        if refresh:
            cfg["refresh"] = 1
        if self._scorer_now() != self.cfg.scorer:
            cfg["scorer"] = self._scorer_now()
        nodes, table = self._round_asks(server_round, nodes, clients, plan, refresh)
        shared: dict[str, Any] = {}
        if nodes and (self.needs_model or plan.mode == "gradient"):
            shared[MODEL_KEY] = model_record(
                self.model, codec="fp16" if self.cfg.model_precision == "fp16" else "identity")
        messages = []
        self._held_bytes = 0
        for node in nodes:
            node_cfg = ConfigRecord(dict(cfg.items()))
            identity = clients.known.get(int(node))
            if self.schedule is not None:
                node_cfg["budget"] = max(self.asked[server_round][int(node)], 1)
            if plan.mode == "data":
                held = table if identity is None else self._held_of(identity)
                if held is not None:
                    node_cfg[TABLE_KEY if identity is None else HELD_KEY] = held
                    self._held_bytes += len(held)
                if self._may_use_feature_ranges():
                    node_cfg["send-ranges"] = identity is None or identity not in self.ranges
            content = RecordDict({"config": node_cfg, **shared})
            messages.append(Message(content=content, message_type=MessageType.TRAIN,
                                    dst_node_id=node))
        return self.ledger.record(server_round, messages)

    def _known_identities(self) -> set[int]:
        """Every client identity the server keeps state of."""
        known = set(self.planner.clients) | set(self.identities.node_of)
        return known | set(self.store.clients) if self.store is not None else known

    def _held_of(self, identity: int) -> bytes | None:
        """The held-set bytes of ``identity`` (``None`` with ``resend``: nothing to say)."""
        if self.cfg.resend:
            return None
        return EMPTY if self.store is None else encode_held(self.store.received(identity))

    def _round_asks(self, server_round: int, nodes: list[int], clients: RoundClients,
                    plan: RoundPlan, refresh: bool) -> tuple[list[int], bytes | None]:
        """The nodes asked this round, their asks (``self.asked``), and the nodes' table.

        Asks are per client identity. A node the server cannot name (a new node id) gets
        the table of every identity it may be, with each one's held set and ask, and the
        ask of an identity the table does not list; the table is ``None`` where no such
        node is asked, or the server knows no identity it may be.
        """
        keys = clients.keys
        asks = dict.fromkeys(keys, self.cfg.budget)
        screened = plan.mode == "data" and not refresh  # a refresh round asks every node
        if screened:
            if self.schedule is not None:
                asks = self._adaptive_asks(keys)
            asks = {k: a if self.planner.samples_left(k, 1) > 0 else 0
                    for k, a in asks.items()}
        if clients.spare:
            default = asks.get(clients.spare[0], 0)
        else:  # a node beyond every known identity: asked once it is known (adaptive)
            default = 0 if screened and self.schedule is not None else self.cfg.budget
        table_asks = {i: asks.get(i, 0) for i in clients.free}
        unknown_asked = default > 0 or any(a > 0 for a in table_asks.values())
        if screened:
            nodes = [n for n in nodes if (asks.get(clients.known[int(n)], 0) > 0
                                          if int(n) in clients.known else unknown_asked)]
        self.asked[server_round] = {
            int(n): (asks.get(clients.known[int(n)], 0) if int(n) in clients.known
                     else default) for n in nodes}
        unknown = {int(n) for n in nodes} - set(clients.known)
        self._round_tables = {server_round: (unknown, table_asks, default)}
        if not unknown or not clients.free or plan.mode != "data":
            return nodes, None
        table = encode_table({i: (a, self._held_of(i) or EMPTY) for i, a in table_asks.items()},
                             default)
        return nodes, table

    def _adaptive_asks(self, keys: list[int]) -> dict[int, int]:
        """Per-client asks of the adaptive schedule: ``budget`` each in the first round.

        ``keys`` are the round's client identities (and placeholders for nodes the server
        cannot name yet, see :class:`~dq_flower.dq.identity.RoundClients`).
        """
        assert self.schedule is not None
        if self.schedule.done:
            return {}
        if self.schedule.next_total is None:
            return dict.fromkeys(keys, self.cfg.budget)
        left: dict[int, int | None] = {}
        for key in keys:
            known = self.planner.clients.get(int(key))
            left[key] = (None if known is None else
                         known[0] if self.cfg.resend else max(known[0] - known[1], 0))
        if all(v == 0 for v in left.values()) and self._every_node_known(keys):
            self.schedule.stop("exhausted")  # nothing left anywhere: the store holds it all
            return {}
        return allocate(self.schedule.next_total, left, self.node_fit)

    def _every_node_known(self, sampled: list[int]) -> bool:
        """Whether the round sampled every client the server has heard from (or all)."""
        return set(self.planner.clients) <= set(sampled)

    def _validate_reply(self, msg: Message, server_round: int,
                        asked: Mapping[int, int]) -> Upload:
        """:meth:`_validate` a data reply under the client identity it claims.

        The identity (its ``partition-id`` metric, else its node id) must not belong to
        another node still connected, nor be claimed by another node this round; the
        reply is checked against that identity's state and ask.
        """
        src = int(msg.metadata.src_node_id)
        identity = reply_identity(msg.content.metric_records.get("metrics"), src)
        self.identities.check(server_round, src, identity)
        ask = asked.get(src, self.cfg.budget)
        unknown, table_asks, default = self._round_tables.get(server_round, (set(), {}, 0))
        if src in unknown:
            ask = table_asks.get(identity, default)
        upload = self._validate(msg, identity, ask)
        self.identities.claim(server_round, src, identity)
        upload.source = src
        if kept_rows(upload.batch) is not None:  # rows the server already held: dropped
            dropped = int(upload.batch.samples.shape[0]) - len(upload.batch)
            self._duplicates += dropped
            log_round("dq", server_round, f"client {identity} (node {src}) re-sent {dropped} "
                      "rows the server holds: those rows are dropped")
        return upload

    def _drop_held(self, batch: SampleBatch, x: np.ndarray,
                   identity: int) -> tuple[SampleBatch, np.ndarray]:
        """Drop the rows of a reply the server already holds (a late reply, a replay).

        Without ``resend`` an honest client never sends them (each message names the rows
        the server holds); the rest of the reply is kept, and :meth:`_validate_reply`
        counts the dropped rows in the round's ``duplicate-rows``.
        """
        if self.cfg.resend or not len(batch) or self.store is None:  # nothing held yet
            return batch, x
        held = self.store.was_received(identity, batch.ids)
        if not held.any():
            return batch, x
        return keep_rows(batch, ~held), x[~held]

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Validate replies, store their samples, take the server's optimizer steps."""
        replies = list(replies)
        sent = self.ledger.take(server_round)
        plan = self.plans.pop(server_round, None)
        if plan is not None and plan.mode == "gradient":
            self.asked.pop(server_round, None)
            return self._aggregate_gradients(server_round, replies, plan, sent)
        t0 = time.perf_counter()
        asked = self.asked.pop(server_round, {})
        screened = screen_replies(
            replies, lambda msg: self._validate_reply(msg, server_round, asked), sent)
        self._observe_failures(replies, screened)
        # Replies arrive in any order: store and combine them in the clients' partition
        # order, so that a run is reproducible from its seed.
        candidates = sorted(screened.accepted, key=lambda u: (u.partition, u.node))
        candidates, rejected = self._adopt(candidates, screened.rejected)
        failed = screened.failed
        candidates, dropped = self._screen_deltas(candidates)
        refreshed, refreshes_rejected = self._update_control_variate(candidates)
        stored_before = self.stored
        fresh: list[Upload] = []
        for upload in candidates:
            try:  # store insertion is part of the reply boundary: a failure rejects it
                if len(upload.batch):
                    assert self.store is not None
                    rows = self._rows(upload.batch, upload.node)
                    self.store.add(rows)
                    upload.holdout = rows.holdout
            except Exception as exc:  # noqa: BLE001
                dropped += 1
                log_rejected(upload.node, f"store insertion failed: {type(exc).__name__}: "
                             f"{exc}")
                continue
            if upload.ranges is not None:
                self.ranges[upload.node] = upload.ranges
            fresh.append(upload)
        rejected += dropped
        self.guard.begin()
        if self.schedule is not None:
            loss = self._train_adaptive(server_round, fresh, stored_before)
        else:
            loss = self._train_steps(server_round, fresh)
        if not self.guard.finite_or_restore():
            self._rolled_back(server_round, [u.node for u in fresh])
            loss = float("nan")
        up_bits = sum(u.batch.payload_bits for u in fresh)
        packed = sum(u.batch.packed_nbytes for u in fresh)
        self._measure_data(fresh)
        metrics = self._round_metrics(
            plan, loss=loss, selected=sum(len(u.batch) for u in fresh), up_bits=up_bits,
            replies=len(fresh), rejected=rejected, failed=failed, t0=t0)
        metrics["up-packed-bytes"] = int(packed)
        metrics["rolled-back"] = self.rolled_back
        if self.cv is not None:
            metrics["refreshed"] = refreshed
            metrics["refreshes-rejected"] = refreshes_rejected
        if self.schedule is not None:
            metrics.update(self._schedule_metrics(stored_before))
        log_round("dq", server_round, f"{metrics['selected']} new samples, "
                  f"store {metrics['stored']}, rejected {rejected}, failed {failed}"
                  + self._schedule_text(metrics))
        self._returned = state_arrays(self.model)
        return self._returned, MetricRecord(metrics)

    def _refresh_round(self, server_round: int) -> bool:
        """Whether clients send refreshed residuals this round (``compensation-mode``)."""
        return (self.cfg.compensation_mode == "refresh" and server_round > 1
                and server_round % self.cfg.refresh_every == 0)

    def _observe_failures(self, replies: list[Message], screened: Screened) -> None:
        """Count the round towards ``max-failed-rounds`` while the store is empty.

        With samples stored, a round trains on the store whoever fails, so it is not a dead
        run; its failed and silent nodes are still counted in ``failed``.
        """
        if self.stored == 0:
            self.failures.observe(replies, screened.silent)
        else:
            self.failures.observe([])

    def _update_control_variate(self, fresh: list[Upload]) -> tuple[int, int]:
        """Age the control variate, then enter the round's refreshed and fresh deltas.

        Called before the round's rows are stored, so a refreshed residual replaces the
        share of exactly the node's earlier rows. Refreshed residuals pass their own norm
        screen and clip, as compensations do. Returns ``(refreshed, rejected refreshes)``.
        """
        if self.cv is None:
            return 0, 0
        self.cv.age()
        dropped = self._screen_refreshes(fresh)
        refreshed = 0
        for u in fresh:
            if u.refresh is not None and self.store is not None:
                self.cv.replace(u.node, u.refresh, self.store.node_weight(u.node))
                refreshed += 1
            if u.delta is not None and len(u.batch):
                self.cv.add(u.node, u.delta, float(u.batch.weights.sum()))
        return refreshed, dropped

    def _screen_refreshes(self, uploads: list[Upload]) -> int:
        """Norm-screen and clip the refreshed residuals in place; a rejected one is dropped."""
        with_refresh = [u for u in uploads if u.refresh is not None]
        if not with_refresh:
            return 0
        bounded = bound_vectors([cast(np.ndarray, u.refresh) for u in with_refresh],
                                [1.0] * len(with_refresh), self.refresh_norms,
                                clip_factor=self.cfg.clip_factor, clip_norm=self.cfg.clip_norm)
        kept = iter(bounded.vectors)
        for u, k in zip(with_refresh, bounded.keep, strict=True):
            if k:
                u.refresh = next(kept)
            else:
                u.refresh = None
                log_rejected(u.node, "refreshed residual's norm is implausibly large against "
                             "the other clients' (norm-bound-factor)")
        return bounded.keep.count(False)

    def _rolled_back(self, server_round: int, nodes: list[int]) -> None:
        self.rolled_back += 1
        log_round("dq", server_round, "the round's steps made the model non-finite: rolled "
                  f"back; the round's replies came from nodes {sorted(nodes)}")

    def _screen_deltas(self, uploads: list[Upload]) -> tuple[list[Upload], int]:
        """Drop uploads whose compensation norm is implausible; clip the others' in place.

        See :func:`dq_flower.server.pipeline.bound_vectors`.
        """
        with_delta = [u for u in uploads if u.delta is not None]
        if not with_delta:
            return uploads, 0
        bounded = bound_vectors([cast(np.ndarray, u.delta) for u in with_delta],
                                [1.0] * len(with_delta), self.comp_norms,
                                clip_factor=self.cfg.clip_factor, clip_norm=self.cfg.clip_norm)
        keep = bounded.keep
        kept = iter(bounded.vectors)
        for u, k in zip(with_delta, keep, strict=True):
            if k:
                u.delta = next(kept)
        bad = {id(u) for u, k in zip(with_delta, keep, strict=True) if not k}
        for u in with_delta:
            if id(u) in bad:
                log_rejected(u.node, "compensation norm is implausibly large against the "
                             "other clients' (norm-bound-factor)")
        return [u for u in uploads if id(u) not in bad], len(bad)

    # ------------------------------------------------------------------ the data spec
    def _may_use_feature_ranges(self) -> bool:
        if self.spec is None:
            return self.cfg.ranges in ("auto", "feature")
        return self.mode == "feature"

    def _fix_spec(self, spec: DataSpec, classes: int | None = None) -> None:
        """Adopt ``spec`` and set up the store.

        ``classes``: what the model check of the replies' rows gave; without it (a spec
        given or resumed) the model and loss are checked on zero rows here.
        """
        if classes is None:
            classes = check_model(self.model, spec, *placeholder_rows(spec),
                                  self.num_classes, self.loss_fn)
        if spec.target == "class":
            self.num_classes = classes
        self.spec = spec
        self.mode = range_mode(self.cfg.ranges, self.cfg.per_channel, spec.sample_shape)
        groups = spec.channels if self.mode == "channel" else 1
        self.layout = RowLayout(spec.dim, self.cfg.bits, max(groups, 1),
                                fixed=self.mode == "feature")
        self.store = SampleStore(self.layout.dequantize, max_samples=self.cfg.max_store_samples,
                                 eviction=self.cfg.store_eviction, seed=self.seed)
        if self.mode == "feature":
            self.store.transform = self._denormalise_rows
        if self.measuring and self.planner.sample_bits == 0.0:
            est = first_estimates(self.cfg, self.mode, spec.dim, spec.channels,
                                  self.num_classes or 2, self.comp_codec, self.num_params,
                                  self.seed)
            self.planner.sample_bits = est["sample_bits"]
            self.planner.reply_bits = est["reply_bits"]
        log_round("dq", 0, f"data: samples {spec.sample_shape}, {spec.target} targets, "
                  f"ranges {self.mode}" + (f", {self.num_classes} classes"
                                            if spec.target == "class" else ""))

    def _check_spec(self, content: RecordDict) -> DataSpec:
        """The reply's data spec, equal to the federation's where one is adopted."""
        return reply_spec(content, self.spec)

    def _denormalise_rows(self, x: np.ndarray, nodes: np.ndarray) -> np.ndarray:
        out = np.empty_like(x)
        for node in np.unique(nodes):
            lo, span = self.ranges[int(node)]
            mask = nodes == node
            out[mask] = denormalise(x[mask], lo, span)
        return out

    # ------------------------------------------------------------------ validation
    def _rules(self) -> Rules:
        """What a data reply is checked against: the knobs and what the server adopted.

        A spec or bound learned from replies none of whose rows is stored is not enforced:
        :meth:`_adopt` learns it again.
        """
        cfg, unconfirmed = self.cfg, self.stored == 0
        spec = None if unconfirmed and self._provisional["spec"] else self.spec
        bound = None if unconfirmed and self._provisional["bound"] else self.value_bound
        return Rules(cfg.bits, cfg.dither, cfg.selection_rule, cfg.ranges, cfg.per_channel,
                     cfg.resend, spec, self.num_classes, bound)

    def _history(self, node: int) -> History:
        """What the server holds about ``node``: its examples, stored rows, feature ranges."""
        known = self.planner.clients.get(int(node))
        stored = 0
        if self.store is not None and self.spec is not None:
            strata = (np.arange(self.num_classes or 1) if self.spec.target == "class"
                      else np.zeros(1, dtype=np.int64))  # float targets: one stratum
            stored = int(self.store.counts(node, strata)[0].sum())
        return History(known[0] if known else 0, stored, self.ranges.get(int(node)))

    def _validate(self, msg: Message, node: int, max_rows: int | None = None) -> Upload:
        """Check one data reply (:func:`~dq_flower.dq.validation.check_upload`).

        Adopts nothing: what the round's accepted replies agree on is adopted by
        :meth:`_adopt`.
        """
        content = msg.content
        upload = check_upload(content, node, self._rules(), self._history(node),
                              self.cfg.budget if max_rows is None else int(max_rows))
        upload.delta = decode_compensation(upload.batch, self.comp_codec, self.num_params)
        upload.refresh = self._decode_refresh(content, node)
        upload.batch, upload.x = self._drop_held(upload.batch, upload.x, node)
        upload.reply_bits = reply_bits(content) if self.measuring else 0
        return upload

    def _adopt(self, uploads: list[Upload], rejected: int) -> tuple[list[Upload], int]:
        """The round's checked uploads the round agrees on, and ``rejected`` plus the others.

        See :func:`~dq_flower.dq.validation.agree`: example counts screened against the
        other nodes' (over-large weights clipped), the data spec (while none is known) that
        most uploads carry and the model trains on, the value bound (while none is known)
        from the median upload. The spec and bound are adopted here, before the accepted
        rows are stored; learned from replies, they stay provisional until rows are stored.
        """
        self._forget_unconfirmed()
        known = {int(n): int(v[0]) for n, v in self.planner.clients.items() if v[0] > 0}
        verdict = agree(uploads, self._rules(), known, self._check_model)
        for upload, reason in verdict.refused:
            log_rejected(upload.node, reason)
        for upload in verdict.accepted:
            if upload.weight_scale < 1.0:
                log(WARNING, "reply from node %d: its weight is clipped to %g times the "
                    "median node's examples (x%.3g)", upload.node, SHARE_FACTOR,
                    upload.weight_scale)
        if verdict.spec is not None:
            self._fix_spec(verdict.spec, verdict.classes)
            self._provisional["spec"] = True
        if verdict.value_bound is not None:
            self.value_bound = verdict.value_bound
            self._provisional["bound"] = True
            log_round("dq", 0, f"data values bounded by {self.value_bound:g} (max-abs-value: "
                      f"{VALUE_FACTOR:g} times the median upload's largest)")
        return verdict.accepted, rejected + len(verdict.refused)

    def _forget_unconfirmed(self) -> None:
        """Forget a spec and bound learned from replies while no row of them is stored."""
        if self.stored:
            self._provisional = {"spec": False, "bound": False}
            return
        if self._provisional["spec"]:
            self.spec, self.layout, self.store, self.mode = None, None, None, "sample"
            self.num_classes, self.ranges = self._given_classes, {}
        if self._provisional["bound"]:
            self.value_bound = None
        self._provisional = {"spec": False, "bound": False}

    def _check_model(self, spec: DataSpec, upload: Upload) -> int:
        """The forward-and-loss check of ``upload``'s rows under ``spec``; the classes."""
        return check_model(self.model, spec, upload.x, upload.batch.labels, self.num_classes,
                           self.loss_fn)

    def _decode_refresh(self, content: RecordDict, node: int) -> np.ndarray | None:
        """A refreshed residual, checked like a compensation; only where one was asked."""
        record = content.array_records.get(REFRESH_KEY)
        if record is None:
            return None
        if self.cv is None or self.comp_codec is None or self.store is None:
            raise PayloadError("unexpected refreshed residual")
        residual = decode_vector(Payload.from_record(record), self.comp_codec,
                                 self.num_params, "refreshed residual")
        if self.store.node_weight(node) <= 0:  # its rows were evicted: nothing to correct
            return None
        return residual

    def _check_examples(self, node: int, examples: int) -> None:
        """A node's number of examples does not change between rounds."""
        known = self.planner.clients.get(int(node))
        if known is not None and known[0] and known[0] != examples:
            raise PayloadError(f"'num-examples' changed from {known[0]} to {examples}")

    def _measure_data(self, fresh: list[Upload]) -> None:
        """Tell the planner what the valid data replies carried and cost.

        Each accepted reply also binds its node id to the identity it spoke for.
        """
        for u in fresh:
            self.identities.bind(u.source, u.node)
            self.planner.record_data(u.node, u.examples, len(u.batch))
        full = [u for u in fresh if len(u.batch)]
        if full and self.measuring:
            samples = [u.batch.samples.nbits + u.batch.info_nbits for u in full]
            rest = [u.reply_bits - s for u, s in zip(full, samples, strict=True)]
            self.planner.measured(sample_bits=sum(samples) / sum(len(u.batch) for u in full),
                                  reply_bits=float(np.mean(rest)))

    def _round_metrics(self, plan: RoundPlan | None, *, loss: float, selected: int,
                       up_bits: int, replies: int, rejected: int, failed: int,
                       t0: float) -> dict[str, MetricRecordValues]:
        """The per-round metrics both kinds of round report."""
        metrics: dict[str, MetricRecordValues] = {
            "train-loss": float(loss),
            "selected": int(selected),
            "stored": self.stored,
            "store-bytes": 0 if self.store is None else self.store.nbytes,
            "evicted": 0 if self.store is None else self.store.evicted,
            "up-payload-bits": int(up_bits),
            "replies": replies,
            "rejected": rejected,
            "failed": failed,
            "server-time-s": time.perf_counter() - t0,
            # rows of the round's replies the server already held (dropped), and the bytes
            # of the held sets and tables its messages carried (part of the downlink)
            "duplicate-rows": self._duplicates,
            "held-set-bytes": self._held_bytes,
        }
        self._duplicates = 0
        if plan is not None and self.cfg.upload_mode != "data":
            metrics.update({"gradient-round": int(plan.mode == "gradient"),
                            "est-data-bits": float(plan.data_bits),
                            "est-gradient-bits": float(plan.gradient_bits)})
        return metrics

    def _validate_gradient(self, msg: Message) -> GradientUpdate:
        """Check and decode one reply of a gradient round (the baselines' decoder)."""
        content = msg.content
        if SPEC_KEY in content.config_records:
            self._check_spec(content)
        assert self.grad_codec is not None
        src = int(msg.metadata.src_node_id)
        metrics = content.metric_records.get("metrics")
        identity = reply_identity(metrics, src) if metrics is not None else src
        self.identities.check(self._configured, src, identity)
        update = GradientDecoder([GRADIENT_KEY], [self.num_params], self.grad_codec,
                                 max_examples=MAX_LOCAL_ID, require_loss=False,
                                 exact_records=False)(msg)
        self._check_examples(identity, int(update.weight))
        self.identities.claim(self._configured, src, identity)
        self.identities.bind(src, identity)
        update.node = identity  # per-client state is keyed by the client's identity
        self._gradient_bits[identity] = reply_bits(content)
        return update

    def _aggregate_gradients(self, server_round: int, replies: list[Message],
                             plan: RoundPlan, sent: dict[int, Message] | None,
                             ) -> tuple[ArrayRecord, MetricRecord]:
        """A gradient round: one step with the bounded mean gradient, then store steps."""
        t0 = time.perf_counter()
        screened = screen_replies(replies, self._validate_gradient, sent)
        self._observe_failures(replies, screened)
        valid = sorted(screened.accepted, key=lambda r: (r.partition, r.node))
        bounded = bound_vectors([r.vector for r in valid], [r.weight for r in valid],
                                self.norms, clip_factor=self.cfg.clip_factor,
                                clip_norm=self.cfg.clip_norm, weight_cap=self.cfg.weight_cap,
                                min_cosine=self.cfg.min_cosine, what="gradient",
                                nodes=[r.node for r in valid])
        screened.accepted, screened.nodes = valid, [r.node for r in valid]
        screened.keep(bounded.reasons)
        valid = screened.accepted
        losses: list[float] = []
        self.guard.begin()
        if valid:
            grad = aggregate(bounded.vectors, bounded.weights,
                             robust_rule(self.cfg.robust_aggregation), self.cfg.trim_fraction)
            self.model.train()
            apply_flat_grad(self.model, self.optimizer, grad)
            losses = [r.loss for r in valid]
        later = self._store_steps(server_round, self.cfg.server_steps - (1 if valid else 0))
        if not self.guard.finite_or_restore():
            self._rolled_back(server_round, [r.node for r in valid])
            later, losses = [], []
        loss = float(np.mean(later or losses)) if (later or losses) else float("nan")
        for r in valid:
            self.planner.record_examples(r.node, int(r.weight))
        if valid:
            self.planner.measured(gradient_bits=float(np.mean(
                [self._gradient_bits[r.node] for r in valid])))
        self._gradient_bits.clear()
        metrics = self._round_metrics(plan, loss=loss, selected=0,
                                      up_bits=sum(r.payload_bits for r in valid),
                                      replies=len(valid), rejected=screened.rejected,
                                      failed=screened.failed, t0=t0)
        metrics["rolled-back"] = self.rolled_back
        metrics["misaligned"] = len(bounded.misaligned)
        log_round("dq", server_round, f"gradient round: {len(valid)} gradients, "
                  f"store {metrics['stored']}, rejected {screened.rejected}, failed "
                  f"{screened.failed}")
        self._returned = state_arrays(self.model)
        return self._returned, MetricRecord(metrics)

    # ------------------------------------------------------------------ training
    def _rows(self, batch: SampleBatch, node: int) -> StoredRows:
        assert self.layout is not None and self.store is not None
        codes, side, dither = self.layout.rows(batch.samples)
        kept = kept_rows(batch)  # a reply whose rows the server already held lost those
        if kept is not None:
            codes, side, dither = codes[kept], side[kept], dither[kept]
        n = len(batch)
        holdout = None
        if self.schedule is not None:
            holdout = choose_holdout(batch.labels, batch.ids, node, self.cfg.holdout_fraction,
                                     self.seed, self.store.counts)
        return StoredRows(codes, side, batch.labels, batch.weights,
                          np.full(n, node, dtype=np.uint64), batch.ids, dither, holdout)

    def _shaped(self, x: np.ndarray) -> np.ndarray:
        assert self.spec is not None
        return x.reshape(-1, *self.spec.sample_shape)

    def fresh_gradient(self, fresh: list[Upload]) -> tuple[float, np.ndarray]:
        """Gradient of the first step: fresh quantized batch plus mean compensation.

        With ``N = sum_k n_k`` candidates, it is ``(1/N) sum_i grad f(Q(x_i)) / pi_i +
        sum_k (n_k / N) delta_k``: the Horvitz-Thompson estimate of the candidates' mean
        gradient, exact at the true points when the compensation codec is lossless.
        """
        total = float(sum(u.candidates for u in fresh))
        keep = [np.ones(len(u.batch), dtype=bool) if u.holdout is None else ~u.holdout
                for u in fresh]  # held-out rows are never trained on
        xs = np.concatenate([u.x[k] for u, k in zip(fresh, keep, strict=True)])
        ys = np.concatenate([u.batch.labels[k] for u, k in zip(fresh, keep, strict=True)])
        ws = np.concatenate([u.batch.weights[k] for u, k in zip(fresh, keep, strict=True)])
        ws = ws / total
        loss, grad = weighted_loss_grad(self.model, self._shaped(xs), ys, ws, self.loss_fn)
        with_delta = [u for u in fresh if u.delta is not None]
        if with_delta:
            deltas = clip_norms([cast(np.ndarray, u.delta) for u in with_delta],
                                self.cfg.clip_norm)
            rule = robust_rule(self.cfg.robust_aggregation)
            if rule == "mean":
                for u, d in zip(with_delta, deltas, strict=True):
                    grad += (u.candidates / total) * d
            else:  # robust: one vote per client, scaled by the clients' share of candidates
                share = sum(u.candidates for u in with_delta) / total
                grad += np.float32(share) * aggregate(deltas, [1.0] * len(deltas), rule,
                                                      self.cfg.trim_fraction)
        return loss / max(float(ws.sum()), 1e-12), grad

    def _train_steps(self, server_round: int, fresh: list[Upload]) -> float:
        """The round's steps: the fresh compensated step, then steps on the store.

        A round runs its store steps whatever replies it got (a round with nothing to ask,
        or whose only asked node failed, still trains on what the store holds).
        """
        rng = round_rng(self.seed, server_round, 0, Purpose.SERVER_BATCHES)
        self.model.train()
        losses = []
        steps = self.cfg.server_steps
        if sum(len(u.batch) for u in fresh):
            loss, grad = self.fresh_gradient(fresh)
            losses.append(loss)
            apply_flat_grad(self.model, self.optimizer, grad)
            steps -= 1
        losses += self._store_steps(server_round, steps, rng)
        return float(np.mean(losses)) if losses else float("nan")

    def _train_adaptive(self, server_round: int, fresh: list[Upload],
                        stored_before: int) -> float:
        """Train to a plateau when the store grew, then let the schedule size the next ask.

        The phase's first evaluation scores the model the previous phase left (or the
        initial one) on the current held-out rows; the gain of the phase's best model over
        it on the rows held out of this round's uploads is the paired gain the schedule
        needs (none for the first upload round). A negative gain keeps the previous model.
        """
        assert self.schedule is not None
        self.last_phase = None
        if (self.store is None or not any(len(u.batch) for u in fresh)
                or self.store.num_train == 0):  # nothing new (a full store still changes)
            return float("nan")
        rng = round_rng(self.seed, server_round, 0, Purpose.SERVER_BATCHES)
        self._round_ids = {u.node: u.batch.ids for u in fresh if len(u.batch)}
        first = self._fresh_training_step(fresh)
        start = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        self.model.train()
        phase = train_phase(self.model, self.optimizer, self.cfg.lr, self.plateau,
                            lambda: self._store_step(rng, first), self._score_holdout)
        self.last_phase = phase
        assert phase.final is not None and phase.initial is not None
        gain = None
        self.reverted = False
        if stored_before > 0:
            gain = paired_gain(phase.initial, phase.final)
            if gain.gain < 0:  # worse than before on the rows it brought: keep the old model
                self.model.load_state_dict(start)
                self.reverted = True
        self.schedule.after_upload(stored_before, self.stored, gain)
        self.node_fit = (phase.initial if self.reverted else phase.final).node_loss()
        return float(np.mean(phase.losses)) if phase.losses else float("nan")

    def _fresh_training_step(self, fresh: list[Upload]) -> list[tuple[float, np.ndarray]]:
        """The compensated step on the fresh rows as a one-item queue (empty if none).

        Held-out rows stay out of it; only a run with compensation gains from it.
        """
        if self.comp_codec is None or not any(u.delta is not None for u in fresh):
            return []
        return [self.fresh_gradient(fresh)]

    def _store_step(self, rng: np.random.Generator,
                    queued: list[tuple[float, np.ndarray]]) -> float:
        """One optimizer step: a queued gradient first, then minibatches of the store."""
        if queued:
            loss, grad = queued.pop()
            apply_flat_grad(self.model, self.optimizer, grad)
            return loss
        return self._store_steps(0, 1, rng)[0]

    def _score_holdout(self) -> HeldOutScores:
        """Per-row loss and correctness of the model on the store's held-out rows."""
        assert self.store is not None
        losses, correct, nodes, fresh = [], [], [], []
        for x, y, _, node_ids, ids in self.store.holdout_batches():
            loss, hit = per_sample_results(self.model, self._shaped(x), y, self.loss_fn)
            losses.append(loss)
            nodes.append(node_ids)
            fresh.append(self._fresh_rows(node_ids, ids))
            if hit is not None:
                correct.append(hit)
        if not losses:
            return HeldOutScores(np.zeros(0), None, np.zeros(0, dtype=np.uint64))
        return HeldOutScores(np.concatenate(losses),
                             np.concatenate(correct) if correct else None,
                             np.concatenate(nodes), np.concatenate(fresh))

    def _fresh_rows(self, node_ids: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """Which of these rows came with this round's uploads."""
        mask = np.zeros(ids.size, dtype=bool)
        for node, new_ids in self._round_ids.items():
            here = node_ids == np.uint64(node)
            mask[here] = np.isin(ids[here], new_ids)
        return mask

    def _schedule_metrics(self, stored_before: int) -> dict[str, MetricRecordValues]:
        """The adaptive schedule's round metrics (steps, held-out score, gain, next ask)."""
        assert self.schedule is not None  # the store is None until a spec is adopted
        phase = self.last_phase
        out: dict[str, MetricRecordValues] = {
            "server-steps": 0 if phase is None else phase.steps,
            "reverted": int(self.reverted and phase is not None),
            "holdout-rows": 0 if self.store is None else int(self.store.holdout_mask.sum()),
            "next-ask": int(self.schedule.next_total or 0),
            # 0: asking; 1: stopped, the learning curve is flat; 2: every node exhausted
            "schedule-done": (0 if not self.schedule.done
                              else 2 if self.schedule.reason == "exhausted" else 1),
        }
        if phase is not None and phase.final is not None and phase.final.loss.size:
            out["holdout-loss"] = float(phase.final.loss.mean())
            if phase.final.correct is not None:
                out["holdout-acc"] = float(phase.final.correct.mean())
        point = self.schedule.curve[-1] if phase is not None and self.schedule.curve else {}
        if "gain" in point:
            out["upload-gain"] = float(point["gain"])
            out["upload-gain-stderr"] = float(point["stderr"])
        return out

    @staticmethod
    def _schedule_text(metrics: dict[str, Any]) -> str:
        if "next-ask" not in metrics:
            return ""
        text = f", {metrics['server-steps']} server steps"
        if "holdout-acc" in metrics:
            text += f", held-out accuracy {float(metrics['holdout-acc']):.4f}"
        if "upload-gain" in metrics:
            text += f", gain {float(metrics['upload-gain']):+.4f}"
        if metrics.get("reverted"):
            text += " (worse on its new held-out rows: the previous model is kept)"
        if metrics["schedule-done"] == 2:
            return text + "; every node has uploaded all its samples"
        if metrics["schedule-done"]:
            return text + "; the learning curve is flat: no more uploads"
        return text + f"; next ask {metrics['next-ask']} samples"

    def _store_steps(self, server_round: int, steps: int,
                     rng: np.random.Generator | None = None) -> list[float]:
        """``steps`` optimizer steps on minibatches from the store; their losses."""
        if rng is None:
            rng = round_rng(self.seed, server_round, 0, Purpose.SERVER_BATCHES)
        if self.store is None or len(self.store) == 0:
            return []
        self.model.train()
        losses = []
        correction = self.cv.value() if self.cv else None
        for _ in range(steps):
            x, y, w = self.store.draw(self.cfg.server_batch_size, rng)
            xb = self._shaped(x)
            if self.augment is not None:
                xb = self.augment(torch.from_numpy(np.ascontiguousarray(xb))).numpy()
            loss, grad = weighted_loss_grad(self.model, xb, y, w / w.sum(), self.loss_fn)
            if correction is not None:  # the control variate: see dq.control_variate
                grad += correction
            losses.append(loss)
            apply_flat_grad(self.model, self.optimizer, grad)
        return losses

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        """Everything to resume: model, optimizer, spec, ranges, store, planner, schedule."""
        spec = None if self.spec is None else dataclasses.asdict(self.spec)
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "spec": spec, "num_classes": self.num_classes,
                "ranges": {int(k): (lo.copy(), span.copy())
                           for k, (lo, span) in self.ranges.items()},
                "store": None if self.store is None else self.store.state(),
                "planner": self.planner.state(), "norms": self.norms.state(),
                "refresh_norms": self.refresh_norms.state_dict(),
                "comp_norms": self.comp_norms.state_dict(),
                "value_bound": self.value_bound, "rolled_back": self.rolled_back,
                "provisional": dict(self._provisional),
                "control_variate": None if self.cv is None else self.cv.state(),
                "schedule": None if self.schedule is None else self.schedule.state(),
                "node_fit": dict(self.node_fit),
                # per-client state above is keyed by client identity, not node id
                "identities": self.identities.state()}

    def load_state_dict(self, state: dict) -> None:
        """Inverse of :meth:`state_dict`."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.num_classes = state.get("num_classes", self.num_classes)
        if state.get("spec") is not None:
            spec = state["spec"]
            self._fix_spec(DataSpec(tuple(spec["sample_shape"]), spec["target"],
                                    int(spec["target_dim"])))
        self.ranges = {int(k): (np.asarray(lo), np.asarray(span))
                       for k, (lo, span) in state.get("ranges", {}).items()}
        if self.store is not None and state.get("store") is not None:
            self.store.load_state(state["store"])
        if "planner" in state:
            self.planner.load_state(state["planner"])
        self.norms.load_state(state.get("norms", []))
        self.refresh_norms.load_state_dict(state.get("refresh_norms", {}))
        self.comp_norms.load_state_dict(state.get("comp_norms", {}))
        self.value_bound = state.get("value_bound", self.value_bound)
        self._provisional = {"spec": False, "bound": False, **state.get("provisional", {})}
        self.rolled_back = int(state.get("rolled_back", 0))
        if self.cv is not None and state.get("control_variate") is not None:
            self.cv.load_state(state["control_variate"])
        if self.schedule is not None and state.get("schedule") is not None:
            self.schedule.load_state(state["schedule"])
        self.node_fit = {int(k): float(v) for k, v in state.get("node_fit", {}).items()}
        self.identities.load_state(state.get("identities"))
        if "identities" not in state and state.get("store") is not None:
            log_round("dq", 0, "a checkpoint from before client identities: its rows stay "
                      "under the node ids of that run, and clients may upload them again")
        self._returned = None
