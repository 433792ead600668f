"""Distributed SGD with compressed uploads: the gradient-compression baselines.

One message exchange per round. The server sends the model (``downlink``: float32, fp16,
or for majority vote the 1-bit votes the client lacks); each sampled client computes the
gradient of its minibatch (``local-steps`` = 1) or the mean gradient along tau local SGD
steps, encodes it with a registry codec (inside error feedback where the codec is biased)
and replies. The server validates every reply, decodes, aggregates (mean weighted by
``num-examples``, or majority vote: the sign of the sum of signs) and steps its optimizer.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from ..clients.gradient import (
    METRICS_KEY,
    VOTE_PREFIX,
    model_crc,
    sign_step,
    update_keys,
    uses_error_feedback,
    vote_from_payload,
)
from ..codecs import Payload, PayloadError, make
from ..config import TaskConfig, to_config_record
from ..config_baselines import GradientConfig
from ..runtime import MODEL_KEY, TaskInfo, model_record, round_rng, state_arrays
from ..tasks.params import get_flat, num_params, set_flat
from .common import log_rejected, log_round, make_optimizer, sample_node_ids

__all__ = ["CompressedGradientStrategy", "majority_vote", "weighted_mean"]

#: Most votes a client may be behind before the server sends the float32 model instead
#: (beyond 31 one-bit votes the 32-bit model is cheaper).
MAX_VOTES_BEHIND = 31
#: ``round_rng`` purposes used by the server.
PURPOSE_SAMPLE = 1
PURPOSE_TIES = 4


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


class CompressedGradientStrategy(Strategy):
    """Distributed SGD whose clients upload compressed gradients (or local-step deltas).

    Parameters
    ----------
    task : TaskConfig
        Data set, model, partition, rounds, seed.
    config : GradientConfig
        Codec, local steps, server optimizer, downlink and aggregation.
    model : torch.nn.Module
        The server's model, trained in place.
    info : TaskInfo
        Number of classes, sample shape, data dimension.
    method : str
        Method name written into the messages' config (``qsgd``, ``signsgd``, ...).
    """

    def __init__(self, task: TaskConfig, config: GradientConfig, model: torch.nn.Module,
                 info: TaskInfo, method: str = "sgd") -> None:
        self.task = task
        self.cfg = config
        self.model = model
        self.info = info
        self.method = method
        self.codec = make(config.codec, **config.codec_kwargs)
        self.dim = num_params(model)
        self.sizes = [p.numel() for p in model.parameters()]
        self.optimizer = (make_optimizer(config.optimizer, model.parameters(), config.lr,
                                         config.momentum, config.weight_decay)
                          if not config.majority else None)
        self.version = 0  # model updates applied so far
        self.node_version: dict[int, int] = {}  # downlink="sign": model version a node holds
        self.votes: dict[int, ArrayRecord] = {}  # version v -> vote taking v-1 to v
        self.sent_payload_bits: dict[int, int] = {}
        self.last_metrics: dict[str, float] = {}

    # ------------------------------------------------------------------ Strategy API
    def summary(self) -> None:
        """Log the configuration."""
        ef = uses_error_feedback(self.cfg, self.codec)
        log_round(self.method, 0, f"codec {self.codec}, error feedback {ef}, config {self.cfg}")

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Send every sampled node the round config and the model (or the votes it lacks)."""
        nodes = sample_node_ids(grid, self.task.fraction_train, 1,
                                round_rng(self.task.seed, server_round, 0, PURPOSE_SAMPLE))
        base = ConfigRecord(dict(config.items()))
        for key, value in {**to_config_record(self.task), **to_config_record(self.cfg)}.items():
            base[key] = value
        base.setdefault("method", self.method)
        base["server-round"] = server_round
        w = get_flat(self.model)
        if self.cfg.downlink_mode == "sign":
            base["model-version"] = self.version
            base["model-crc"] = model_crc(w)
        full = self._model_record(w)
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
                bits += (16 if self.cfg.downlink_mode == "fp16" else 32) * self.dim
            messages.append(Message(content=content, message_type=MessageType.TRAIN,
                                    dst_node_id=node))
        self.sent_payload_bits[server_round] = bits
        return messages

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Validate and decode the replies, aggregate them and step the server optimizer."""
        t0 = time.perf_counter()
        vectors, weights, losses = [], [], []
        rejected = failed = 0
        up_bits = 0
        for msg in replies:
            node = msg.metadata.src_node_id
            if msg.has_error():
                failed += 1
                self.node_version.pop(node, None)
                continue
            try:
                vec, weight, loss, nbits = self.validate_reply(msg)
            except (PayloadError, ValueError, KeyError, TypeError) as exc:
                rejected += 1
                self.node_version.pop(node, None)
                log_rejected(node, str(exc))
                continue
            vectors.append(vec)
            weights.append(weight)
            losses.append(loss)
            up_bits += nbits
            if self.cfg.downlink_mode == "sign":
                self.node_version[node] = self.version
        stepped = len(vectors) >= self.task.min_available
        if stepped:
            self.apply(server_round, vectors, weights)
        metrics = {
            "train-loss": (float(np.average(losses, weights=weights)) if losses
                           else float("nan")),
            "up-payload-bits": int(up_bits),
            "down-payload-bits": int(self.sent_payload_bits.pop(server_round, 0)),
            "replies": len(vectors),
            "rejected": rejected,
            "failed": failed,
            "stepped": int(stepped),
            "server-time-s": time.perf_counter() - t0,
        }
        self.last_metrics = metrics
        log_round(self.method, server_round,
                  f"{len(vectors)} replies, rejected {rejected}, failed {failed}, "
                  f"up {up_bits} payload bits")
        return state_arrays(self.model), MetricRecord(metrics)

    def configure_evaluate(self, server_round, arrays, config, grid):  # noqa: D102
        return []

    def aggregate_evaluate(self, server_round, replies):  # noqa: D102
        return None

    # ------------------------------------------------------------------ internals
    def _model_record(self, w: np.ndarray) -> ArrayRecord:
        if self.cfg.downlink_mode == "fp16":
            return make("fp16").encode(w).to_record()
        return model_record(self.model)

    def validate_reply(self, msg: Message) -> tuple[np.ndarray, float, float, int]:
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
            The payload's exact size in bits.

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
        most = self.cfg.batch_size * self.cfg.local_steps
        if isinstance(examples, bool) or not isinstance(examples, int) \
                or not 1 <= examples <= most:
            raise PayloadError(f"num-examples={examples!r} is not an int in [1, {most}]")
        loss = metrics.get("train-loss")
        if not isinstance(loss, (int, float)) or not np.isfinite(loss):
            raise PayloadError(f"train-loss={loss!r} is not a finite number")
        keys = update_keys(self.cfg, len(self.sizes))
        if set(content.array_records) != set(keys):
            raise PayloadError(f"reply carries records {sorted(content.array_records)}, "
                               f"expected {keys}")
        sizes = self.sizes if self.cfg.segmented else [self.dim]
        parts, nbits = [], 0
        for key, size in zip(keys, sizes, strict=True):
            payload = Payload.from_record(content.array_records[key])
            if payload.codec != self.codec.name:
                raise PayloadError(f"{key} encoded by {payload.codec!r}, "
                                   f"expected {self.codec.name!r}")
            if math.prod(payload.shape) != size:
                raise PayloadError(f"{key} declares shape {payload.shape}, expected {size} "
                                   "values")
            part = np.asarray(self.codec.decode(payload), dtype=np.float32).reshape(-1)
            if part.size != size:
                raise PayloadError(f"{key} decodes to {part.size} values, expected {size}")
            parts.append(part)
            nbits += int(payload.nbits)
        vec = np.concatenate(parts)
        if not np.isfinite(vec).all():
            raise PayloadError("update decodes to non-finite values")
        return vec, float(examples), float(loss), nbits

    def aggregate(self, server_round: int, vectors: list[np.ndarray],
                  weights: list[float]) -> np.ndarray:
        """Combine decoded updates: weighted mean, or the majority vote."""
        if self.cfg.majority:
            rng = round_rng(self.task.seed, server_round, 0, PURPOSE_TIES)
            return majority_vote(vectors, rng)
        return weighted_mean(vectors, weights)

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
        offset = 0
        for p in self.model.parameters():
            k = p.numel()
            p.grad = torch.from_numpy(agg[offset:offset + k].reshape(p.shape).copy()).to(p.device)
            offset += k
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
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
        sign = make("sign")
        self.votes = {int(v): sign.encode(np.asarray(vote, np.float32)).to_record()
                      for v, vote in state["votes"].items()}

    def flat_model(self) -> np.ndarray:
        """The server model's parameters as one float32 vector."""
        return get_flat(self.model)
