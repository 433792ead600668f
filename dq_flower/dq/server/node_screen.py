"""A screen of one node's data: labels that disagree with every other node's.

:class:`AgreementScreen` (adaptive schedule): a client whose held-out error (float targets:
loss relative to the median's, :func:`excess`, the loss of a client whose targets are larger
than the median client's read at the median's scale, :func:`scale_factors`) exceeds the
median client's by more than
``screen-margin`` and :data:`Z_ROBUST` robust standard deviations (MAD over the clients,
and the binomial error of its own rows) is **excluded** from training, scoring and asks
(its rows stay stored); it is restored when its excess under the model trained without it
falls under half the margin. Copied rows are screened by :mod:`.near_copies`. The screen
cannot tell a faulty device from a hostile one.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from dq_flower.dq.server.federation import FederationData
from dq_flower.dq.server.plateau import HeldOutScores, PhaseResult
from dq_flower.server.common import log_round

__all__ = ["AgreementScreen", "NodeVerdict", "excess", "rerun_phase", "scale_factors",
           "Z_ROBUST", "MIN_ROWS", "MIN_NODES"]

#: Robust standard deviations (1.4826 MAD over the clients) a client's excess must exceed.
Z_ROBUST = 4.0
#: Held-out rows a client needs before the agreement screen judges it.
MIN_ROWS = 10
#: Clients with enough held-out rows the agreement screen needs to judge any of them.
MIN_NODES = 3
#: Reviews :class:`AgreementScreen` keeps (each one's verdicts, for the record).
KEPT_REVIEWS = 20
#: Float targets: standard errors, and share of their mean, by which the other clients'
#: held-out loss must fall without a client for its exclusion to stand.
Z_HARM = 2.0
MIN_HARM = 0.02
#: Float targets: how much higher (relative to the median) a cleared client's loss must be
#: to be judged again.
REJUDGE = 1.5


@dataclass(frozen=True)
class NodeVerdict:
    """One client's held-out figure against the median client's."""

    node: int
    rows: int
    error: float  # held-out error (class targets) or mean loss (float targets)
    median: float
    excess: float  # see :func:`excess`
    bound: float  # the excess beyond which the client is excluded


def excess(value: float, median: float, classes: bool) -> float:
    """How far a client's held-out figure is above the median client's.

    Class targets: the error difference. Float targets: ``1 - median / value`` (0.5 is twice
    the median's loss).
    """
    if classes:
        return value - median
    return 0.0 if value <= median or value <= 0 else 1.0 - median / value


def scale_factors(scores: HeldOutScores, nodes: list[int]) -> dict[int, float]:
    """Float targets: what each of ``nodes``' held-out losses is multiplied by.

    A node's *scale* is its rows' mean :attr:`~.plateau.HeldOutScores.scale` (the loss of
    outputs at each row's level: a window's variance under a squared error). The loss of a
    node whose scale is above the median node's is read at the median's, ``median /
    scale``: a node of larger targets (a machine vibrating at 4 g beside others at 1 g) is
    allowed a loss as much larger; the others' is read as it is (an error on targets of
    little spread is no fault). No scales (a table's few targets a row): 1 each.
    """
    if scores.scale is None:
        return {}
    scale = {n: float(scores.scale[scores.nodes == n].mean()) for n in nodes}
    sized = [v for v in scale.values() if math.isfinite(v) and v > 0]
    middle = float(np.median(sized)) if sized else 0.0
    return {n: middle / v for n, v in scale.items()
            if math.isfinite(v) and middle > 0 and v > middle}


def _rows(scores: HeldOutScores, out: Any) -> HeldOutScores:
    """``scores`` without the rows of the clients ``out`` (float targets)."""
    keep = ~np.isin(scores.nodes, np.array(sorted(out), dtype=scores.nodes.dtype))
    floor, scale = scores.floor, scores.scale
    return HeldOutScores(scores.loss[keep], None, scores.nodes[keep],
                         None if floor is None else floor[keep],
                         None if scale is None else scale[keep])


def _at_scale(kept: HeldOutScores, after: HeldOutScores) -> tuple[np.ndarray, np.ndarray] | None:
    """Per row, its loss in ``kept`` and in ``after`` (the same rows), at one scale.

    Each client's rows are read at the median's scale (:func:`scale_factors`) and weigh
    alike in a mean; ``None``: the rows differ.
    """
    if not np.array_equal(after.nodes, kept.nodes) or kept.loss.size < 2:
        return None
    nodes, counts = np.unique(kept.nodes, return_counts=True)
    factor = scale_factors(kept, [int(n) for n in nodes])
    weight = np.ones(kept.loss.size)
    for node, count in zip(nodes.tolist(), counts.tolist(), strict=True):
        weight[kept.nodes == node] = factor.get(node, 1.0) * kept.loss.size / (len(nodes) * count)
    return kept.excess * weight, after.excess * weight


def _fell(before: np.ndarray, after: np.ndarray, mean: float) -> tuple[bool, float, float]:
    """Whether ``after`` is below ``before``, paired row by row; the fall and its stderr.

    Below by more than :data:`Z_HARM` standard errors and :data:`MIN_HARM` of ``mean``.
    """
    diff = before - after
    gain, stderr = float(diff.mean()), float(diff.std(ddof=1) / math.sqrt(diff.size))
    return gain > Z_HARM * stderr and gain > MIN_HARM * mean, gain, stderr


@dataclass
class AgreementScreen:
    """Clients excluded from training because their held-out rows disagree with the others'.

    ``margin``: the least excess (:func:`excess`) over the median client that excludes a
    client (0: off).
    """

    margin: float = 0.4
    excluded: dict[int, str] = field(default_factory=dict)
    #: float targets: clients :meth:`confirm` cleared, with their loss over the median's then
    cleared: dict[int, float] = field(default_factory=dict)
    #: per review, every judged client's verdict (the last :data:`KEPT_REVIEWS`)
    reviews: list[dict[str, Any]] = field(default_factory=list)
    #: float targets: the clients the last review excluded only by their targets' scale
    loud: set[int] = field(default_factory=set)

    def verdicts(self, scores: HeldOutScores, scaled: bool = False) -> list[NodeVerdict]:
        """Each client's held-out figure against the median (empty: too few to judge).

        ``scaled``: float targets' losses read at the scales of :func:`scale_factors`.
        """
        classes = scores.correct is not None
        judged = [int(n) for n in np.unique(scores.nodes) if (scores.nodes == n).sum() >= MIN_ROWS]
        factor = scale_factors(scores, judged) if scaled and not classes else {}
        figures: dict[int, tuple[float, int, float]] = {}
        for node in judged:
            mine = scores.nodes == node
            rows = int(mine.sum())
            if classes:
                assert scores.correct is not None
                err = 1.0 - float(scores.correct[mine].mean())
                spread = math.sqrt(max(err * (1 - err), 1.0 / rows) / rows)
            else:
                loss = scores.excess[mine].astype(np.float64) * factor.get(node, 1.0)
                err = float(loss.mean())
                spread = float(loss.std(ddof=1) / math.sqrt(rows)) / max(err, 1e-12)
            figures[int(node)] = (err, rows, spread)
        if len(figures) < MIN_NODES:
            return []
        values = np.array([f[0] for f in figures.values()])
        middle = float(np.median(values))
        ex = np.array([excess(v, middle, classes) for v in values])
        mad = 1.4826 * float(np.median(np.abs(ex - np.median(ex))))
        return [NodeVerdict(node, rows, err, middle, excess(err, middle, classes),
                            max(self.margin, Z_ROBUST * math.hypot(mad, spread)))
                for node, (err, rows, spread) in figures.items()]

    def review(self, server_round: int, scores: HeldOutScores) -> bool:
        """Exclude and restore clients from the scores of every held-out row (True: changed).

        With float targets a client cleared by :meth:`confirm` is judged again only once
        its loss, relative to the median client's, is :data:`REJUDGE` times what it was. A
        client out of bounds only by its targets' scale (within them read at the median's,
        :func:`scale_factors`) is *loud*: excluded only in a review that excludes and
        restores no other client, and kept by :meth:`confirm` unless leaving it out helps
        the clients read at one scale.
        """
        if self.margin <= 0:
            return False
        changed = False
        verdicts = self.verdicts(scores)
        new = {v.node for v in verdicts
               if not self._waits(v) and v.node not in self.excluded and v.excess > v.bound}
        loud = set() if scores.correct is not None or scores.scale is None or not new else new & {
            v.node for v in self.verdicts(scores, scaled=True) if v.excess <= v.bound}
        back = any(not self._waits(v) and v.node in self.excluded
                   and v.excess < self.margin / 2 for v in verdicts)
        self.loud = loud if loud == new and not back else set()  # alone: confirm checks them
        for v in verdicts:
            if self._waits(v):
                continue
            if v.node in new - (loud - self.loud):
                self.excluded[v.node] = (
                    f"held-out error {v.error:.3g} against the median client's {v.median:.3g} "
                    f"on {v.rows} rows (excess {v.excess:.3g} > {v.bound:.3g})")
                changed = True
                log_round("dq", server_round, f"client {v.node} excluded from training and "
                          f"asks: its rows disagree with the other clients' "
                          f"({self.excluded[v.node]}): a faulty device (wrong labels or "
                          "data) or a hostile one; its rows stay in the store")
            elif v.node in self.excluded and v.excess < self.margin / 2:
                del self.excluded[v.node]
                changed = True
                log_round("dq", server_round, f"client {v.node} restored: its held-out "
                          f"error {v.error:.3g} is within {self.margin / 2:g} of the median "
                          f"client's {v.median:.3g} under the model trained without it")
        self.reviews = [*self.reviews, {"round": int(server_round), "verdicts": [
            [v.node, v.rows, v.error, v.median, v.excess, v.bound] for v in verdicts]}
        ][-KEPT_REVIEWS:]
        return changed

    def _waits(self, v: NodeVerdict) -> bool:
        """Whether ``v``'s client was cleared and its loss has not grown enough since."""
        cleared = self.cleared.get(v.node)
        return cleared is not None and v.error < REJUDGE * cleared * v.median

    def confirm(self, server_round: int, new: set[int], kept: HeldOutScores,
                without: HeldOutScores, everyone: HeldOutScores | None = None) -> bool:
        """Whether leaving the clients ``new`` out helped the others (float targets).

        ``kept``: the held-out scores under the model trained with them; ``without``: under
        the model trained again without them (``everyone``: of every client's rows). Loud
        clients (:meth:`review`) stay out where every client's loss, read at the median's
        scale (:func:`scale_factors`), themselves included, fell by more than
        :data:`Z_HARM` standard errors and :data:`MIN_HARM` of its mean (each client
        weighing alike): noise in large targets drowning the others' training; else they
        are cleared, their targets larger than the others', not in disagreement. Others'
        exclusion stands where the other clients' held-out loss fell by as much (paired on
        the same rows); else it is undone and the clients are cleared: their loss is high
        because their own data is harder or noisier (a region no other client holds), not
        because it disagrees with anyone's.
        """
        if new and new <= self.loud and everyone is not None:
            rest = _rows(everyone, self.excluded.keys() - new)
            at_scale = _at_scale(kept, rest)
            if at_scale is None:
                return True
            harm = _fell(*at_scale, float(at_scale[0].mean()))[0]
            agree = {v.node for v in self.verdicts(rest, scaled=True)
                     if v.node in new and v.excess <= v.bound}
            for node in sorted(new if not harm else agree):
                self._clear(server_round, node, "its loss is high by its targets' scale alone, "
                            "and " + ("the model trained without it fits it as well as the "
                                      "others, read at their scale" if node in agree else
                                      "leaving it out did not help the clients read at one "
                                      f"scale (their held-out loss {at_scale[0].mean():.4g} "
                                      f"with it, {at_scale[1].mean():.4g} without)"))
            return harm and new > agree
        others = ~np.isin(kept.nodes, np.array(sorted(new), dtype=kept.nodes.dtype))
        before, after = kept.loss[others].astype(np.float64), without.loss.astype(np.float64)
        if before.shape != after.shape or before.size < 2:
            return True
        fell, gain, stderr = _fell(before, after, float(kept.excess[others].mean()))
        if fell:
            return True
        for node in sorted(new):
            self._clear(server_round, node, f"leaving it out did not help the other clients "
                        f"(their held-out loss {before.mean():.4g} with it, {after.mean():.4g} "
                        f"without, a change of {gain:+.3g} +- {stderr:.2g}): its data is "
                        "harder or noisier, not in disagreement")
        return False

    def _clear(self, server_round: int, node: int, why: str) -> None:
        """Undo ``node``'s exclusion; judged again once its loss ratio grows :data:`REJUDGE`x."""
        del self.excluded[node]
        ratio = next((v[2] / v[3] for v in self.reviews[-1]["verdicts"] if v[0] == node
                      and v[3] > 0), 1.0) if self.reviews else 1.0
        self.cleared[node] = float(ratio)
        log_round("dq", server_round, f"client {node} kept: {why}; judged again only once "
                  f"its loss is {REJUDGE:g} times its {ratio:.3g} times the median's")

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps."""
        return {"excluded": dict(self.excluded), "reviews": [dict(r) for r in self.reviews],
                "cleared": dict(self.cleared)}

    def load_state(self, state: dict[str, Any] | None) -> None:
        """Inverse of :meth:`state` (an older checkpoint: nobody excluded)."""
        state = state or {}
        self.excluded = {int(n): str(r) for n, r in state.get("excluded", {}).items()}
        self.reviews = [dict(r) for r in state.get("reviews", [])]
        self.cleared = {int(n): float(r) for n, r in state.get("cleared", {}).items()}


class Screened(Protocol):
    """What :func:`rerun_phase` uses of the server's trainer (:class:`~.training.ServerTrainer`)."""

    data: FederationData
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    screen: AgreementScreen

    def run_phase(self, train_rows: int, rng: np.random.Generator,  # noqa: D102
                  queued: list[tuple[float, np.ndarray]]) -> PhaseResult: ...

    def score_holdout(self, everyone: bool = False) -> HeldOutScores: ...  # noqa: D102


