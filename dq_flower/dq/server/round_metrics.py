"""A DQ round's metrics, read off the strategy's parts after the round's steps.

:class:`RoundMetrics` gives both kinds of round's metrics; :func:`schedule_text` is the
adaptive schedule's part of a data round's log line.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from flwr.app import Message, MetricRecordValues

from dq_flower.codecs.bitpack import packed_nbytes
from dq_flower.codecs.tokens import token_width
from dq_flower.dq.config import DQConfig
from dq_flower.dq.server.asks import RoundAsks
from dq_flower.dq.server.federation import FederationData
from dq_flower.dq.server.planner import RoundPlan
from dq_flower.dq.server.reference_rows import reference_bits
from dq_flower.dq.server.training import ServerTrainer
from dq_flower.dq.server.validation import Upload
from dq_flower.server.common import log_round
from dq_flower.wire.dq_batch import DataSpec, SampleBatch

__all__ = ["Metrics", "RoundMetrics", "schedule_text", "spec_text"]

#: a round's metrics by name, as ``aggregate_train`` returns them
Metrics = dict[str, MetricRecordValues]


def packed_bytes(batch: SampleBatch) -> int:
    """Bytes of an upload bit-packed but before entropy coding (samples and info)."""
    n, d = batch.samples.shape
    info = (batch.info_nbits + 7) // 8
    if batch.samples.codec == "tokens":  # ids at whole bytes each (.token_batch)
        return n * d * token_width(int(batch.samples.meta["vocab"])) + info
    side = sum(b.nbytes for k, b in batch.samples.buffers.items() if k != "codes")
    return int(packed_nbytes(n * d, int(batch.samples.meta["bits"])) + side + info)


#: Share of the rows sent below which a class is rare (:meth:`RoundMetrics._skew`).
RARE_SHARE = 0.1


class RoundMetrics:
    """A round's metrics, read off the strategy's parts after the round's steps."""

    def __init__(self, cfg: DQConfig, data: FederationData, asks: RoundAsks,
                 trainer: ServerTrainer) -> None:
        self.cfg, self.data, self.asks, self.trainer = cfg, data, asks, trainer
        #: bytes of the samples sent so far, and of the model's float32 weights from the most
        #: replies a round has had, until :meth:`_weigh` has said so once
        self.sent: list[float] | None = [0.0, 0.0]
        #: the run's rounds (``start``'s ``num_rounds``; None: one round at a time)
        self.num_rounds: int | None = None
        self.skew_said = False  # whether :meth:`_skew` has spoken

    def common(self, plan: RoundPlan | None, *, loss: float, selected: int, up_bits: int,
               replies: int, rejected: int, failed: int, t0: float) -> Metrics:
        """The per-round metrics both kinds of round report."""
        store = self.data.store
        metrics: Metrics = {
            "selected": int(selected),
            "stored": self.data.stored,
            "store-bytes": 0 if store is None else store.nbytes,
            "evicted": 0 if store is None else store.evicted,
            "up-payload-bits": int(up_bits),
            "replies": replies,
            "rejected": rejected,
            "failed": failed,
            "server-time-s": time.perf_counter() - t0,
            # rows of the round's replies the server already held (dropped), and the bytes
            # of the held sets and tables its messages carried (part of the downlink)
            "duplicate-rows": self.data.take_duplicates(),
            "held-set-bytes": self.asks.held_bytes,
        }
        if math.isfinite(loss):  # a round that trained nothing (no new rows) reports none
            metrics["train-loss"] = float(loss)
        if plan is not None and self.cfg.upload_mode != "data":
            metrics.update({"gradient-round": int(plan.mode == "gradient"),
                            "est-data-bits": float(plan.data_bits),
                            "est-gradient-bits": float(plan.gradient_bits)})
        return metrics

    def data_round(self, server_round: int, plan: RoundPlan | None, fresh: list[Upload], *,
                   loss: float, rejected: int, failed: int, t0: float,
                   refreshed: tuple[int, int] | None,
                   replies: Sequence[Message] = ()) -> Metrics:
        """A data round's metrics, logged; ``refreshed``: ``(refreshed, rejected)`` residuals.

        ``up-payload-bits`` and ``up-packed-bytes``: the uploads' and the reference rows their
        ``replies`` carried.
        """
        references = reference_bits(replies, fresh)
        metrics = self.common(
            plan, loss=loss, selected=sum(len(u.batch) for u in fresh),
            up_bits=sum(u.batch.payload_bits for u in fresh) + references,
            replies=len(fresh),
            rejected=rejected, failed=failed, t0=t0)
        metrics["up-packed-bytes"] = int(sum(packed_bytes(u.batch) for u in fresh)
                                         + references // 8)
        metrics["rolled-back"] = self.trainer.rolled_back
        if refreshed is not None:
            metrics["refreshed"], metrics["refreshes-rejected"] = refreshed
        if self.trainer.schedule is not None:
            metrics.update(self.schedule())
        log_round("dq", server_round, f"{metrics['selected']} new samples, store "
                  f"{metrics['stored']}, rejected {rejected}, failed {failed}"
                  + schedule_text(metrics, self.trainer.cfg.uploads_all))
        self._weigh(server_round, sum(u.batch.payload_bits for u in fresh) / 8, len(fresh))
        self._skew(server_round, fresh)
        return metrics

    def _skew(self, server_round: int, fresh: list[Upload]) -> None:
        """Say once where a class is rare and DQ's loss, its default, weighs none.

        A user's FedAvg that weighs 5% fraud tenfold reached 0.6 balanced accuracy while DQ,
        told nothing of the weights, trained the unweighted loss to "no fraud" (0.50).
        """
        labels = [u.batch.labels for u in fresh if u.batch.labels.ndim == 1 and len(u.batch)]
        spec = self.data.spec
        if (self.skew_said or not labels or spec is None or spec.target != "class"
                or getattr(self.trainer.loss_fn, "user", 0) is not None):
            return
        self.skew_said = True
        shares = np.bincount(np.concatenate(labels).astype(np.int64)) / sum(map(len, labels))
        rare = int(np.argmin(np.where(shares > 0, shares, np.inf)))
        if shares[rare] < RARE_SHARE:
            log_round("dq", server_round, f"class {rare} is {shares[rare]:.1%} of the rows sent: "
                      "if your own training weighs the classes, give DQStrategy the same "
                      "loss_fn (nn.CrossEntropyLoss(weight=...)); DQ's default weighs none "
                      "(said once)")

    def _weigh(self, server_round: int, sample_bytes: float, replies: int) -> None:
        """Say once where the samples sent outweigh FedAvg's uplink over the whole run.

        A small model on many rows (62 weights, 50,000 rows a node) cost DQ 3.9 times
        FedAvg's uplink without a word. FedAvg's uplink is the model's float32 weights from the
        most replies a round has had, over the run's rounds: ``upload-all`` sends every row in
        round 1, against which one round of updates says nothing.
        """
        if self.sent is None:
            return
        self.sent[0] += sample_bytes
        self.sent[1] = max(self.sent[1], 4.0 * replies * sum(
            p.numel() for p in self.trainer.model.parameters()))
        rounds = max(self.num_rounds or server_round, server_round)
        fedavg = self.sent[1] * rounds
        if self.sent[0] > fedavg > 0:
            log_round("dq", server_round, f"the samples sent so far ({self.sent[0]:,.0f} B) "
                      f"outweigh the model's float32 weights from as many replies a round over "
                      f"{rounds} rounds ({fedavg:,.0f} B): with a model this small FedAvg's "
                      "uplink is the smaller (said once)")
            self.sent = None

    def schedule(self) -> Metrics:
        """The adaptive schedule's round metrics (steps, held-out score, gain, next ask)."""
        schedule, phase, store = self.trainer.schedule, self.trainer.last_phase, self.data.store
        assert schedule is not None  # the store is None until a spec is adopted
        out: Metrics = {
            "server-steps": 0 if phase is None else phase.steps,
            "reverted": int(self.trainer.reverted and phase is not None),
            "holdout-rows": 0 if store is None else int(store.holdout_mask.sum()),
            "next-ask": int(schedule.next_total or 0),
            # 0: asking; 1: stopped, the learning curve is flat; 2: every node exhausted
            "schedule-done": (0 if not schedule.done
                              else 2 if schedule.reason == "exhausted" else 1),
        }
        idle = phase is not None and self.trainer.idle.ran  # a phase on the unchanged store
        if idle:  # 1: its model kept; 0: no better beyond noise (none until new rows train)
            out["idle-kept"] = int(self.trainer.idle.kept)
        if phase is not None and phase.diverged:  # steps undone as they went non-finite
            out["server-diverged"] = phase.diverged
        if schedule.done and schedule.probe_after:  # data rounds before the next probe
            out["probe-in"] = max(int(schedule.probe_in), 1)
        kept = None if phase is None else phase.initial if self.trainer.reverted else phase.final
        if kept is not None and kept.loss.size:  # the held-out scores of the model kept
            out["holdout-loss"] = float(kept.loss.mean())
            if kept.correct is not None:
                out["holdout-acc"] = float(kept.correct.mean())
        point = schedule.curve[-1] if phase is not None and not idle and schedule.curve else {}
        if "gain" in point:
            out["upload-gain"] = float(point["gain"])
            out["upload-gain-stderr"] = float(point["stderr"])
        return out


def schedule_text(metrics: dict[str, Any], all_rows: bool = False) -> str:
    """The adaptive schedule's part of a data round's log line (empty without one).

    ``all_rows``: ``upload-schedule = "all"`` asks every row left, whatever its next ask.
    """
    if "next-ask" not in metrics:
        return ""
    text = f", {metrics['server-steps']} server steps" + (
        " on the rows stored" if "idle-kept" in metrics else "")
    if n := metrics.get("server-diverged"):
        text += (f" ({n} run{'s' if n != 1 else ''} of steps went non-finite: undone, the "
                 "step size cut tenfold each time)")
    if "holdout-acc" in metrics:
        text += f", held-out accuracy {float(metrics['holdout-acc']):.4f}"
    if "upload-gain" in metrics and metrics.get("holdout-rows"):  # none: no comparison
        text += f", gain {float(metrics['upload-gain']):+.4f}"
    if metrics.get("idle-kept") == 0:
        text += (" (no better than the model before beyond noise: that one is kept, and rounds"
                 " train no more until new rows come)")
    if metrics.get("reverted"):
        text += (" (worse on the held-out rows beyond its uncertainty: the previous model is"
                 " kept)")
    wait = metrics.get("probe-in")
    rounds = f"{wait} data round{'s' if wait != 1 else ''}"
    if metrics["schedule-done"] == 2:
        return text + "; every node has uploaded all its samples" + (
            f" (a probe asks one for more in {rounds})" if wait else "")
    if metrics["schedule-done"]:
        return text + "; the learning curve is flat: " + (
            f"no uploads until a probe in {rounds}" if wait else "no more uploads")
    return text + ("; next ask: every row left" if all_rows
                   else f"; next ask {metrics['next-ask']} samples")


def spec_text(spec: DataSpec, mode: str, classes: int | None, whole_vocab: int,
              default_loss: bool) -> str:
    """The log line of an adopted data spec (samples, targets, ranges, classes)."""
    ids = spec.vocab > 0
    reader = "whole numbers the model casts" if whole_vocab else "the model's embedding"
    units = " (mixed units: one range a sample would lose some)" * (
        spec.mixed_units and mode == "feature")
    return (f"data: samples {spec.sample_shape}"
            + (f" of ids below {spec.vocab} ({reader}), coded losslessly" if ids else "")
            + (", the samples their own targets (none sent)" if spec.target == "inputs"
               else f", {spec.target} targets")
            + (" (0 or 1: binary cross-entropy on the model's logits)"
               if spec.target == "binary" and default_loss else "")
            + ("" if ids else f", ranges {mode}{units}")
            + (f", {classes} classes" if spec.target == "class" else ""))
