"""Distributed SGD with compressed uploads: the gradient-compression baselines.

Each client replies with its coded gradient (or local-step pseudo-gradient); the server
validates, decodes, aggregates (weighted mean or majority vote) and steps its optimizer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from dq_flower.baselines.config import GradientConfig
from dq_flower.baselines.votes import VoteDownlink
from dq_flower.codecs import Payload, make
from dq_flower.config import StrategyConfig, build_config, changed_knobs, client_keys, write
from dq_flower.model_ops import (
    LossFn,
    apply_flat_grad,
    float_buffers,
    get_flat,
    num_params,
    set_flat,
    set_float_buffers,
)
from dq_flower.seeding import Purpose, round_rng
from dq_flower.server.base import ModelStrategy, strategy_kwargs
from dq_flower.server.common import (
    FedAvgArgs,
    decay_groups,
    log_round,
    make_optimizer,
    sample_node_ids,
)
from dq_flower.server.majority import bounded_mean, robust_buffers
from dq_flower.server.pipeline import FailureWatch, ServerRound, UpdateFigures
from dq_flower.server.robust import StepGuard, UpdateScreens, weighted_mean
from dq_flower.server.robust import aggregate as robust_aggregate
from dq_flower.wire.gradient import (
    model_crc,
    sign_step,
    trainable_mask,
    update_keys,
    uses_error_feedback,
    vote_from_payload,
)
from dq_flower.wire.gradient_reply import GradientDecoder, GradientUpdate
from dq_flower.wire.model_buffers import BUFFERS_KEY, buffers_record

__all__ = ["GradientStrategy", "majority_vote", "weighted_mean"]

#: Most rows a client may claim per epoch under ``local-epochs`` (``num-examples`` is rows
#: times epochs); a larger claim is refused rather than weighted in the mean.
MAX_EPOCH_ROWS = 1 << 24
#: The knobs that travel to the clients in each train message.
CLIENT_KEYS = client_keys(GradientConfig)


def majority_vote(vectors: list[np.ndarray], rng: np.random.Generator) -> np.ndarray:
    """``sign(sum_k sign(v_k))`` as +-1 float32, one vote per client; ties: a seeded coin."""
    total = np.zeros(vectors[0].size, dtype=np.int64)
    for v in vectors:
        total += np.sign(v).astype(np.int64)
    vote = np.sign(total).astype(np.float32)
    ties = vote == 0
    if ties.any():
        vote[ties] = rng.choice(np.array([-1.0, 1.0], dtype=np.float32), size=int(ties.sum()))
    return vote


@dataclass
class _Kept:
    """A gradient round's updates after :meth:`GradientStrategy.bound`."""

    updates: list[GradientUpdate]
    misaligned: list[int]  # nodes left out of the mean for their direction
    figures: UpdateFigures