def rerun_phase(trainer: Screened, server_round: int, phase: PhaseResult,
                start: dict[str, torch.Tensor], excluded: set[int],
                rng: np.random.Generator) -> PhaseResult:
    """A client excluded or restored: ``trainer``'s phase again from its start, without it.

    Float targets, clients only excluded: the exclusion stands where it helped the others
    and the clients' loss under the model trained without them, read at their targets'
    scale, is still out of bounds (:meth:`AgreementScreen.confirm`).
    """
    store, screen, model = trainer.data.store, trainer.screen, trainer.model
    assert store is not None and phase.final is not None
    new = set(screen.excluded) - excluded
    check = bool(new) and excluded <= set(screen.excluded) and phase.final.correct is None
    kept = ((copy.deepcopy(model.state_dict()),
             copy.deepcopy(trainer.optimizer.state_dict()), phase) if check else None)
    model.load_state_dict(start)
    model.train()
    steps = phase.steps
    phase = trainer.run_phase(store.num_train, rng, [])
    phase.steps += steps
    if kept is not None and kept[2].final is not None and phase.final is not None \
            and not screen.confirm(server_round, new, kept[2].final, phase.final,
                                   trainer.score_holdout(everyone=True)  # loud: read at scale
                                   if new <= screen.loud else None):
        model.load_state_dict(kept[0])
        trainer.optimizer.load_state_dict(kept[1])
        total, phase = phase.steps, kept[2]
        phase.steps = total
    return phase
