"""The least loss each held-out row's target allows: float targets whose loss has an offset.

A loss written as a negative log-likelihood without its constant (``nn.PoissonNLLLoss()``:
``exp(o) - y o``, below zero for a count of 2 or more near its rate) has no floor at zero,
and every figure the server reads against the held-out loss (the gain of an upload relative
to the loss before, a phase's fall of 1%, a client's fit that sizes its ask) reads the
offset instead: a user's Poisson count app logged gains of 6e10 per doubling of its store
(its mean loss below zero), never found its learning curve flat and asked for every row.
The *floor* of a row is the least loss an output reaches for its target: of the model's own
outputs, the target itself where it fits the outputs' shape (a squared, absolute, Huber or
pinball error: 0) and outputs descended by L-BFGS on the loss. The run's first held-out rows
decide once whether its loss has an offset (their mean floor off zero by more than
:data:`OFFSET_SHARE` of their mean loss); only then are floors kept (per target, cached) and
those figures read against the loss above them (Poisson: half the deviance).

A row of :data:`SIGNAL_VALUES` float targets or more (a window, an image, a sequence) also
gets its *scale*: the loss above its floor of outputs at the row's mean target (a squared
error: the variance of its values about their level; a shift moves none), which the
agreement screen reads a node's loss against (:func:`.node_screen.scale_factors`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from dq_flower.dq.server.plateau import HeldOutScores
from dq_flower.losses import HEADS_ATTR

__all__ = ["LossFloors", "OFFSET_SHARE", "ITERATIONS", "SIGNAL_VALUES"]

#: Mean floor, as a share of the mean loss, beyond which a loss has an offset.
OFFSET_SHARE = 0.01
#: L-BFGS iterations on the outputs of the rows whose floor is not known yet.
ITERATIONS = 50
#: Float targets a row needs for a scale (fewer: a table's targets, of their own units).
SIGNAL_VALUES = 8


def _as_outputs(targets: torch.Tensor, outputs: torch.Tensor) -> torch.Tensor | None:
    """The targets in the outputs' shape (one target a row repeated per output), or ``None``."""
    n = outputs.shape[0]
    t, width = targets.reshape(n, -1), outputs.reshape(n, -1).shape[1]
    if t.shape[1] not in (1, width):
        return None
    return t.expand(n, width).reshape(outputs.shape).to(outputs.dtype)


def _descended(loss: Callable[[torch.Tensor], torch.Tensor], start: torch.Tensor
               ) -> torch.Tensor:
    """Outputs from ``start`` after :data:`ITERATIONS` of L-BFGS on the rows' summed loss."""
    out = start.detach().clone().requires_grad_(True)
    opt = torch.optim.LBFGS([out], max_iter=ITERATIONS, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        total = loss(out).sum()
        total.backward()
        return total

    with torch.enable_grad():
        opt.step(closure)
    return out.detach()


def row_floors(loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
               outputs: torch.Tensor, targets: torch.Tensor) -> np.ndarray:
    """Per row, the least loss of its outputs, its target and the descended outputs."""

    def loss(out: torch.Tensor) -> torch.Tensor:
        return loss_fn(out, targets).reshape(-1)

    with torch.no_grad():
        tries = [loss(outputs)]
        shaped = _as_outputs(targets, outputs)
        if shaped is not None:
            tries.append(loss(shaped))
    if shaped is None or bool((tries[-1] != 0).any()):  # no exact floor (or NaN): descend
        with contextlib.suppress(RuntimeError, ValueError):  # no gradient: the tries so far
            tries.append(loss(_descended(loss, outputs)).detach())
    best = torch.stack([torch.where(torch.isfinite(t), t, torch.inf) for t in tries])
    return best.min(dim=0).values.double().cpu().numpy()


class LossFloors:
    """Per held-out row, its floor (float targets whose loss has an offset; else none).

    :meth:`add` takes each batch as the held-out rows are scored, :meth:`scores` gives
    their :class:`~.plateau.HeldOutScores` with the floors (none where the loss has no offset).
    """

    def __init__(self) -> None:
        self.offset: bool | None = None  # decided on the first held-out rows
        self.known: dict[bytes, float] = {}
        self.pending: list[np.ndarray] = []
        self.level: list[np.ndarray] | None = []  # the loss at each row's level (None: none)

    def add(self, loss_fn: Any, outputs: torch.Tensor, targets: torch.Tensor,
            losses: np.ndarray) -> None:
        """Floors of one scored batch (``losses``: its rows' losses under the model)."""
        if not torch.is_floating_point(targets):
            return
        if getattr(outputs, HEADS_ATTR, None) is not None:  # a loss of several heads:
            self.offset, self.level = False, None  # its floor and level move them all
        rows = targets.reshape(len(losses), -1)
        if self.level is not None and (outputs[:1].numel() != rows.shape[1]
                                       or rows.shape[1] < SIGNAL_VALUES):
            self.level = None
        if self.level is not None:  # the outputs' shape: the model's loss is called so
            level = rows.mean(1, keepdim=True).expand_as(rows).reshape(outputs.shape)
            try:
                with torch.no_grad():
                    at = loss_fn(level.to(outputs.dtype), targets).reshape(len(losses))
                self.level.append(at.double().cpu().numpy())
            except (RuntimeError, ValueError):  # a loss that cannot read such outputs
                self.level = None
        if self.offset is False:
            return
        keys = [row.tobytes() for row in rows.cpu().numpy()]
        new = [i for i, k in enumerate(keys) if k not in self.known]
        if new:
            idx = torch.as_tensor(new, device=outputs.device)
            floors = row_floors(loss_fn, outputs.detach()[idx], targets[idx])
            self.known.update(zip([keys[i] for i in new], floors.tolist(), strict=True))
        floor = np.array([self.known[k] for k in keys])
        if self.offset is None:
            self.offset = bool(np.abs(floor).mean() > OFFSET_SHARE * np.abs(losses).mean())
            if not self.offset:
                self.known.clear()
                return
        self.pending.append(np.minimum(floor, losses))

    def scores(self, loss: np.ndarray, correct: np.ndarray | None, nodes: np.ndarray
               ) -> HeldOutScores:
        """The held-out scores of the rows added since, with their floors where kept."""
        floor = np.concatenate(self.pending) if self.offset and self.pending else None
        scale = None
        if self.level and sum(map(len, self.level)) == len(loss):
            scale = np.concatenate(self.level)
            scale = np.maximum(scale - (0.0 if floor is None else floor), 0.0)
        self.pending, self.level = [], None if self.level is None else []
        return HeldOutScores(loss, correct, nodes, floor, scale)