class GradientStrategy(ModelStrategy, UpdateScreens, Strategy):
    """Distributed SGD whose clients upload compressed gradients (or local-step deltas).

    Parameters
    ----------
    model : torch.nn.Module
        What the server steps with the decoded updates, in place; ``start`` first loads
        ``initial_arrays`` into it.
    codec : str
        Upload codec: ``identity``, ``fp16``, ``qsgd``, ``terngrad``, ``sign`` (majority
        vote), ``ef-sign``, ``topk``, ``powersgd``, ``bingrad`` or ``orq``.
    codec_params : dict or str, optional
        The codec's parameters (``{"levels": 4}`` or ``"levels=4,bucket=512"``).
    local_steps : int
        tau: local SGD steps per round (1: the client sends its minibatch gradient).
    lr : float, optional
        Server learning rate (default 0.1; with majority vote, the sign step's size).
    seed : int
        Root of every random choice.
    fraction_train, min_available_nodes, fraction_evaluate, min_evaluate_nodes
        As in :class:`dq_flower.DQStrategy`; a round updates the model only when at least
        ``min(min_available_nodes, sampled)`` valid replies arrive. FedAvg's other
        arguments too (:class:`~dq_flower.server.common.FedAvgArgs`).
    loss_fn : callable, optional
        Unused by the server (the clients compute the gradients); accepted for symmetry.
    config : GradientConfig, optional
        All knobs; the keyword arguments above and ``**knobs`` override it.
    method : str
        Name written into the messages' config (``qsgd``, ``signsgd``, ...).
    """

    #: The clients' weighted training loss is ClientApp-side; every other figure the server's.
    client_metric_keys = ("train-loss",)

    def __init__(self, model: torch.nn.Module, codec: str | None = None, *,
                 codec_params: dict[str, Any] | str | None = None,
                 local_steps: int | None = None, lr: float | None = None, seed: int = 0,
                 fraction_train: float = 1.0, min_available_nodes: int = 1,
                 fraction_evaluate: float = 0.0, min_evaluate_nodes: int = 1,
                 loss_fn: LossFn | None = None, config: GradientConfig | None = None,
                 method: str | None = None, **knobs: Any) -> None:
        self._setup(model, StrategyConfig(
            seed=seed, fraction_train=fraction_train, min_available_nodes=min_available_nodes,
            fraction_evaluate=fraction_evaluate, min_evaluate_nodes=min_evaluate_nodes),
            FedAvgArgs.pop(knobs, type(self).__init__))
        if codec is None and config is None:
            codec = "qsgd"
        self.cfg: GradientConfig = build_config(
            config, GradientConfig, knobs, codec=codec, codec_params=codec_params,
            local_steps=local_steps, lr=lr)
        config = self.cfg
        self.loss_fn = loss_fn
        self.method = method or config.codec
        self.codec = config.make_codec()
        self.dim = num_params(model)
        self.sizes = [p.numel() for p in model.parameters()]
        self.optimizer = (make_optimizer(config.optimizer, decay_groups(model, config.weight_decay),
                                         config.lr, config.momentum, config.weight_decay)
                          if not config.majority else None)
        self.downlink = VoteDownlink(self.dim)
        self.sent_payload_bits: dict[int, int] = {}
        self.failures = FailureWatch(config.max_failed_rounds, self.method)
        self._screens(config)
        self.guard = StepGuard(model, self.optimizer)
        self.rolled_back = 0
        self.decode = GradientDecoder(
            update_keys(config, len(self.sizes)),
            self.sizes if config.segmented else [self.dim], self.codec,
            max_examples=(config.epochs * MAX_EPOCH_ROWS if config.epochs_mode
                          else config.batch_size * config.local_steps),
            epochs=config.epochs,
            batch_size=config.batch_size, local_steps=config.local_steps,
            buffer_shapes={k: v.shape for k, v in float_buffers(model).items()})

    @property
    def version(self) -> int:
        """Model updates applied so far."""
        return self.downlink.version

    # ------------------------------------------------------------------ Strategy API
    def summary(self) -> None:
        """Log the configuration."""
        ef = uses_error_feedback(self.cfg, self.codec)
        log_round(self.method, 0, f"codec {self.codec}, error feedback {ef}, knobs: "
                  f"{changed_knobs(self.cfg)}")

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """Send every sampled node the round config and the model (or the votes it lacks)."""
        self._load_arrays(arrays)
        nodes = sample_node_ids(grid, self.fraction_train, self.min_available_nodes,
                                round_rng(self.seed, server_round, 0, Purpose.SAMPLE),
                                min_sampled=self.fedavg.min_train_nodes)
        base = ConfigRecord(dict(config.items()))
        base.update(write(self.cfg, changed_only=True, keys=CLIENT_KEYS))
        base.setdefault("method", self.method)
        base["server-round"] = server_round
        base["run-seed"] = self.seed  # clients draw batches from (run seed, round, node)
        w = get_flat(self.model)
        sign = self.cfg.downlink_mode == "sign"
        if sign:
            base["model-version"] = self.version
            base["model-crc"] = model_crc(w)
        payload = make("fp16" if self.cfg.downlink_mode == "fp16" else "identity",
                       entropy=self.cfg.entropy_coder).encode(w)  # the downlink model
        full, full_bits = payload.to_record(), int(payload.nbits)
        buffers = float_buffers(self.model)  # BatchNorm statistics travel as they are
        record = buffers_record(buffers) if buffers else None
        messages, bits = [], 0
        for node in nodes:
            cfg = ConfigRecord(dict(base.items()))
            content = RecordDict({"config": cfg})
            held, nbits = self.downlink.fill(node, content, full, full_bits, sign)
            if record is not None:
                content[BUFFERS_KEY] = record
                nbits += 32 * sum(v.size for v in buffers.values())
            if held is not None:
                cfg["base-version"] = held
            bits += nbits
            messages.append(Message(content=content, message_type=MessageType.TRAIN,
                                    dst_node_id=node))
        self.sent_payload_bits[server_round] = bits
        return self.ledger.record(server_round, messages)

    def decode_reply(self, rnd: ServerRound, msg: Message) -> GradientUpdate:
        """One reply's coded update, decoded and checked."""
        return self.decode(msg)

    def observe_failures(self, rnd: ServerRound) -> None:
        """Count the round towards ``max-failed-rounds``."""
        self.failures.observe(rnd.screened.replies, rnd.screened.silent)

    def bound(self, rnd: ServerRound) -> _Kept:
        """Norm screen, clip, direction screen, weight cap (not under majority), partition order."""
        screened = rnd.screened
        updates = sorted(screened.accepted, key=lambda u: (u.partition, u.node))
        figures = UpdateFigures.decoded(screened, updates)
        misaligned: list[int] = []
        if updates and not self.cfg.majority:
            used, bounded = self._bound(
                screened, updates, [u.vector for u in updates], [u.weight for u in updates],
                [u.node for u in updates], clip_factor=self.cfg.clip_factor,
                clip_norm=self.cfg.clip_norm, weight_cap=self.cfg.weight_cap)
            misaligned = bounded.misaligned
            updates = [GradientUpdate(u.node, v, w, u.loss, u.payload_bits, u.raw_bits,
                                      u.steps, u.partition, u.buffers)
                       for u, v, w in zip(used, bounded.vectors, bounded.weights, strict=True)]
        return _Kept(updates, misaligned, figures)

    def aggregate_and_step(
        self, rnd: ServerRound, kept: _Kept
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Aggregate the kept updates and step the optimizer, given a quorum of them."""
        sent, screened, updates = rnd.sent, rnd.screened, kept.updates
        quorum = min(self.min_available_nodes,
                     len(sent) if sent is not None else self.min_available_nodes)
        ok = {u.node for u in updates} | set(kept.misaligned)
        for node in (sent or {}):
            self.downlink.replied(node, node in ok)
        stepped = bool(updates) and len(updates) >= quorum
        if stepped:
            stepped = self._guarded_step(rnd.number, updates)
        if stepped and updates[0].buffers is not None:  # statistics bounded by the majority
            set_float_buffers(self.model, robust_buffers(
                [u.buffers for u in updates if u.buffers is not None],
                [u.weight for u in updates if u.buffers is not None],
                float_buffers(self.model)))
        losses = [u.loss for u in updates]
        figures = kept.figures
        figures.down_payload_bits = int(self.sent_payload_bits.pop(rnd.number, 0))
        figures.close(screened, len(updates) + len(kept.misaligned))
        metrics = figures.metrics()
        metrics.update({
            # each loss bounded by the others' (no one node sets the round's figure)
            "train-loss": bounded_mean(losses, [u.weight for u in updates]),
            "misaligned": len(kept.misaligned),
            "stepped": int(stepped),
            "rolled-back": self.rolled_back,
        })
        figures.log(self.method, rnd.number, f"{figures.replies} replies", len(kept.misaligned))
        return self._return_arrays(), MetricRecord(metrics)

    @classmethod
    def from_run_config(cls, model: torch.nn.Module, run_config: Mapping[str, Any],
                        *, app_keys: Iterable[str] = (), **overrides: Any) -> GradientStrategy:
        """The strategy with its knobs read from a run config (``context.run_config``).

        Every :class:`GradientConfig` and :class:`~dq_flower.config.StrategyConfig` field by
        its hyphenated key (``codec`` defaults to ``qsgd``), ``overrides`` winning
        (:func:`dq_flower.server.base.strategy_kwargs`); unknown keys (but ``num-server-rounds``
        and ``app_keys``) and wrongly typed values raise ``ValueError`` naming the key.
        """
        return cls(model, **strategy_kwargs(
            cls.__name__, GradientConfig, run_config, overrides, args_cls=StrategyConfig,
            defaults={"codec": "qsgd"}, app_keys=app_keys))

    # ------------------------------------------------------------------ internals
    def _guarded_step(self, server_round: int, updates: list[GradientUpdate]) -> bool:
        """Aggregate and step; roll the step back if it left the model non-finite."""
        vectors = [u.vector for u in updates]
        if self.cfg.epochs_mode:  # screened as pseudo-gradients, averaged as model deltas
            vectors = [v * np.float32(self.cfg.client_lr * u.steps)
                       for v, u in zip(vectors, updates, strict=True)]
        self.guard.begin()
        self.apply(server_round, vectors, [u.weight for u in updates])
        if self.guard.finite_or_restore():
            return True
        self.rolled_back += 1
        log_round(self.method, server_round, "the step made the model non-finite: rolled "
                  f"back; replies came from nodes {sorted(u.node for u in updates)}")
        return False

    def aggregate(self, server_round: int, vectors: list[np.ndarray],
                  weights: list[float]) -> np.ndarray:
        """Combine bounded updates: weighted mean, a robust rule, or the majority vote."""
        if self.cfg.majority:
            return majority_vote(vectors, round_rng(self.seed, server_round, 0, Purpose.TIES))
        rule = "mean" if self.cfg.aggregation == "auto" else self.cfg.aggregation
        return robust_aggregate(vectors, weights, rule, self.cfg.trim_fraction)

    def apply(self, server_round: int, vectors: list[np.ndarray], weights: list[float]) -> None:
        """Aggregate and take one server step (advances the model version)."""
        agg = self.aggregate(server_round, vectors, weights)
        if self.cfg.majority:
            record = make("sign").encode(agg).to_record()
            vote = vote_from_payload(Payload.from_record(record))  # exactly what clients see
            set_flat(self.model, sign_step(get_flat(self.model), vote, self.cfg.lr,
                                           self.cfg.weight_decay, trainable_mask(self.model)))
            self.downlink.applied(record if self.cfg.downlink_mode == "sign" else None)
            return
        assert self.optimizer is not None
        apply_flat_grad(self.model, self.optimizer, agg)
        self.downlink.applied(None)

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        """Everything needed to resume: model, optimizer, downlink, norm screen, rollbacks."""
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict() if self.optimizer is not None else None,
            **self.downlink.state_dict(),
            **self._screens_state(),
            "rolled_back": self.rolled_back,
        }

    def load_state_dict(self, state: dict) -> None:
        """Inverse of :meth:`state_dict`."""
        self.model.load_state_dict(state["model"])
        if self.optimizer is not None and state["optimizer"] is not None:
            self.optimizer.load_state_dict(state["optimizer"])
        self.downlink.load_state_dict(state)
        self.norms.load_state_dict(state.get("norms", {}))
        self.directions.load_state_dict(state.get("directions", {}))
        self.rolled_back = int(state.get("rolled_back", 0))
        self._returned = None
