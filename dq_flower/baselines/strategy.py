"""Distributed SGD with compressed uploads: the gradient-compression baselines.

One message exchange per round. The server sends the model (``downlink``: float32, fp16,
or for majority vote the 1-bit votes the client lacks); each sampled client computes the
gradient of its minibatch (``local-steps`` = 1) or the mean gradient along tau local SGD
steps, encodes it with a registry codec (inside error feedback where the codec is biased)
and replies. The server validates every reply, decodes, aggregates (mean weighted by
``num-examples``, or majority vote: the sign of the sum of signs) and steps its optimizer.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

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
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from dq_flower.baselines.config import GradientConfig
from dq_flower.codecs import Payload, PayloadError, make
from dq_flower.config import build_config, strategy_kwargs, to_config_record
from dq_flower.model_ops import (
    LossFn,
    apply_flat_grad,
    get_flat,
    num_params,
    set_flat,
    state_arrays,
)
from dq_flower.protocol.gradient import (
    METRICS_KEY,
    VOTE_PREFIX,
    decode_update,
    epoch_steps,
    model_crc,
    sign_step,
    update_keys,
    uses_error_feedback,
    vote_from_payload,
)
from dq_flower.protocol.model import MODEL_KEY
from dq_flower.server.common import (
    FailureWatch,
    ModelStrategy,
    log_rejected,
    log_round,
    make_optimizer,
    round_rng,
    sample_node_ids,
)
from dq_flower.server.robust import NormScreen, StepGuard, cap_weights, clip_norms
from dq_flower.server.robust import aggregate as robust_aggregate

__all__ = ["GradientStrategy", "CompressedGradientStrategy", "majority_vote", "weighted_mean",
           "SERVER_ONLY_KEYS"]

#: Most votes a client may be behind before the server sends the float32 model instead
#: (beyond 31 one-bit votes the 32-bit model is cheaper).
MAX_VOTES_BEHIND = 31
#: ``round_rng`` purposes used by the server.
PURPOSE_SAMPLE = 1
PURPOSE_TIES = 4
#: Most rows a client may claim per epoch under ``local-epochs`` (its ``num-examples`` is
#: its rows times the epochs): an honest partition of any data set used here is far
#: smaller; a larger claim is refused rather than given that weight in the mean.
MAX_EPOCH_ROWS = 1 << 24
#: Knobs only the server uses (they do not travel to the clients).
SERVER_ONLY_KEYS = ("optimizer", "max-failed-rounds")


def weighted_mean(vectors: list[np.ndarray], weights: list[float]) -> np.ndarray:
    """``sum_k w_k v_k / sum_k w_k`` accumulated in float64, returned as float32."""
    total = float(sum(weights))
    acc = np.zeros(vectors[0].size, dtype=np.float64)
    for v, w in zip(vectors, weights, strict=True):
        acc += (float(w) / total) * v.astype(np.float64)
    return acc.astype(np.float32)


def majority_vote(vectors: list[np.ndarray], rng: np.random.Generator) -> np.ndarray:
    """``sign(sum_k sign(v_k))`` as +-1 float32; ties (a zero sum) go to a seeded coin flip.

    Every client has one vote, whatever its number of examples.
    """
    total = np.zeros(vectors[0].size, dtype=np.int64)
    for v in vectors:
        total += np.sign(v).astype(np.int64)
    vote = np.sign(total).astype(np.float32)
    ties = vote == 0
    if ties.any():
        vote[ties] = rng.choice(np.array([-1.0, 1.0], dtype=np.float32), size=int(ties.sum()))
    return vote


class GradientStrategy(ModelStrategy, Strategy):
    """Distributed SGD whose clients upload compressed gradients (or local-step deltas).

    Parameters
    ----------
    model : torch.nn.Module
        The user's model; the server trains it in place (``start`` loads
        ``initial_arrays`` into it first).
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
        ``min(min_available_nodes, sampled)`` valid replies arrive.
    loss_fn : callable, optional
        Unused by the server (the clients compute the gradients); accepted for symmetry.
    config : GradientConfig, optional
        All knobs; the keyword arguments above and ``**knobs`` override it.
    method : str
        Name written into the messages' config (``qsgd``, ``signsgd``, ...).
    """

    #: The clients' weighted training loss is ClientApp-side; every other figure the
    #: server's (reported with the ServerApp-side metrics under ``start``).
    client_metric_keys = ("train-loss",)

    def __init__(self, model: torch.nn.Module, codec: str | None = None, *,
                 codec_params: dict[str, Any] | str | None = None,
                 local_steps: int | None = None, lr: float | None = None, seed: int = 0,
                 fraction_train: float = 1.0, min_available_nodes: int = 1,
                 fraction_evaluate: float = 0.0, min_evaluate_nodes: int = 1,
                 loss_fn: LossFn | None = None, config: GradientConfig | None = None,
                 method: str | None = None, **knobs: Any) -> None:
        self._setup(model, seed=seed, fraction_train=fraction_train,
                    min_available_nodes=min_available_nodes,
                    fraction_evaluate=fraction_evaluate, min_evaluate_nodes=min_evaluate_nodes)
        if codec is None and config is None:
            codec = "qsgd"
        named: dict[str, Any] = dict(knobs)
        if codec is not None:
            named["codec"] = codec
        if codec_params is not None:
            named["codec_params"] = (codec_params if isinstance(codec_params, str) else
                                     ",".join(f"{k}={v}" for k, v in codec_params.items()))
        if local_steps is not None:
            named["local_steps"] = local_steps
        if lr is not None:
            named["lr"] = lr
        self.cfg: GradientConfig = build_config(config, named, GradientConfig)
        config = self.cfg
        self.loss_fn = loss_fn
        self.method = method or config.codec
        self.codec = config.make_codec()
        self.dim = num_params(model)
        self.sizes = [p.numel() for p in model.parameters()]
        self.optimizer = (make_optimizer(config.optimizer, model.parameters(), config.lr,
                                         config.momentum, config.weight_decay)
                          if not config.majority else None)
        self.version = 0  # model updates applied so far
        self.node_version: dict[int, int] = {}  # downlink="sign": model version a node holds
        self.votes: dict[int, ArrayRecord] = {}  # version v -> vote taking v-1 to v
        self.sent_payload_bits: dict[int, int] = {}
        self.asked: dict[int, int] = {}
        self.last_metrics: dict[str, MetricRecordValues] = {}
        self.failures = FailureWatch(config.max_failed_rounds, self.method)
        self.norms = NormScreen(config.norm_bound_factor)
        self.guard = StepGuard(model, self.optimizer)
        self.rolled_back = 0

    # ------------------------------------------------------------------ Strategy API
    def summary(self) -> None:
        """Log the configuration."""
        ef = uses_error_feedback(self.cfg, self.codec)
        log_round(self.method, 0, f"codec {self.codec}, error feedback {ef}, config {self.cfg}")

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Send every sampled node the round config and the model (or the votes it lacks)."""
        self._load_arrays(arrays)
        nodes = sample_node_ids(grid, self.fraction_train, self.min_available_nodes,
                                round_rng(self.seed, server_round, 0, PURPOSE_SAMPLE))
        self.asked[server_round] = len(nodes)
        base = ConfigRecord(dict(config.items()))
        for key, value in to_config_record(self.cfg).items():
            if key not in SERVER_ONLY_KEYS:
                base[key] = value
        base.setdefault("method", self.method)
        base["server-round"] = server_round
        base["run-seed"] = self.seed  # clients draw batches from (run seed, round, node)
        w = get_flat(self.model)
        if self.cfg.downlink_mode == "sign":
            base["model-version"] = self.version
            base["model-crc"] = model_crc(w)
        full, full_bits = self._model_record(w)
        messages, bits = [], 0
        for node in nodes:
            cfg = ConfigRecord(dict(base.items()))
            content = RecordDict({"config": cfg})
            held = self.node_version.get(node)
            if (self.cfg.downlink_mode == "sign" and held is not None
                    and 0 <= self.version - held <= MAX_VOTES_BEHIND
                    and all(v in self.votes for v in range(held + 1, self.version + 1))):
                cfg["base-version"] = held
                for v in range(held + 1, self.version + 1):
                    content[f"{VOTE_PREFIX}{v}"] = self.votes[v]
                bits += self.dim * (self.version - held)
            else:
                content[MODEL_KEY] = full
                bits += full_bits
            messages.append(Message(content=content, message_type=MessageType.TRAIN,
                                    dst_node_id=node))
        self.sent_payload_bits[server_round] = bits
        return messages

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Validate and decode the replies, aggregate them and step the server optimizer."""
        t0 = time.perf_counter()
        replies = list(replies)
        self.failures.observe(replies)
        quorum = min(self.min_available_nodes, self.asked.pop(server_round,
                                                              self.min_available_nodes))
        vectors, weights, losses = [], [], []
        scales: list[float] = []  # local-epochs: client-lr x steps, the delta's scale
        kept_nodes: list[int] = []
        refused: set[int] = set()
        rejected = failed = 0
        up_bits = raw_bits = 0
        for msg in replies:
            node = msg.metadata.src_node_id
            if msg.has_error():
                failed += 1
                self.node_version.pop(node, None)
                continue
            try:  # every exception a reply can cause is caught here
                vec, weight, loss, nbits, raw, steps = self.check_reply(msg)
            except Exception as exc:  # noqa: BLE001
                rejected += 1
                refused.add(node)
                self.node_version.pop(node, None)
                log_rejected(node, f"{type(exc).__name__}: {exc}")
                continue
            vectors.append(vec)
            weights.append(weight)
            losses.append(loss)
            kept_nodes.append(node)
            up_bits += nbits
            raw_bits += raw
            scales.append(self.cfg.client_lr * steps)
            if self.cfg.downlink_mode == "sign":
                self.node_version[node] = self.version
        coded = len(vectors)  # replies whose payload bits are counted, screened or not
        if vectors and not self.cfg.majority:
            keep = self.norms.keep([float(np.linalg.norm(v)) for v in vectors])
            for k, node in zip(keep, kept_nodes, strict=True):
                if not k:
                    log_rejected(node, "update norm is implausibly large against the other "
                                 "clients' (norm-bound-factor)")
                    self.node_version.pop(node, None)
            rejected += keep.count(False)
            vectors = [v for v, k in zip(vectors, keep, strict=True) if k]
            weights = [w for w, k in zip(weights, keep, strict=True) if k]
            losses = [x for x, k in zip(losses, keep, strict=True) if k]
            scales = [x for x, k in zip(scales, keep, strict=True) if k]
        if self.cfg.epochs_mode:  # screened as pseudo-gradients, averaged as model deltas
            vectors = [v * np.float32(c) for v, c in zip(vectors, scales, strict=True)]
        stepped = bool(vectors) and len(vectors) >= quorum
        if stepped:
            self.guard.begin()
            self.apply(server_round, vectors, weights)
            if not self.guard.finite_or_restore():
                self.rolled_back += 1
                stepped = False
                log_round(self.method, server_round, "the step made the model non-finite: "
                          f"rolled back; replies came from nodes {sorted(kept_nodes)}")
        metrics: dict[str, MetricRecordValues] = {
            "train-loss": (float(np.average(losses, weights=weights)) if losses
                           else float("nan")),
            "up-payload-bits": int(up_bits),
            "up-raw-payload-bits": int(raw_bits),
            "down-payload-bits": int(self.sent_payload_bits.pop(server_round, 0)),
            "replies": len(vectors),
            "coded-replies": coded,
            "rejected": rejected,
            "failed": failed,
            "stepped": int(stepped),
            "rolled-back": self.rolled_back,
            "server-time-s": time.perf_counter() - t0,
        }
        self.last_metrics = metrics
        log_round(self.method, server_round,
                  f"{len(vectors)} replies, rejected {rejected}, failed {failed}, "
                  f"up {up_bits} payload bits")
        self._returned = state_arrays(self.model)
        return self._returned, MetricRecord(metrics)

    @classmethod
    def from_run_config(cls, model: torch.nn.Module, run_config: Mapping[str, Any],
                        **overrides: Any) -> GradientStrategy:
        """The strategy with its knobs read from a run config (``context.run_config``).

        Every :class:`GradientConfig` field and scalar argument (``seed``,
        ``fraction-train``, ...) is read from its hyphenated key where present (``codec``
        defaults to ``qsgd``), other keys are ignored and ``overrides`` win
        (:func:`dq_flower.config.strategy_kwargs`); a value of the wrong type raises
        ``ValueError`` naming its key.
        """
        return cls(model, **strategy_kwargs(cls, GradientConfig, run_config, overrides,
                                            defaults={"codec": "qsgd"}))

    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3,
              *args: Any, **kwargs: Any) -> Result:
        """Flower's ``Strategy.start`` (documented there)."""
        return super().start(grid, initial_arrays, num_rounds, *args, **kwargs)

    # ------------------------------------------------------------------ internals
    def _model_record(self, w: np.ndarray) -> tuple[ArrayRecord, int]:
        """The downlink model record (float32 or fp16, entropy-coded) and its payload bits."""
        codec = "fp16" if self.cfg.downlink_mode == "fp16" else "identity"
        payload = make(codec, entropy=self.cfg.entropy_coder).encode(w)
        return payload.to_record(), int(payload.nbits)

    def validate_reply(self, msg: Message) -> tuple[np.ndarray, float, float, int]:
        """Check one reply and decode it: the first four fields of :meth:`check_reply`."""
        return self.check_reply(msg)[:4]

    def check_reply(self, msg: Message) -> tuple[np.ndarray, float, float, int, int, int]:
        """Check one reply and decode it.

        Returns
        -------
        vector : numpy.ndarray
            The decoded float32 update, length D.
        weight : float
            Its ``num-examples``.
        loss : float
            The client's training loss.
        nbits : int
            The payload's exact size in bits, as sent (after lossless coding).
        raw_nbits : int
            The same before lossless coding.
        steps : int
            The client's local steps (``local-epochs``: ``E ceil(n / batch-size)`` for its
            ``n = num-examples / E`` rows; else ``local-steps``).

        Raises
        ------
        PayloadError
            Missing records, another codec, a malformed payload, wrong size, non-finite
            values, or out-of-range metrics.
        """
        content = msg.content
        metrics = content.metric_records.get(METRICS_KEY)
        if metrics is None:
            raise PayloadError(f"reply misses its {METRICS_KEY!r} record")
        examples = metrics.get("num-examples")
        epochs = self.cfg.local_epochs
        most = (epochs * MAX_EPOCH_ROWS if self.cfg.epochs_mode
                else self.cfg.batch_size * self.cfg.local_steps)
        if isinstance(examples, bool) or not isinstance(examples, int) \
                or not 1 <= examples <= most:
            raise PayloadError(f"num-examples={examples!r} is not an int in [1, {most}]")
        if self.cfg.epochs_mode and examples % epochs:
            raise PayloadError(f"num-examples={examples} is not {epochs} epochs of whole rows")
        steps = (epoch_steps(examples, self.cfg.batch_size, epochs) if self.cfg.epochs_mode
                 else self.cfg.local_steps)
        loss = metrics.get("train-loss")
        if not isinstance(loss, (int, float)) or not np.isfinite(loss):
            raise PayloadError(f"train-loss={loss!r} is not a finite number")
        keys = update_keys(self.cfg, len(self.sizes))
        if set(content.array_records) != set(keys):
            raise PayloadError(f"reply carries records {sorted(content.array_records)}, "
                               f"expected {keys}")
        sizes = self.sizes if self.cfg.segmented else [self.dim]
        vec, nbits, raw = decode_update(content.array_records, keys, sizes, self.codec)
        return vec, float(examples), float(loss), nbits, raw, steps

    def aggregate(self, server_round: int, vectors: list[np.ndarray],
                  weights: list[float]) -> np.ndarray:
        """Combine decoded updates: weighted mean, a robust rule, or the majority vote."""
        if self.cfg.majority:
            rng = round_rng(self.seed, server_round, 0, PURPOSE_TIES)
            return majority_vote(vectors, rng)
        vectors = clip_norms(vectors, self.cfg.clip_norm)
        rule = "mean" if self.cfg.aggregation == "auto" else self.cfg.aggregation
        if rule == "mean":
            return weighted_mean(vectors, cap_weights(weights))
        return robust_aggregate(vectors, weights, rule, self.cfg.trim_fraction)

    def apply(self, server_round: int, vectors: list[np.ndarray], weights: list[float]) -> None:
        """Aggregate and take one server step (advances the model version)."""
        agg = self.aggregate(server_round, vectors, weights)
        if self.cfg.majority:
            record = make("sign").encode(agg).to_record()
            vote = vote_from_payload(Payload.from_record(record))  # exactly what clients see
            set_flat(self.model, sign_step(get_flat(self.model), vote, self.cfg.lr,
                                           self.cfg.weight_decay))
            self.version += 1
            if self.cfg.downlink_mode == "sign":
                self.votes[self.version] = record
                self.votes.pop(self.version - MAX_VOTES_BEHIND - 1, None)
            return
        assert self.optimizer is not None
        apply_flat_grad(self.model, self.optimizer, agg)
        self.version += 1

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        """Everything needed to resume: model, optimizer, versions and recent votes."""
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict() if self.optimizer is not None else None,
            "version": self.version,
            "node_version": dict(self.node_version),
            "votes": {v: vote_from_payload(Payload.from_record(rec)).astype(np.int8)
                      for v, rec in self.votes.items()},
        }

    def load_state_dict(self, state: dict) -> None:
        """Inverse of :meth:`state_dict`."""
        self.model.load_state_dict(state["model"])
        if self.optimizer is not None and state["optimizer"] is not None:
            self.optimizer.load_state_dict(state["optimizer"])
        self.version = int(state["version"])
        self.node_version = {int(k): int(v) for k, v in state["node_version"].items()}
        self._returned = None
        sign = make("sign")
        self.votes = {int(v): sign.encode(np.asarray(vote, np.float32)).to_record()
                      for v, vote in state["votes"].items()}

    def flat_model(self) -> np.ndarray:
        """The server model's parameters as one float32 vector."""
        return get_flat(self.model)


#: The name the package used before the plugin API.
CompressedGradientStrategy = GradientStrategy
