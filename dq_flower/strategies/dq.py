"""The data-quantization strategy.

One message exchange per round: the server sends the round's config (and the model where
the clients need it), each client replies with quantized samples (and optionally a
compensation), the server validates the replies, stores the samples in packed form and
takes ``server-steps`` optimizer steps. The first step uses the fresh batch plus the
compensation, so its gradient equals the true-data gradient when the compensation codec is
lossless; later steps draw minibatches from the store.

With ``upload-mode`` ``gradient`` or ``auto`` (see :mod:`dq_flower.upload_planner`), a round
may instead ask every client for a minibatch gradient coded by ``gradient-codec``; the
server then takes one step with their example-weighted mean, and the remaining
``server-steps`` from the store when it holds samples.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from ..codecs import Payload, PayloadError, make
from ..config import DQConfig, TaskConfig, to_config_record
from ..dq_rows import RowLayout, payload_quantizer
from ..dq_wire import GRADIENT_KEY, SampleBatch, decode_batch
from ..runtime import (
    MODEL_KEY,
    TaskInfo,
    model_record,
    round_rng,
    state_arrays,
    weighted_loss_grad,
)
from ..store import SampleStore, StoredRows
from ..upload_planner import (
    ESTIMATES,
    RoundPlan,
    UploadPlanner,
    first_estimates,
    reply_bits,
)
from .common import log_round, make_optimizer, sample_node_ids, screen_replies

__all__ = ["DQStrategy", "Upload", "GradientReply"]

#: Largest per-client sample id the server accepts (ids are client-local row numbers).
MAX_LOCAL_ID = 1 << 31


@dataclass
class Upload:
    """One validated reply: the batch, its decoded rows, candidates count and delta."""

    batch: SampleBatch
    x: np.ndarray
    candidates: int
    delta: np.ndarray | None
    node: int = 0
    partition: int = 0
    examples: int = 0
    reply_bits: int = 0


@dataclass
class GradientReply:
    """One validated reply of a gradient round."""

    partition: int
    node: int
    examples: int
    gradient: np.ndarray
    payload_bits: int
    loss: float
    reply_bits: int


class DQStrategy(Strategy):
    """Train on quantized data samples uploaded by the clients.

    Parameters
    ----------
    task : TaskConfig
        Data set, model, partition, rounds, seed.
    config : DQConfig
        The method's knobs.
    model : torch.nn.Module
        The server's model, trained in place.
    info : TaskInfo
        Number of classes, sample shape, data dimension.
    """

    def __init__(
        self, task: TaskConfig, config: DQConfig, model: torch.nn.Module, info: TaskInfo
    ) -> None:
        self.task = task
        self.cfg = config
        self.model = model
        self.info = info
        self.optimizer = make_optimizer(config.optimizer, model.parameters(), config.lr,
                                        config.momentum, config.weight_decay)
        channels = info.input_shape[0] if len(info.input_shape) == 3 else 1
        self.per_channel = channels if config.per_channel and channels > 1 else 0
        self.layout = RowLayout(info.dim, config.bits, max(self.per_channel, 1))
        self.comp_codec = (make(config.compensation, **config.compensation_kwargs)
                           if config.compensation != "none" else None)
        self.store = SampleStore(self.layout.dequantize, max_samples=config.max_store_samples,
                                 eviction=config.store_eviction, seed=task.seed)
        self.num_params = sum(p.numel() for p in model.parameters())
        self.grad_codec = (make(config.gradient_codec, **config.gradient_codec_kwargs)
                           if config.upload_mode != "data" else None)
        # Reply sizes feed the planner's estimates, which only gradient and auto modes use:
        # plain data runs neither encode synthetic replies nor serialize replies twice.
        self.measuring = config.upload_mode != "data"
        self.planner = UploadPlanner(
            config.upload_mode, config.budget, config.resend,
            **(first_estimates(config, info, self.grad_codec, self.comp_codec,
                               self.num_params, task.seed) if self.measuring
               else dict.fromkeys(ESTIMATES, 0.0)))
        self.plans: dict[int, RoundPlan] = {}
        self.asked: dict[int, int] = {}

    # ------------------------------------------------------------------ Strategy API
    def summary(self) -> None:
        """Log the configuration."""
        log_round("dq", 0, f"config {self.cfg}")

    @property
    def needs_model(self) -> bool:
        """Whether clients need the model (compensation or model-based importance)."""
        return self.cfg.compensation != "none" or self.cfg.scorer != "uniform"

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Send the sampled nodes the round config (and the model where needed).

        In a data round, nodes known to have uploaded all their samples are not asked.
        """
        nodes = sample_node_ids(grid, self.task.fraction_train, 1,
                                round_rng(self.task.seed, server_round, 0, purpose=1))
        cfg = ConfigRecord(dict(config.items()))
        for key, value in {**to_config_record(self.task), **to_config_record(self.cfg)}.items():
            cfg[key] = value
        plan = self.planner.plan([int(n) for n in nodes],
                                 self.task.num_server_rounds - server_round + 1)
        self.plans[server_round] = plan
        cfg["method"] = "dq"
        cfg["server-round"] = server_round
        cfg["round-seed"] = int(round_rng(self.task.seed, server_round, 0, 2).integers(2**31))
        cfg["round-mode"] = plan.mode
        if plan.mode == "data":
            nodes = [n for n in nodes if self.planner.samples_left(n, 1) > 0]
        self.asked[server_round] = len(nodes)
        content = RecordDict({"config": cfg})
        if nodes and (self.needs_model or plan.mode == "gradient"):
            content[MODEL_KEY] = model_record(self.model)
        return [Message(content=content, message_type=MessageType.TRAIN, dst_node_id=n)
                for n in nodes]

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Validate replies, store their samples, take the server's optimizer steps."""
        plan = self.plans.pop(server_round, None)
        quorum = min(self.task.min_available, self.asked.pop(server_round,
                                                             self.task.min_available))
        if plan is not None and plan.mode == "gradient":
            return self._aggregate_gradients(server_round, replies, plan, quorum)
        t0 = time.perf_counter()
        screened, rejected, failed = screen_replies(
            replies, lambda msg: self._validate(msg, msg.metadata.src_node_id))
        fresh: list[Upload] = [upload for _, upload in screened]
        # Replies arrive in any order: store and combine them in the clients' partition
        # order, so that a run is reproducible from its seed.
        fresh.sort(key=lambda u: (u.partition, u.node))
        for upload in fresh:
            self.store.add(self._rows(upload.batch, upload.node))
        if len(fresh) >= quorum:
            loss = self._train_steps(server_round, fresh)
        else:
            loss = float("nan")
            log_round("dq", server_round, f"only {len(fresh)} valid replies (min-available "
                      f"{self.task.min_available}): no update this round")
        up_bits = sum(u.batch.payload_bits for u in fresh)
        packed = sum(u.batch.packed_nbytes for u in fresh)
        self._measure_data(fresh)
        metrics = self._round_metrics(
            plan, loss=loss, selected=sum(len(u.batch) for u in fresh), up_bits=up_bits,
            replies=len(fresh), rejected=rejected, failed=failed, t0=t0)
        metrics["up-packed-bytes"] = int(packed)
        log_round("dq", server_round, f"{metrics['selected']} new samples, "
                  f"store {metrics['stored']}, rejected {rejected}, failed {failed}")
        return state_arrays(self.model), MetricRecord(metrics)

    def configure_evaluate(self, server_round, arrays, config, grid):  # noqa: D102
        return []

    def aggregate_evaluate(self, server_round, replies):  # noqa: D102
        return None

    # ------------------------------------------------------------------ internals
    def _validate(self, msg: Message, node: int) -> Upload:
        content = msg.content
        batch = decode_batch(content, self.info.num_classes, self.info.dim, self.cfg.bits,
                             self.cfg.budget, MAX_LOCAL_ID)
        metrics = content.metric_records.get("metrics")
        if metrics is None:
            raise PayloadError("reply misses its 'metrics' record")
        n_cand = metrics.get("candidates")
        if not isinstance(n_cand, int) or not len(batch) <= n_cand <= MAX_LOCAL_ID:
            raise PayloadError(f"'candidates'={n_cand!r} is inconsistent with the upload")
        x = payload_quantizer(batch.samples, self.cfg.bits, self.per_channel).decode(
            batch.samples)
        if not np.isfinite(x).all():
            raise PayloadError("samples decode to non-finite values")
        delta = None
        if batch.compensation is not None:
            if self.comp_codec is None:
                raise PayloadError("unexpected compensation payload")
            if batch.compensation.codec != self.comp_codec.name:
                raise PayloadError(f"compensation made by {batch.compensation.codec!r}")
            delta = self.comp_codec.decode(batch.compensation).reshape(-1)
            if delta.size != self.num_params or not np.isfinite(delta).all():
                raise PayloadError("compensation has the wrong size or non-finite values")
        elif self.comp_codec is not None and len(batch):
            raise PayloadError("reply misses its compensation")
        if self.store.has(node, batch.ids).any() and not self.cfg.resend:
            raise PayloadError("reply re-sends samples already stored")
        partition = metrics.get("partition-id", MAX_LOCAL_ID)
        if not isinstance(partition, int):
            raise PayloadError(f"'partition-id'={partition!r} is not an int")
        examples = metrics.get("num-examples", n_cand)
        if not isinstance(examples, int) or not n_cand <= examples <= MAX_LOCAL_ID:
            raise PayloadError(f"'num-examples'={examples!r} is inconsistent with the upload")
        return Upload(batch, x, n_cand, delta, node, partition, examples,
                      reply_bits(content) if self.measuring else 0)

    def _measure_data(self, fresh: list[Upload]) -> None:
        """Tell the planner what the valid data replies carried and cost."""
        for u in fresh:
            self.planner.record_data(u.node, u.examples, len(u.batch))
        full = [u for u in fresh if len(u.batch)]
        if full and self.measuring:
            samples = [u.batch.samples.nbits + u.batch.info_nbits for u in full]
            rest = [u.reply_bits - s for u, s in zip(full, samples, strict=True)]
            self.planner.measured(sample_bits=sum(samples) / sum(len(u.batch) for u in full),
                                  reply_bits=float(np.mean(rest)))

    def _round_metrics(self, plan: RoundPlan | None, *, loss: float, selected: int,
                       up_bits: int, replies: int, rejected: int, failed: int,
                       t0: float) -> dict[str, float | int]:
        """The per-round metrics both kinds of round report."""
        metrics: dict[str, float | int] = {
            "train-loss": float(loss),
            "selected": int(selected),
            "stored": len(self.store),
            "store-bytes": self.store.nbytes,
            "evicted": self.store.evicted,
            "up-payload-bits": int(up_bits),
            "replies": replies,
            "rejected": rejected,
            "failed": failed,
            "server-time-s": time.perf_counter() - t0,
        }
        if plan is not None and self.cfg.upload_mode != "data":
            metrics.update({"gradient-round": int(plan.mode == "gradient"),
                            "est-data-bits": float(plan.data_bits),
                            "est-gradient-bits": float(plan.gradient_bits)})
        return metrics

    def _validate_gradient(self, msg: Message) -> GradientReply:
        """Check and decode one reply of a gradient round."""
        content = msg.content
        if GRADIENT_KEY not in content.array_records:
            raise PayloadError(f"gradient round: reply misses its {GRADIENT_KEY!r} record")
        metrics = content.metric_records.get("metrics")
        if metrics is None:
            raise PayloadError("reply misses its 'metrics' record")
        examples = metrics.get("num-examples")
        partition = metrics.get("partition-id", MAX_LOCAL_ID)
        if not isinstance(examples, int) or not 1 <= examples <= MAX_LOCAL_ID:
            raise PayloadError(f"'num-examples'={examples!r} must be a positive int")
        if not isinstance(partition, int):
            raise PayloadError(f"'partition-id'={partition!r} is not an int")
        payload = Payload.from_record(content.array_records[GRADIENT_KEY])
        assert self.grad_codec is not None
        if payload.codec != self.grad_codec.name:
            raise PayloadError(f"gradient made by {payload.codec!r}, "
                               f"expected {self.grad_codec.name!r}")
        grad = self.grad_codec.decode(payload).reshape(-1)
        if grad.size != self.num_params or not np.isfinite(grad).all():
            raise PayloadError("gradient has the wrong size or non-finite values")
        loss = metrics.get("train-loss", float("nan"))
        loss = float(loss) if isinstance(loss, (int, float)) else float("nan")
        return GradientReply(partition, msg.metadata.src_node_id, examples, grad,
                             int(payload.nbits), loss, reply_bits(content))

    def _aggregate_gradients(self, server_round: int, replies: Iterable[Message],
                             plan: RoundPlan, quorum: int) -> tuple[ArrayRecord, MetricRecord]:
        """A gradient round: one step with the example-weighted mean, then store steps."""
        t0 = time.perf_counter()
        screened, rejected, failed = screen_replies(replies, self._validate_gradient)
        valid = sorted((r for _, r in screened), key=lambda r: (r.partition, r.node))
        loss = float("nan")
        if valid and len(valid) >= quorum:
            total = float(sum(r.examples for r in valid))
            grad = np.zeros(self.num_params, dtype=np.float32)
            for r in valid:
                grad += np.float32(r.examples / total) * r.gradient
            self.model.train()
            self._step(grad)
            later = self._store_steps(server_round, self.cfg.server_steps - 1)
            loss = float(np.mean(later or [r.loss for r in valid]))
        else:
            log_round("dq", server_round, f"only {len(valid)} valid replies (min-available "
                      f"{self.task.min_available}): no update this round")
        for r in valid:
            self.planner.record_examples(r.node, r.examples)
        up_bits = sum(r.payload_bits for r in valid)
        if valid:
            self.planner.measured(gradient_bits=float(np.mean([r.reply_bits for r in valid])))
        metrics = self._round_metrics(plan, loss=loss, selected=0, up_bits=up_bits,
                                      replies=len(valid), rejected=rejected, failed=failed,
                                      t0=t0)
        log_round("dq", server_round, f"gradient round: {len(valid)} gradients, "
                  f"store {metrics['stored']}, rejected {rejected}, failed {failed}")
        return state_arrays(self.model), MetricRecord(metrics)

    def _rows(self, batch: SampleBatch, node: int) -> StoredRows:
        codes, side, dither = self.layout.rows(batch.samples)
        n = len(batch)
        return StoredRows(codes, side, batch.labels, batch.weights,
                          np.full(n, node, dtype=np.uint64), batch.ids, dither)

    def _step(self, grad: np.ndarray) -> None:
        offset = 0
        for p in self.model.parameters():
            k = p.numel()
            p.grad = torch.from_numpy(grad[offset:offset + k].reshape(p.shape).copy()).to(p.device)
            offset += k
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def fresh_gradient(self, fresh: list[Upload]) -> tuple[float, np.ndarray]:
        """Gradient of the first step: fresh quantized batch plus mean compensation.

        With ``N = sum_k n_k`` candidates, it is ``(1/N) sum_i grad f(Q(x_i)) / pi_i +
        sum_k (n_k / N) delta_k``: the Horvitz-Thompson estimate of the candidates' mean
        gradient, exact at the true points when the compensation codec is lossless.
        """
        total = float(sum(u.candidates for u in fresh))
        xs = np.concatenate([u.x for u in fresh])
        ys = np.concatenate([u.batch.labels for u in fresh])
        ws = np.concatenate([u.batch.weights for u in fresh]) / total
        loss, grad = weighted_loss_grad(self.model, xs, ys, ws)
        for u in fresh:
            if u.delta is not None:
                grad += (u.candidates / total) * u.delta
        return loss / max(float(ws.sum()), 1e-12), grad

    def _train_steps(self, server_round: int, fresh) -> float:
        rng = round_rng(self.task.seed, server_round, 0, purpose=3)
        self.model.train()
        losses = []
        steps = self.cfg.server_steps
        if sum(len(u.batch) for u in fresh):
            loss, grad = self.fresh_gradient(fresh)
            losses.append(loss)
            self._step(grad)
            steps -= 1
        if len(self.store) == 0:
            return float("nan")
        losses += self._store_steps(server_round, steps, rng)
        return float(np.mean(losses)) if losses else float("nan")

    def _store_steps(self, server_round: int, steps: int,
                     rng: np.random.Generator | None = None) -> list[float]:
        """``steps`` optimizer steps on minibatches from the store; their losses."""
        if rng is None:
            rng = round_rng(self.task.seed, server_round, 0, purpose=3)
        if len(self.store) == 0:
            return []
        self.model.train()
        losses = []
        for _ in range(steps):
            x, y, w = self.store.draw(self.cfg.server_batch_size, rng)
            loss, grad = weighted_loss_grad(self.model, x, y, w / w.sum())
            losses.append(loss)
            self._step(grad)
        return losses

    def state_dict(self) -> dict:
        """Everything needed to resume: model, optimizer and sample store."""
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "store": self.store.state(), "planner": self.planner.state()}

    def load_state_dict(self, state: dict) -> None:
        """Inverse of :meth:`state_dict`."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.store.load_state(state["store"])
        if "planner" in state:
            self.planner.load_state(state["planner"])
