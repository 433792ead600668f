"""The server's training of a DQ round: the fresh compensated step, then the store.

``fixed`` schedule: ``server-steps`` steps, the first on the fresh rows plus compensations,
the others on store minibatches (plus the control variate). ``adaptive``: a round that grew
the store trains to a plateau of the held-out score and keeps the previous model where the
new one is significantly worse. A :class:`~dq_flower.server.robust.StepGuard` rolls back a
non-finite model. On several processes (the ``server-processes`` knob) a round's training
runs in spawned workers (:mod:`.processes`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import numpy as np
import torch

from dq_flower.augment import augmentation_for
from dq_flower.codecs import Codec
from dq_flower.dq.config import DQConfig, robust_rule
from dq_flower.dq.server.control_variate import ControlVariate
from dq_flower.dq.server.federation import FederationData
from dq_flower.dq.server.idle_rounds import IdleRounds
from dq_flower.dq.server.input_scale import InputScale, tracked_statistics
from dq_flower.dq.server.loss_floor import LossFloors
from dq_flower.dq.server.node_screen import AgreementScreen, rerun_phase
from dq_flower.dq.server.optimizer_choice import (
    AUTO,
    Continuation,
    OptimizerChoice,
    Races,
    decay_for,
    probe,
    probe_due,
)
from dq_flower.dq.server.output_scale import OutputScale, standardised
from dq_flower.dq.server.plateau import HeldOutScores, PhaseResult, PlateauRule, train_phase
from dq_flower.dq.server.processes import check_portable, sharded_phase, sharded_steps
from dq_flower.dq.server.schedule import AdaptiveSchedule, paired_gain, significantly_worse
from dq_flower.dq.server.step_compute import StepCompute, step_compute, torch_threads
from dq_flower.dq.server.validation import Upload
from dq_flower.losses import weighs_classes
from dq_flower.model_check import placeholder_rows
from dq_flower.model_ops import (
    LossFn,
    WeightedSteps,
    apply_flat_grad,
    per_sample_results,
    weighted_loss_grad,
)
from dq_flower.seeding import Purpose, round_rng
from dq_flower.server.common import decay_groups, log_round, make_optimizer
from dq_flower.server.robust import StepGuard, aggregate, clip_norms

__all__ = ["ServerTrainer", "BatchGradient"]


class ServerTrainer:
    """The server's optimizer steps on ``model``, on the rows of ``data``'s store.

    ``cv``: the control variate added to every store step (``None``: none); ``augment``:
    applied to every store minibatch, never to the held-out rows.
    """

    def __init__(self, cfg: DQConfig, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 data: FederationData, cv: ControlVariate | None, *, loss_fn: LossFn | None,
                 seed: int, comp_codec: Codec | None = None,
                 augment: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        self.cfg, self.model, self.optimizer, self.data, self.cv = cfg, model, optimizer, data, cv
        #: the server's optimizer and base step size (``None``: chosen by the first phase)
        self.choice: OptimizerChoice | None = (
            None if cfg.optimizer == AUTO else OptimizerChoice(cfg.optimizer, cfg.lr))
        self.lr = cfg.lr
        self.lr_given = False  # whether a step size came from the user (knob or train_config)
        self.races = Races()  # the run's optimizer probes (a tie in the first: one more race)
        self.comp_codec = comp_codec
        self.loss_fn, self.seed, self.user_augment = loss_fn, seed, augment
        self.schedule = (AdaptiveSchedule(cfg.min_gain, cfg.max_growth, probe_after=cfg.probe_after)
                         if cfg.adaptive else None)
        self.plateau = PlateauRule(cfg.plateau_eval_every, cfg.plateau_patience, cfg.lr_drops,
                                   cfg.lr_factor, cfg.max_server_steps)
        #: mean held-out loss per node after the last training phase (adaptive asks)
        self.node_fit: dict[int, float] = {}
        self.last_phase: PhaseResult | None = None
        self.reverted = False  # the last phase's model was significantly worse: old one kept
        self.guard = StepGuard(model, optimizer)
        self.auto_step: StepCompute | None = None  # the knobs' automatic values (compute())
        self.rolled_back = 0
        #: clients whose held-out rows disagree with the others' (adaptive schedule)
        self.screen = AgreementScreen(cfg.screen_margin)
        self.idle = IdleRounds()  # rounds whose new rows train no phase
        #: the store steps' minibatch gradient (a worker's share in ``distributed``)
        self.batch_gradient: BatchGradient = weighted_loss_grad
        if cfg.server_processes > 1:  # what the worker processes get must pickle
            check_portable(model, loss_fn, augment)
        self.input_scale, self.output_scale = InputScale(), OutputScale()  # see train_round
        self.floors = LossFloors()  # the held-out rows' floors (a loss with an offset)

    # ------------------------------------------------------------------ the optimizer
    def use_optimizer(self, choice: OptimizerChoice,
                      built: torch.optim.Optimizer | None = None) -> None:
        """Train with ``choice`` from now on: ``built`` (its state goes on), else a new one."""
        decay = decay_for(choice, self.cfg.weight_decay)
        self.optimizer = built if built is not None else make_optimizer(
            choice.name, decay_groups(self.model, decay), choice.lr, self.cfg.momentum, decay)
        self.guard.optimizer = self.optimizer
        self.choice, self.lr = choice, choice.lr

    def use_users(self, optimizer: torch.optim.Optimizer) -> None:
        """Train with the user's own ``optimizer`` (over every parameter of the model)."""
        mine = {id(p) for p in self.model.parameters()}
        theirs = {id(p) for group in optimizer.param_groups for p in group["params"]}
        if not mine <= theirs:
            raise ValueError("optimizer: the optimizer given must hold every parameter of "
                             "the strategy's model (build it from model.parameters())")
        self.optimizer = self.guard.optimizer = optimizer
        lr = float(optimizer.param_groups[0]["lr"])
        self.choice, self.lr, self.lr_given = (
            OptimizerChoice(type(optimizer).__name__, lr, "user"), lr, True)

    def choose_optimizer(self, server_round: int, rng: np.random.Generator
                         ) -> Continuation | None:
        """The optimizer probe (:func:`~.optimizer_choice.probe`) from this trainer."""
        self.races.count += 1
        return probe(self, server_round, rng)

    # ------------------------------------------------------------------ one round
    def train_round(self, server_round: int, fresh: list[Upload], stored_before: int) -> float:
        """A data round's steps (the schedule's), rolled back where they go non-finite.

        Raw columns and targets train standardised (:mod:`.input_scale`, :mod:`.output_scale`).
        """
        adaptive = self.schedule is not None
        scales = ((self.input_scale, self.output_scale) if adaptive and self.cv is None
                  and self.comp_codec is None and self.cfg.server_processes == 1 else None)

        def steps() -> float:  # batch norms' statistics follow the steps (model_ops)
            with standardised(self.model, self.data, scales), tracked_statistics(self.model):
                return (self.train_adaptive(server_round, fresh, stored_before) if adaptive
                        else self.train_steps(server_round, fresh))

        return self._guarded(server_round, [u.node for u in fresh], steps)

    def train_gradient(self, server_round: int, grad: np.ndarray | None,
                       losses: list[float], nodes: list[int]) -> float:
        """A gradient round's steps: one with ``grad`` (if any), the others on the store.

        Returns the store steps' mean loss, else ``losses``' (bounded); NaN if rolled back.
        """
        def steps() -> float:
            if grad is not None:
                self.model.train()
                apply_flat_grad(self.model, self.optimizer, grad)
            later = self.store_steps(server_round, self.cfg.server_steps - (grad is not None))
            return _mean(later or losses)

        return self._guarded(server_round, nodes, steps)

    def _guarded(self, server_round: int, nodes: list[int], steps: Callable[[], float]
                 ) -> float:
        """``steps()``'s loss; NaN where they failed (rolled back, :meth:`StepGuard.run`)."""
        with torch_threads(self.compute().threads):
            loss, failure = self.guard.run(steps)
        if failure is None:
            return loss
        self.rolled_back += 1
        log_round("dq", server_round, f"the round's steps {failure}: rolled back; the round's "
                  f"replies came from nodes {sorted(nodes)}")
        return float("nan")

    def compute(self) -> StepCompute:
        """``server-threads`` and ``server-autocast``, resolved once the samples' shape is known."""
        spec, cfg = self.data.spec, self.cfg
        if self.auto_step is None and spec:
            self.auto_step = step_compute(
                self.model, self.data.shaped(placeholder_rows(spec)[0]), cfg.server_batch_size,
                cfg.server_threads, cfg.server_autocast, tokens=spec.target == "tokens")
        return self.auto_step or StepCompute.uncounted(cfg.server_threads, cfg.server_autocast)

    # ------------------------------------------------------------------ the steps
    def delta_norms(self, uploads: list[Upload]) -> list[tuple[float, float]]:
        """Per upload with a compensation, its norm and its rows' own gradient norm.

        The gradient is the server's, on the reply's quantized rows, the model in eval mode;
        ``(0, 0)`` for an upload without a compensation.
        """
        was_training = self.model.training
        self.model.eval()
        try:
            with torch_threads(self.compute().threads):
                out = [self._delta_norm(u) for u in uploads]
        finally:
            self.model.train(was_training)
        return out

    def _delta_norm(self, u: Upload) -> tuple[float, float]:
        """One upload's compensation norm and its rows' own gradient norm (0s without one)."""
        if u.delta is None or not len(u.batch):
            return 0.0, 0.0
        n = len(u.batch)
        grad = weighted_loss_grad(self.model, self.data.shaped(u.x), u.batch.labels,
                                  np.full(n, 1.0 / n, np.float32), self.loss_fn)[1]
        return (float(np.linalg.norm(u.delta.astype(np.float64))),
                float(np.linalg.norm(grad.astype(np.float64))))

    def fresh_gradient(self, fresh: list[Upload]) -> tuple[float, np.ndarray]:
        """Gradient of the first step: fresh quantized batch plus mean compensation.

        With ``N = sum_k n_k`` candidates, it is ``(1/N) sum_i grad f(Q(x_i)) / pi_i +
        sum_k (n_k / N) delta_k``: the Horvitz-Thompson estimate of the candidates' mean
        gradient, exact at the true points when the compensation codec is lossless.
        """
        total = float(sum(u.candidates for u in fresh))
        keep = [np.ones(len(u.batch), dtype=bool) if u.holdout is None else ~u.holdout
                for u in fresh]  # held-out rows are never trained on
        parts = [(u.x[k], u.batch.labels[k], u.batch.weights[k])
                 for u, k in zip(fresh, keep, strict=True)]
        xs, ys, ws = (np.concatenate(p) for p in zip(*parts, strict=True))
        ws = ws / total
        loss, grad = weighted_loss_grad(self.model, self.data.shaped(xs), ys, ws, self.loss_fn)
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

    def train_steps(self, server_round: int, fresh: list[Upload]) -> float:
        """The fresh compensated step, then store steps (whatever replies the round got)."""
        self.model.train()
        losses, steps = [], self.cfg.server_steps
        if sum(len(u.batch) for u in fresh):
            loss, grad = self.fresh_gradient(fresh)
            losses.append(loss)
            apply_flat_grad(self.model, self.optimizer, grad)
            steps -= 1
        return _mean(losses + self.store_steps(server_round, steps))

    def store_steps(self, server_round: int, steps: int,
                    rng: np.random.Generator | None = None,
                    augment: Callable[[torch.Tensor], torch.Tensor] | None = None,
                    sharded: bool = True) -> list[float]:
        """``steps`` steps on store minibatches, their losses (``sharded``: on the workers)."""
        rng = self.batch_rng(server_round) if rng is None else rng
        store = self.data.store
        if store is None or len(store) == 0:
            return []
        if sharded and self.cfg.server_processes > 1 and steps > 0:
            return sharded_steps(self, steps, rng, augment)
        self.model.train()
        losses, correction = [], (self.cv.value() if self.cv else None)
        if augment is None:
            augment = self.augmentation(rng)
        batches = store.draw_batches(steps, self.cfg.server_batch_size, rng,
                                     "importance" if correction is not None else
                                     self.cfg.store_weights, skip=self.excluded)
        plain = (WeightedSteps(self.model, self.optimizer, self.loss_fn,  # no flat gradient
                               self.compute().autocast)
                 if correction is None and self.batch_gradient is weighted_loss_grad else None)
        inputs = self.data.spec is not None and self.data.spec.target == "inputs"
        for x, y, w in batches:
            xb = self.data.shaped(x)
            if augment is not None:
                xb = augment(torch.from_numpy(np.ascontiguousarray(xb))).numpy()
                if inputs:  # an autoencoder's targets are its inputs: shifted alike
                    y = xb.reshape(y.shape)
            if plain is not None:
                losses.append(plain.step(xb, y, w / w.sum()))
                continue
            loss, grad = self.batch_gradient(self.model, xb, y, w / w.sum(), self.loss_fn)
            if correction is not None:  # the control variate: see dq.control_variate
                grad += correction
            losses.append(loss)
            apply_flat_grad(self.model, self.optimizer, grad)
        if plain is not None:
            plain.close()
        return losses

    def batch_rng(self, server_round: int) -> np.random.Generator:
        """The round's store-minibatch stream (its draws and the augmentation's seed)."""
        return round_rng(self.seed, server_round, 0, Purpose.SERVER_BATCHES)

    def augmentation(self, rng: np.random.Generator
                     ) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """The minibatches' augmentation: the user's, else the knob's (seeded from ``rng``).

        ``auto`` shifts no image of float targets: a position or a box read from the image
        would stay where the image moved from.
        """
        if self.user_augment is not None:
            return self.user_augment
        spec = self.data.spec
        if spec is None or spec.target_shape:  # a mask would stay where its image moved from
            return None
        if spec.target == "float" and self.cfg.augmentation == "auto":
            return None
        return augmentation_for(self.cfg.augmentation, tuple(spec.sample_shape), rng)

    # ------------------------------------------------------------------ the adaptive schedule
    def train_adaptive(self, server_round: int, fresh: list[Upload],
                       stored_before: int) -> float:
        """Train to a plateau when the store grew enough, then let the schedule size the next ask.

        The gain of the phase's best model over the one it started from, paired on every
        held-out row, feeds the schedule (none for the first upload round); a significantly
        worse new model is dropped for the previous one.
        """
        assert self.schedule is not None
        self.last_phase, self.reverted = None, False
        store = self.data.store
        compensated = any(u.delta is not None for u in fresh)  # a step however few rows
        if store is None or store.num_train == 0:
            return float("nan")
        grew = compensated or self.schedule.grew_enough(  # a full store still changes
            sum(len(u.batch) for u in fresh), len(store))
        if not (grew or self.idle.due()):  # idle: see .idle_rounds
            return float("nan")
        rng = self.batch_rng(server_round)
        # the compensated step on the fresh rows, queued (only with compensations)
        first = [self.fresh_gradient(fresh)] if self.comp_codec is not None and compensated else []
        start = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        # optimizer auto: probe the candidates on the held-out rows; the winner goes on
        probe = self.choose_optimizer(server_round, rng) if probe_due(self) else None
        self.model.train()
        phase = self.run_phase(store.num_train, rng, first, resume=probe)
        excluded = set(self.screen.excluded)
        if grew and self.screen.review(server_round, self.score_holdout(everyone=True)):
            phase = rerun_phase(self, server_round, phase, start, excluded, rng)
        self.last_phase = phase
        assert phase.final is not None and phase.initial is not None
        if not grew:
            self.idle.judge(phase, self.model, start, self.plateau.evidence, len(store))
            self.node_fit = phase.final.node_loss()
            return _mean(phase.losses)
        self.idle.grown(len(store), self.schedule.min_growth)
        gain = None
        if stored_before > 0:
            gain = paired_gain(phase.initial, phase.final)
            if significantly_worse(gain):
                self.model.load_state_dict(start)
                self.reverted = True
                if self.choice is not None and self.choice.source == "held-out":
                    self.choice = None  # chosen on fewer rows: the next phase probes anew
        # held-out rows a comparison needs to show the curve flat: per class (or in all)
        self.schedule.min_rows = self.cfg.min_holdout_rows * max(int(self.data.num_classes or 1), 1)
        if self.cfg.uploads_all:  # the asks are every row left, whatever the curve
            self.schedule.curve.append({"stored": float(self.data.stored)})
        else:
            self.schedule.after_upload(stored_before, self.data.stored, gain)
        self.node_fit = (phase.initial if self.reverted else phase.final).node_loss()
        return _mean(phase.losses)

    def run_phase(self, train_rows: int, rng: np.random.Generator,
                  queued: list[tuple[float, np.ndarray]],
                  evaluate: Callable[[], HeldOutScores] | None = None,
                  resume: Continuation | None = None) -> PhaseResult:
        """One phase on ``train_rows`` rows (``queued`` first; ``resume``: from a probe)."""
        if self.cfg.server_processes > 1:
            return sharded_phase(self, train_rows, rng, queued, resume)
        # one augmentation per phase, seeded from its minibatch stream (or the probe's)
        augment = self.augmentation(rng) if resume is None else resume.augment
        rule = self.plateau.for_rows(train_rows, self.cfg.server_batch_size,
                                     self.cfg.max_server_epochs)
        return train_phase(self.model, self.optimizer, self.lr, rule,
                           lambda n: self.phase_steps(n, rng, queued, augment),
                           evaluate or self.score_holdout,
                           start=None if resume is None else resume.start)

    def phase_steps(self, count: int, rng: np.random.Generator,
                    queued: list[tuple[float, np.ndarray]],
                    augment: Callable[[torch.Tensor], torch.Tensor] | None) -> list[float]:
        """``count`` optimizer steps: queued gradients first, then minibatches of the store."""
        losses: list[float] = []
        while queued and len(losses) < count:
            loss, grad = queued.pop()
            apply_flat_grad(self.model, self.optimizer, grad)
            losses.append(loss)
        return losses + self.store_steps(0, count - len(losses), rng, augment, sharded=False)

    @property
    def finished(self) -> bool:
        """No more asks (exhausted or flat, ``probe-after`` 0) nor phases on the rows stored."""
        return self.schedule is not None and self.schedule.finished and self.idle.spent

    @property
    def excluded(self) -> frozenset[int]:
        """Clients the agreement screen excluded: not trained on, nor scored, nor asked."""
        return frozenset(self.screen.excluded)

    def score_holdout(self, everyone: bool = False) -> HeldOutScores:
        """Per-row loss and correctness on the held-out rows (excluded clients: if ``everyone``)."""
        assert self.data.store is not None
        parts, skip = [], np.array(sorted(self.excluded) if not everyone else [], dtype=np.uint64)
        hits = not weighs_classes(self.loss_fn)  # a class-weighted loss judges by itself
        for x, y, _, node_ids, _ in self.data.store.holdout_batches():
            if skip.size and not (keep := ~np.isin(node_ids, skip)).all():
                x, y, node_ids = x[keep], y[keep], node_ids[keep]
            if len(y):
                loss, hit = per_sample_results(self.model, self.data.shaped(x), y, self.loss_fn,
                                               floors=self.floors)
                parts.append(self.floors.scores(loss, hit if hits else None, node_ids))
        return HeldOutScores.concat(parts)

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The schedule, the per-node fit of the last phase and the rollback count."""
        return {"schedule": None if self.schedule is None else self.schedule.state(),
                "node_fit": dict(self.node_fit), "rolled_back": self.rolled_back,
                "node_screen": self.screen.state(), "idle": self.idle.state(),
                "optimizer_choice": None if self.choice is None else self.choice.state(),
                "lr": self.lr, "lr_given": self.lr_given, "input_scale": self.input_scale.state(),
                "probes": self.races.count,
                "output_scale": self.output_scale.state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`state_dict` (the optimizer rebuilt as chosen, its state empty)."""
        if self.choice is None or self.choice.source != "user":  # the user's own stays
            if "optimizer_choice" not in state:
                name = "sgd" if self.cfg.optimizer == AUTO else self.cfg.optimizer
                self.use_optimizer(OptimizerChoice(name, self.lr, "checkpoint"))
            elif state["optimizer_choice"] is not None:
                self.use_optimizer(OptimizerChoice.from_state(state["optimizer_choice"]))
            self.lr = float(state.get("lr", self.lr))
            self.lr_given = bool(state.get("lr_given"))
        self.rolled_back = int(state.get("rolled_back", 0))
        self.races = Races(int(state.get("probes", 1)))  # older checkpoints: one probe ran
        if self.schedule is not None and state.get("schedule") is not None:
            self.schedule.load_state(state["schedule"])
        self.node_fit = {int(k): float(v) for k, v in state.get("node_fit", {}).items()}
        self.screen.load_state(state.get("node_screen"))
        self.idle.load_state(state.get("idle"))
        self.input_scale.load_state(state.get("input_scale"))
        self.output_scale.load_state(state.get("output_scale"))


def _mean(losses: list[float]) -> float:
    """The mean loss (NaN for none)."""
    return float(np.mean(losses)) if losses else float("nan")

#: A store step's minibatch gradient: ``(model, x, y, w, loss_fn) -> (loss, flat grad)``.
BatchGradient = Callable[[torch.nn.Module, np.ndarray, np.ndarray, np.ndarray,
                          "LossFn | None"], tuple[float, np.ndarray]]
