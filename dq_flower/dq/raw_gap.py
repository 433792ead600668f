"""The model's losses on the same rows raw and coded: the paired gap both ends judge by.

A node given the model compares its own rows (:mod:`dq_flower.dq.client.fidelity`); the
server compares the reference rows nodes without the model sent it
(:mod:`dq_flower.dq.server.reference_rows`). Both read a gap by one rule (:attr:`Gap.clear`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from dq_flower.losses import per_row
from dq_flower.model_ops import (
    LossFn,
    float_dtype,
    inference,
    model_input,
    model_output,
    resolve_loss,
    targets_tensor,
)

__all__ = ["Gap", "RATIO", "T_MIN", "row_losses", "paired"]

#: Raw rows read clearly worse: a mean loss over :data:`RATIO` times the codes' (a gap that
#: matters, half as much loss again) and a paired t of the differences over :data:`T_MIN`
#: (one-sided, about 1 in 700 under no difference for near-normal differences of 64 rows)
RATIO, T_MIN = 1.5, 3.0


class Gap(NamedTuple):
    """The model's mean losses on the same rows raw and coded, and the paired t."""

    raw: float
    coded: float
    rows: int
    t: float

    @property
    def clear(self) -> bool:
        """Raw rows read clearly worse: :data:`RATIO` times the loss and t over :data:`T_MIN`."""
        return self.raw > RATIO * self.coded and self.t > T_MIN


def row_losses(model: torch.nn.Module, rows: tuple[np.ndarray, ...], y: np.ndarray,
               sample_shape: tuple[int, ...], loss_fn: LossFn | None) -> list[np.ndarray] | None:
    """The model's per-row losses on each of ``rows`` (flat rows, the same targets ``y``).

    ``None`` where a loss is not finite.
    """
    shape = (-1, *sample_shape)
    fn, dev, dtype = resolve_loss(loss_fn), next(model.parameters()).device, float_dtype(model)
    with inference(model):
        target = targets_tensor(y, dev)
        losses = [per_row(fn, model_output(model(model_input(r.reshape(shape), dev, False,
                                                              dtype))), target)
                  .double().cpu().numpy() for r in rows]
    return losses if all(np.isfinite(v).all() for v in losses) else None


def paired(raw: np.ndarray, coded: np.ndarray) -> Gap:
    """The :class:`Gap` of per-row losses ``raw`` and ``coded`` of the same rows."""
    diff = raw - coded
    spread = float(diff.std(ddof=1)) / np.sqrt(diff.size) if diff.size > 1 else 0.0
    return Gap(float(raw.mean()), float(coded.mean()), int(diff.size),
               float(diff.mean()) / spread if spread > 0 else 0.0)
