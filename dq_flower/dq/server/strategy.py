"""The data-quantization strategy, for any ``nn.Module`` and any client data.

Each round the clients reply with quantized samples (and optionally a compensation); the
server checks and stores them and takes ``server-steps`` optimizer steps, the first on the
fresh batch plus the compensation (the true-data gradient when the compensation codec is
lossless), the others on store minibatches. With ``upload-mode`` ``gradient`` or ``auto``
a round may instead ask for coded minibatch gradients (:mod:`.planner`). The strategy
wires its parts (asks, intake, compensations, trainer, gradient rounds, round metrics)
behind Flower's ``Strategy`` interface.

Gradient rounds are checked and combined by :mod:`.gradient_rounds`; a round's metrics
are read off the parts by :mod:`.round_metrics`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from dq_flower.codecs import make
from dq_flower.config import build_config, changed_knobs
from dq_flower.dq.config import DQConfig, DQStrategyConfig, model_codec
from dq_flower.dq.server.asks import RoundAsks
from dq_flower.dq.server.bit_width import BitWidth, auto_width
from dq_flower.dq.server.control_variate import ControlVariate
from dq_flower.dq.server.federation import Asked, ClientIdentities, FederationData, reply_claims
from dq_flower.dq.server.gradient_rounds import Combined, GradientRounds
from dq_flower.dq.server.intake import Compensations, UploadIntake
from dq_flower.dq.server.planner import RoundPlan, UploadPlanner, gradient_estimate
from dq_flower.dq.server.round_metrics import Metrics, RoundMetrics
from dq_flower.dq.server.run_key import (
    SECRET_ENV,
    holdout_digest,
    holdout_key,
    refuse_other_run,
    stored_layout,
)
from dq_flower.dq.server.store import SampleStore
from dq_flower.dq.server.train_config import apply_train_config
from dq_flower.dq.server.training import ServerTrainer
from dq_flower.dq.server.validation import BY_PARTITION, Rules, Upload
from dq_flower.losses import TargetLoss, per_sample
from dq_flower.model_ops import LossFn
from dq_flower.seeding import Purpose, round_rng
from dq_flower.server.base import ModelStrategy, strategy_kwargs
from dq_flower.server.common import (
    FedAvgArgs,
    decay_groups,
    log_rejected,
    log_round,
    make_optimizer,
    sample_node_ids,
)
from dq_flower.server.pipeline import FailureWatch, RoundLedger, ServerRound
from dq_flower.wire.dq_batch import DataSpec
from dq_flower.wire.gradient_reply import GradientUpdate
from dq_flower.wire.model import model_record
from dq_flower.wire.targets import LABEL_BASE_KEY

__all__ = ["DQStrategy", "holdout_key", "SECRET_ENV"]


#: Largest compensation norm, in norms of the gradient the server computes on the reply's
#: own quantized rows (or the round's median one, if larger). Measured on honest digits
#: replies (logreg and MLP, 1 to 4 bits): at most 0.43.
DELTA_SCALE = 100.0

@dataclass(frozen=True)
class _Round:
    """What a DQ round takes before its replies are decoded: its plan and the asks."""

    plan: RoundPlan | None  # None: the round was not configured here
    asked: Asked  # the rows each reply may carry
    rules: Rules  # what each data reply is checked against (the same for all of them)
    gradient: bool  # whether the round asked for coded gradients


@dataclass
class _Checked:
    """A data round's uploads after :meth:`DQStrategy.bound`, and the replies rejected."""

    uploads: list[Upload]
    rejected: int


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
        :class:`~dq_flower.server.evaluation.FederatedEvaluation`. FedAvg's other
        arguments: :class:`~dq_flower.server.common.FedAvgArgs`.
    num_classes : int, optional
        Classes of integer targets; default: the width of the model's output.
    data_spec : DataSpec, optional
        Sample shape and target kind; default: what most of the first data round's
        replies carry, if the model trains on it.
    config : DQConfig, optional
        The method's knobs; ``**knobs`` (underscore names, e.g. ``bits=2``) override it.
        ``optimizer`` may also be the user's own ``torch.optim.Optimizer`` over the model's
        parameters: the server then trains with it (its step size the base of the
        plateau's drops), no probe.
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
        holdout_secret: str | None = None,
        **knobs: Any,
    ) -> None:
        args = DQStrategyConfig(
            seed=seed, fraction_train=fraction_train, min_available_nodes=min_available_nodes,
            fraction_evaluate=fraction_evaluate, min_evaluate_nodes=min_evaluate_nodes,
            num_classes=num_classes)
        self._setup(model, args, FedAvgArgs.pop(knobs, type(self).__init__))
        users = knobs.pop("optimizer", None) if isinstance(
            knobs.get("optimizer"), torch.optim.Optimizer) else None
        cfg = build_config(config, DQConfig, knobs)
        cfg, bits_note = auto_width(cfg, model, data_spec)  # bits = 0: resolved, noted
        self.cfg: DQConfig = cfg
        optimizer = users or make_optimizer(  # ``auto``: SGD until a training phase chooses
            "sgd" if cfg.optimizer == "auto" else cfg.optimizer,
            decay_groups(model, cfg.weight_decay), cfg.lr, cfg.momentum, cfg.weight_decay)
        comp_codec = (make(cfg.compensation, **cfg.compensation_kwargs)
                      if cfg.compensation != "none" else None)
        grad_codec = (make(cfg.gradient_codec, **cfg.gradient_codec_kwargs)
                      if cfg.upload_mode != "data" else None)
        self.num_params = sum(p.numel() for p in model.parameters())
        #: what the server knows of the federation's data: spec, store, value bound, counts
        self.data = FederationData(num_classes=args.num_classes,
                                   value_bound=float(cfg.max_abs_value) or None)
        self.planner = UploadPlanner(  # sample and reply bits: estimated once a spec is known
            cfg.upload_mode, cfg.budget, cfg.resend, sample_bits=0.0, reply_bits=0.0,
            gradient_bits=0.0 if grad_codec is None
            else gradient_estimate(grad_codec, self.num_params, seed), data=self.data)
        self.failures = FailureWatch(cfg.max_failed_rounds, "dq")
        self.ledger = RoundLedger()
        #: which client (identity) each node id is; everything per client is keyed by it
        self.identities = ClientIdentities(permanent=cfg.identity_binding == "node")
        key = holdout_key(self.seed, holdout_secret)
        #: digest of the held-out key, checked on resume (another key holds out other rows)
        self._holdout_check = holdout_digest(key)
        loss_fn = TargetLoss(per_sample(loss_fn) if loss_fn is not None else None)
        self.intake = UploadIntake(cfg, model, self.data, loss_fn=loss_fn, seed=self.seed,
                                   holdout_key=key, planner=self.planner,
                                   identities=self.identities, comp_codec=comp_codec,
                                   num_params=self.num_params, measuring=cfg.upload_mode != "data")
        self.intake.bits_note = bits_note
        self.widths = BitWidth(auto=bits_note is not None)  # raised where nodes report a gap
        self.compensations = Compensations(cfg, self.num_params, self.data)
        self.trainer = ServerTrainer(cfg, model, optimizer, self.data, self.cv,
                                     loss_fn=loss_fn, seed=self.seed, comp_codec=comp_codec,
                                     augment=augment)
        if users is not None:
            self.trainer.use_users(users)
        self.asks = RoundAsks(cfg, self.planner, self.identities, self.data, model,
                              self.trainer, self.seed)
        self.metrics = RoundMetrics(cfg, self.data, self.asks, self.trainer)
        self.gradients = GradientRounds(cfg, grad_codec, intake=self.intake,
                                        trainer=self.trainer, metrics=self.metrics)
        self._configured = 0  # the round last configured
        if data_spec is not None:
            self.intake.fix_spec(data_spec)

    # ------------------------------------------------------------------ what it learned
    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The server's optimizer (``optimizer = "auto"``: replaced once it is chosen)."""
        return self.trainer.optimizer

    @property
    def spec(self) -> DataSpec | None:
        """The federation's data spec (``None`` until given or agreed)."""
        return self.data.spec

    @property
    def store(self) -> SampleStore | None:
        """The store of uploaded rows (``None`` until a data spec is adopted)."""
        return self.data.store

    @property
    def num_classes(self) -> int | None:
        """Classes of integer targets (given, or read off the model once a spec is)."""
        return self.data.num_classes

    @property
    def mode(self) -> str:
        """The range mode of the uploads: ``sample``, ``channel`` or ``feature``."""
        return self.data.mode

    @property
    def ranges(self) -> dict[int, tuple[np.ndarray, ...]]:
        """Each client's feature ranges ``(lo, span[, scale])`` (``ranges`` ``feature``)."""
        return self.data.ranges

    @property
    def value_bound(self) -> float | None:
        """The largest absolute value an upload may decode to (``None``: not yet known)."""
        return self.data.value_bound

    @property
    def cv(self) -> ControlVariate | None:
        """The control variate of the store steps (``None`` with ``first-step``)."""
        return self.compensations.cv

    @property
    def stored(self) -> int:
        """Samples in the store."""
        return self.data.stored

    # ------------------------------------------------------------------ Strategy API
    @classmethod
    def from_run_config(cls, model: torch.nn.Module, run_config: Mapping[str, Any],
                        *, app_keys: Iterable[str] = (), **overrides: Any) -> DQStrategy:
        """The strategy with its knobs read from a run config (``context.run_config``).

        Every :class:`DQConfig` and :class:`~dq_flower.dq.config.DQStrategyConfig` field
        (``seed``, ``fraction-train``, ...) is read from its hyphenated key where present and
        ``overrides`` win (:func:`dq_flower.server.base.strategy_kwargs`). Any other key but
        ``num-server-rounds`` and ``app_keys`` (the app's own), and a value of the wrong type,
        raise ``ValueError`` naming the key, before any round.
        """
        return cls(model, **strategy_kwargs(cls.__name__, DQConfig, run_config, overrides,
                                            args_cls=DQStrategyConfig, app_keys=app_keys))

    def summary(self) -> None:
        """Log the knobs that differ from their defaults (bits chosen by ``auto`` are not)."""
        cfg = dataclasses.replace(self.cfg, bits=0) if self.intake.bits_note else self.cfg
        user = self.trainer.choice if getattr(self.trainer.choice, "source", "") == "user" else None
        log_round("dq", 0, f"knobs: {changed_knobs(cfg)}"
                  + (f"; optimizer: yours, {user.describe()}" if user else ""))

    def evaluate_config(self) -> dict[str, int]:
        """What the nodes' evaluation reads its labels by: counted from 1, where they are."""
        return {LABEL_BASE_KEY: self.data.label_base} if self.data.label_base else {}

    @property
    def finished(self) -> bool:
        """No more asks (exhausted or flat, ``probe-after`` 0) nor phases on the rows stored."""
        return self.trainer.finished

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Send the sampled nodes the round config, asks and held sets (see :mod:`.asks`)."""
        self._load_arrays(arrays)
        self.widths.review(self, server_round)  # the last data round's reports of raw rows
        if not self._configured:  # the run's train_config: its optimizer and step size
            apply_train_config(self.trainer, config)
        self.identities.observe(grid.get_node_ids())
        nodes = sample_node_ids(grid, self.fraction_train, self.min_available_nodes,
                                round_rng(self.seed, server_round, 0, Purpose.SAMPLE),
                                min_sampled=self.fedavg.min_train_nodes,
                                prefer=(self.asks.worth_asking
                                                       if self.cfg.upload_mode == "data"
                                                       else None))
        nodes = [n for n in nodes if not self.asks.resting(n, server_round)] or nodes
        self._configured = server_round
        self.metrics.num_rounds = self.num_rounds  # FedAvg's uplink over the run
        rounds_left = (self.num_rounds - server_round + 1) if self.num_rounds else 1
        clients, plan = self.asks.plan(server_round, nodes, max(rounds_left, 1))
        refresh = self.asks.refresh_round(server_round)
        cfg = self.asks.round_config(server_round, config, plan, refresh)
        nodes, table = self.asks.round_asks(server_round, nodes, clients, plan, refresh)
        codec = model_codec(self.cfg.model_precision, plan.mode, self.cfg.compensation)
        messages = self.asks.messages(server_round, nodes, clients, plan, table, cfg,
                                      lambda: model_record(self.model, codec=codec))
        return self.ledger.record(server_round, self.widths.ask(self, messages))

    def begin_round(self, server_round: int, replies: list[Message]) -> _Round:
        """Take the round's plan (data or gradient) and what each node was asked.

        Every reply's identity claim is read before any reply is checked (:meth:`.prescan`).
        """
        self.identities.prescan(server_round, reply_claims(replies))
        plan = self.asks.plans.pop(server_round, None)
        asked = self.asks.asked.pop(server_round, None) or Asked(budget=self.cfg.budget)
        return _Round(plan, asked, self.intake.rules(), getattr(plan, "mode", "") == "gradient")

    def decode_reply(self, rnd: ServerRound[_Round], msg: Message) -> Upload | GradientUpdate:
        """One reply checked and decoded: a coded gradient, or samples under its identity."""
        if rnd.plan.gradient:
            return self.gradients.validate(msg, self._configured)
        return self.intake.validate_reply(msg, rnd.number, rnd.plan.asked, rnd.plan.rules)

    def observe_failures(self, rnd: ServerRound[_Round]) -> None:
        """Count the round to ``max-failed-rounds`` while nothing is stored; note who failed."""
        screened = rnd.screened
        self.data.note_asks(rnd.number, set(), screened.failed_nodes)
        self.failures.observe(screened.replies, screened.silent, counts=self.stored == 0)

    def bound(self, rnd: ServerRound[_Round]) -> Combined | _Checked:
        """Gradients bounded and combined, or uploads checked against the round's others.

        Uploads are adopted in the clients' partition order (reproducible from the seed).
        """
        screened = rnd.screened
        answered = {int(m.metadata.src_node_id) for m in screened.replies if not m.has_error()}
        if rnd.plan.gradient:
            self.data.note_asks(rnd.number, answered, [])
            return self.gradients.combine(screened, self.identities.contested(rnd.number))
        screened.keep_uncontested(attrgetter("node"), self.identities.contested(rnd.number),
                                  order=BY_PARTITION, node=attrgetter("source"))
        candidates, rejected = self.intake.adopt(screened.accepted, screened.rejected)
        fruitful = {u.source for u in candidates  # rows, or none left: else it rests
                    if len(u.batch) or 0 < u.examples <= self.data.sent.get(u.node, [0, 0])[1]}
        self.data.note_asks(rnd.number, fruitful, sorted(answered - fruitful))
        self.data.note_scorers({u.node: u.can_score for u in candidates})
        candidates, implausible = self.screen_delta_scales(candidates)
        candidates, dropped = self.compensations.screen_deltas(candidates)
        return _Checked(candidates, rejected + implausible + dropped)

    def screen_delta_scales(self, uploads: list[Upload]) -> tuple[list[Upload], int]:
        """Refuse compensations over :data:`DELTA_SCALE` times their rows' own gradient.

        A compensation is a difference of two gradients on the reply's rows; the server
        computes one of them itself (its norm floored at the round's median such norm), so
        this bound holds against a majority of hostile replies, as the round's norm screen
        does not.
        """
        if self.intake.comp_codec is None:
            return uploads, 0
        norms = self.trainer.delta_norms(uploads)
        own = [g for u, (_, g) in zip(uploads, norms, strict=True) if u.delta is not None]
        floor = float(np.median(own)) if own else 0.0
        kept = []
        for upload, (norm, grad) in zip(uploads, norms, strict=True):
            bound = DELTA_SCALE * max(grad, floor)
            if upload.delta is not None and not norm <= bound:
                log_rejected(upload.node, f"compensation norm {norm:.3g} is more than "
                             f"{DELTA_SCALE:g} times the norm {max(grad, floor):.3g} of the "
                             "gradient the server computes on the reply's own rows")
                continue
            kept.append(upload)
        return kept, len(uploads) - len(kept)

    def aggregate_and_step(
        self, rnd: ServerRound[_Round], kept: Combined | _Checked
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The gradient round's steps, or the uploads stored and trained on."""
        if isinstance(kept, Combined):
            assert rnd.plan.plan is not None  # a gradient round was planned
            metrics = self.gradients.step(rnd.number, rnd.screened, kept, rnd.plan.plan)
        else:
            metrics = self._data_round(rnd, kept)
        return self._return_arrays(), MetricRecord(metrics)

    def _data_round(self, rnd: ServerRound[_Round], kept: _Checked) -> Metrics:
        """Store the checked uploads, train; the round's metrics."""
        refreshed = self.compensations.update_control_variate(kept.uploads)
        stored_before = self.stored
        fresh, not_stored = self.intake.store_uploads(kept.uploads, rnd.number)
        self.widths.last = (rnd.number, rnd.screened.replies, kept.uploads)  # read next round
        rejected = kept.rejected + not_stored
        loss = self.trainer.train_round(rnd.number, fresh, stored_before)
        self.intake.measure_data(fresh)
        return self.metrics.data_round(
            rnd.number, rnd.plan.plan, fresh, loss=loss, rejected=rejected,
            failed=rnd.screened.failed, t0=rnd.screened.started,
            refreshed=refreshed if self.cv is not None else None,
            replies=rnd.screened.replies)

    def fresh_gradient(self, fresh: list[Upload]) -> tuple[float, np.ndarray]:
        """Gradient of the first step (see :meth:`ServerTrainer.fresh_gradient`)."""
        return self.trainer.fresh_gradient(fresh)

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        """Everything to resume: model, optimizer, spec, ranges, store, planner, schedule.

        And what a resume must share: the seed, the held-out key's digest, the rows' layout.
        """
        state = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                 **self.intake.state_dict(), "planner": self.planner.state(),
                 **self.gradients.state_dict(), **self.compensations.state_dict(),
                 **self.trainer.state_dict(), "can-score": sorted(self.data.can_score),
                 # per-client state above is keyed by client identity, not node id
                 "identities": self.identities.state(), "holdout-check": self._holdout_check,
                 "seed": self.seed, **self.widths.state(self)}
        return {**state, "layout": stored_layout(self.cfg, state["spec"])}

    def load_state_dict(self, state: dict) -> None:
        """Inverse of :meth:`state_dict`; ``ValueError`` for another seed, secret or layout."""
        self.widths.load(self, state)  # a width raised in the run: before its layout
        refuse_other_run(state, self.seed, self._holdout_check,
                         stored_layout(self.cfg, state.get("spec")))
        self.model.load_state_dict(state["model"])
        self.trainer.load_state_dict(state)  # first: it rebuilds the chosen optimizer
        self.optimizer.load_state_dict(state["optimizer"])
        self.intake.load_state_dict(state)
        if "planner" in state:
            self.planner.load_state(state["planner"])
        self.gradients.load_state_dict(state)
        self.compensations.load_state_dict(state)
        self.identities.load_state(state.get("identities"))
        self.data.can_score = {int(i) for i in state.get("can-score", [])}
        if "identities" not in state and state.get("store") is not None:
            log_round("dq", 0, "a checkpoint from before client identities: its rows stay "
                      "under the node ids of that run, and clients may upload them again")
        self._returned = None
