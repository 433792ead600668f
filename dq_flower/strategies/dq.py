"""The data-quantization strategy.

One message exchange per round: the server sends the round's config (and the model where
the clients need it), each client replies with quantized samples (and optionally a
compensation), the server validates the replies, stores the samples in packed form and
takes ``server-steps`` optimizer steps. The first step uses the fresh batch plus the
compensation, so its gradient equals the true-data gradient when the compensation codec is
lossless; later steps draw minibatches from the store.
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

from ..codecs import PayloadError, make
from ..config import DQConfig, TaskConfig, to_config_record
from ..dq_rows import RowLayout, payload_quantizer
from ..dq_wire import SampleBatch, decode_batch
from ..runtime import (
    MODEL_KEY,
    TaskInfo,
    model_record,
    round_rng,
    state_arrays,
    weighted_loss_grad,
)
from ..store import SampleStore, StoredRows
from .common import log_rejected, log_round, make_optimizer, sample_node_ids

__all__ = ["DQStrategy", "Upload"]

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
        """Send every sampled node the round config (and the model where needed)."""
        nodes = sample_node_ids(grid, self.task.fraction_train, 1,
                                round_rng(self.task.seed, server_round, 0, purpose=1))
        cfg = ConfigRecord(dict(config.items()))
        for key, value in {**to_config_record(self.task), **to_config_record(self.cfg)}.items():
            cfg[key] = value
        cfg["method"] = "dq"
        cfg["server-round"] = server_round
        cfg["round-seed"] = int(round_rng(self.task.seed, server_round, 0, 2).integers(2**31))
        content = RecordDict({"config": cfg})
        if self.needs_model:
            content[MODEL_KEY] = model_record(self.model)
        return [Message(content=content, message_type=MessageType.TRAIN, dst_node_id=n)
                for n in nodes]

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Validate replies, store their samples, take the server's optimizer steps."""
        t0 = time.perf_counter()
        fresh: list[Upload] = []
        rejected = failed = 0
        for msg in replies:
            node = msg.metadata.src_node_id
            if msg.has_error():
                failed += 1
                continue
            try:
                upload = self._validate(msg, node)
            except (PayloadError, ValueError, KeyError, TypeError) as exc:
                rejected += 1
                log_rejected(node, str(exc))
                continue
            fresh.append(upload)
        # Replies arrive in any order: store and combine them in the clients' partition
        # order, so that a run is reproducible from its seed.
        fresh.sort(key=lambda u: (u.partition, u.node))
        for upload in fresh:
            self.store.add(self._rows(upload.batch, upload.node))
        if len(fresh) >= self.task.min_available:
            loss = self._train_steps(server_round, fresh)
        else:
            loss = float("nan")
            log_round("dq", server_round, f"only {len(fresh)} valid replies (min-available "
                      f"{self.task.min_available}): no update this round")
        up_bits = sum(u.batch.payload_bits for u in fresh)
        packed = sum(u.batch.packed_nbytes for u in fresh)
        metrics = {
            "train-loss": float(loss),
            "selected": int(sum(len(u.batch) for u in fresh)),
            "stored": len(self.store),
            "store-bytes": self.store.nbytes,
            "evicted": self.store.evicted,
            "up-payload-bits": int(up_bits),
            "up-packed-bytes": int(packed),
            "replies": len(fresh),
            "rejected": rejected,
            "failed": failed,
            "server-time-s": time.perf_counter() - t0,
        }
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
        return Upload(batch, x, n_cand, delta, node, partition)

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
        for _ in range(steps):
            x, y, w = self.store.draw(self.cfg.server_batch_size, rng)
            loss, grad = weighted_loss_grad(self.model, x, y, w / w.sum())
            losses.append(loss)
            self._step(grad)
        return float(np.mean(losses)) if losses else float("nan")

    def state_dict(self) -> dict:
        """Everything needed to resume: model, optimizer and sample store."""
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "store": self.store.state()}

    def load_state_dict(self, state: dict) -> None:
        """Inverse of :meth:`state_dict`."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.store.load_state(state["store"])
