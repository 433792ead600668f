"""DQ's gradient rounds (``upload-mode`` ``gradient`` or ``auto``): check, bound, combine.

Each client's gradient (coded by ``gradient-codec``) is decoded by the baselines' decoder
under the identity it claims, bounded against the round's others and recent rounds, and
combined by the robust rule into the round's fresh step; the other ``server-steps`` are
taken on the store.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from logging import WARNING
from operator import attrgetter
from typing import Any

import numpy as np
from flwr.app import Message
from flwr.common.logger import log

from dq_flower.codecs import Codec
from dq_flower.dq.config import DQConfig, robust_rule
from dq_flower.dq.server.federation import reply_identity
from dq_flower.dq.server.intake import UploadIntake
from dq_flower.dq.server.planner import RoundPlan, reply_bits
from dq_flower.dq.server.round_metrics import Metrics, RoundMetrics
from dq_flower.dq.server.training import ServerTrainer
from dq_flower.dq.server.validation import BY_PARTITION, MAX_LOCAL_ID, count_claim
from dq_flower.server.common import log_round
from dq_flower.server.majority import bounded_mean
from dq_flower.server.pipeline import Screened, UpdateFigures
from dq_flower.server.robust import DirectionScreen, NormScreen, UpdateScreens, aggregate
from dq_flower.wire.dq_batch import GRADIENT_KEY, SPEC_KEY, reply_spec
from dq_flower.wire.gradient_reply import GradientDecoder, GradientUpdate

__all__ = ["Combined", "GradientRounds"]


@dataclass
class Combined:
    """A gradient round's accepted replies and their combined gradient (``None``: none)."""

    figures: UpdateFigures  # of every reply that decoded, before bounding
    valid: list[GradientUpdate] = field(default_factory=list)
    gradient: np.ndarray | None = None
    misaligned: int = 0  # replies left out of the mean for their direction


class GradientRounds(UpdateScreens):
    """Check, bound and combine the replies of gradient rounds, and take the round's steps."""

    def __init__(self, cfg: DQConfig, codec: Codec | None, *, intake: UploadIntake,
                 trainer: ServerTrainer, metrics: RoundMetrics) -> None:
        self.cfg, self.codec, self.intake, self.trainer, self.metrics = (
            cfg, codec, intake, trainer, metrics)
        #: the intake's: which node is which client, and the upload planner
        self.identities, self.planner = intake.identities, intake.planner
        self.norms = NormScreen(cfg.norm_bound_factor)
        self.directions = DirectionScreen(cfg.min_cosine)
        self._bits: dict[int, int] = {}  # this round's replies' sizes, by identity
        self._sources: dict[int, int] = {}  # this round's replies' node ids, by identity

    def step(self, server_round: int, screened: Screened[GradientUpdate], combined: Combined,
             plan: RoundPlan) -> Metrics:
        """A gradient round's steps (the combined gradient, then the store); its metrics."""
        valid, figures = combined.valid, combined.figures
        # the clients' losses (a store-less round's figure): finite ones, each clipped to
        # the span of the round's middle losses (GradientStrategy's bound)
        losses = [r.loss for r in valid if math.isfinite(r.loss)]
        loss = self.trainer.train_gradient(
            server_round, combined.gradient,
            [bounded_mean(losses, [1.0] * len(losses))] if losses else [],
            [r.node for r in valid])
        self.record(valid)
        metrics = self.metrics.common(plan, loss=loss, selected=0,
                                      up_bits=figures.up_payload_bits,
                                      replies=len(valid), rejected=screened.rejected,
                                      failed=screened.failed, t0=screened.started)
        metrics["coded-replies"] = figures.coded_replies
        metrics["up-raw-payload-bits"] = figures.up_raw_payload_bits
        metrics["rolled-back"] = self.trainer.rolled_back
        metrics["misaligned"] = combined.misaligned
        log_round("dq", server_round, f"gradient round: {len(valid)} gradients, "
                  f"store {metrics['stored']}, rejected {screened.rejected}, failed "
                  f"{screened.failed}")
        return metrics

    def validate(self, msg: Message, server_round: int) -> GradientUpdate:
        """Check and decode one reply of a gradient round (the baselines' decoder)."""
        content = msg.content
        if SPEC_KEY in content.config_records:
            reply_spec(content, self.intake.data.spec)  # the federation's, where adopted
        assert self.codec is not None
        src = int(msg.metadata.src_node_id)
        claimed = reply_identity(content.metric_records.get("metrics"), src)
        identity, _ = self.identities.resolve(server_round, src, claimed)
        update = GradientDecoder([GRADIENT_KEY], [self.intake.num_params], self.codec,
                                 max_examples=MAX_LOCAL_ID, require_loss=False,
                                 exact_records=False)(msg)
        self.identities.claim(server_round, src, identity)
        # per-client state is keyed by identity; the count taken at most the others' bound
        update = replace(update, node=identity,
                         weight=self.counted_examples(identity, int(update.weight)))
        self._bits[identity] = reply_bits(content)
        self._sources[identity] = src
        return update

    def counted_examples(self, node: int, examples: int) -> int:
        """A reply's count: it may grow (a stream); counted at most the others' bound.

        The bound is data rounds' (:func:`~.validation.screen_claims`):
        :data:`~.validation.EXAMPLES_FACTOR` times the other clients' lower median (logged).
        """
        others = [v[0] for n, v in self.intake.data.sent.items()
                  if v[0] > 0 and int(n) != int(node)]
        counted, why = count_claim(examples, others) if others else (examples, None)
        if why:
            log(WARNING, "reply from node %d: %s", node, why)
        return counted

    def combine(self, screened: Screened[GradientUpdate], contested: set[int]) -> Combined:
        """Bound the screened replies (rejecting some in ``screened``) and combine them.

        Replies are combined in partition order; ``contested`` identities' are rejected.
        """
        cfg = self.cfg
        # the bits of every gradient that decoded, as for the baselines' updates
        figures = UpdateFigures.decoded(screened, screened.accepted)
        screened.keep_uncontested(attrgetter("node"), contested, order=BY_PARTITION,
                                  node=lambda r: self._sources[r.node])
        valid = screened.accepted
        for r in valid:  # an accepted reply binds its node id to the identity it spoke for
            self.identities.bind(self._sources[r.node], r.node)
        self._sources.clear()
        _, bounded = self._bound(screened, valid, [r.vector for r in valid],
                                 [r.weight for r in valid], [r.node for r in valid],
                                 clip_factor=cfg.clip_factor, clip_norm=cfg.clip_norm,
                                 weight_cap=cfg.weight_cap, what="gradient")
        valid = screened.accepted
        grad = (aggregate(bounded.vectors, bounded.weights,
                          robust_rule(cfg.robust_aggregation), cfg.trim_fraction)
                if valid else None)
        return Combined(figures, valid, grad, len(bounded.misaligned))

    def record(self, valid: list[GradientUpdate]) -> None:
        """Record the accepted replies' examples; tell the planner their mean size."""
        for r in valid:
            self.intake.data.record_sent(r.node, int(r.weight), 0)
        if valid:
            self.planner.measured(gradient_bits=float(np.mean(
                [self._bits[r.node] for r in valid])))
        self._bits.clear()

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The norm screen's recent medians."""
        return {"norms": list(self.norms.medians), "directions": self.directions.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`state_dict`."""
        self.norms.load_state_dict({"medians": state.get("norms", [])})
        self.directions.load_state_dict(state.get("directions", {}))
