"""The model's losses on the same rows raw and coded: the paired gap both ends judge by.

A node given the model compares its own rows (:mod:`dq_flower.dq.client.fidelity`); the
server compares the reference rows nodes without the model sent it
(:mod:`dq_flower.dq.server.reference_rows`). Both read a gap by one rule (:attr:`Gap.clear`).

Rows that are their own targets (an autoencoder's) read no worse raw by their loss: a model
trained on codes learns to give back what it is given, the codes' error included, and so
reconstructs raw rows well, and the anomalies it is meant to miss as well as the rest (a
convolutional autoencoder of vibration windows at 2 bits: its raw rows' loss lower than a
model trained on them raw, its ROC AUC over faults 0.61 against 0.87). What shows it is the
share of the codes' error the model passes on, :func:`row_gains` (:class:`Gain`): about a
quarter for a model that learned the rows (a bottleneck filters what is not like them),
near all of it for one that learned the codes.
"""

from __future__ import annotations

import math
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

__all__ = ["Gap", "Gain", "RATIO", "T_MIN", "GAIN_MAX", "row_losses", "row_gains", "paired",
           "gained"]

#: Raw rows read clearly worse: a mean loss over :data:`RATIO` times the codes' (a gap that
#: matters, half as much loss again) and a paired t of the differences over :data:`T_MIN`
#: (one-sided, about 1 in 700 under no difference for near-normal differences of 64 rows)
RATIO, T_MIN = 1.5, 3.0
#: Rows that are their own targets: the model passes on clearly more than this share of the
#: codes' error (a mean over rows, its t over :data:`T_MIN`): it learned the error as data
GAIN_MAX = 0.5


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


class Gain(NamedTuple):
    """The mean share of the codes' error the model passes on, per row, and its t."""

    gain: float
    rows: int
    t: float

    @property
    def clear(self) -> bool:
        """Over :data:`GAIN_MAX` with a t (against it) over :data:`T_MIN`."""
        return self.gain > GAIN_MAX and self.t > T_MIN


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


def row_gains(model: torch.nn.Module, raw: np.ndarray, coded: np.ndarray,
              sample_shape: tuple[int, ...]) -> np.ndarray | None:
    """Each row's ``|f(coded) - f(raw)|^2 / |coded - raw|^2`` (flat rows; ``f`` the model).

    Rows their codes leave as they were are left out; ``None`` where no row is left or an
    output is not finite.
    """
    shape = (-1, *sample_shape)
    dev, dtype = next(model.parameters()).device, float_dtype(model)
    with inference(model):
        out = [model_output(model(model_input(r.reshape(shape), dev, False, dtype)))
               .reshape(len(r), -1).double().cpu().numpy() for r in (raw, coded)]
    error = ((coded.astype(np.float64) - raw) ** 2).sum(axis=1)
    passed, kept = ((out[1] - out[0]) ** 2).sum(axis=1), error > 0
    if not kept.any() or not np.isfinite(passed).all():
        return None
    return passed[kept] / error[kept]


def gained(gains: np.ndarray) -> Gain:
    """The :class:`Gain` of per-row shares ``gains`` (:func:`row_gains`).

    Equal shares of several rows: a t as large as it gets.
    """
    spread = float(gains.std(ddof=1)) / np.sqrt(gains.size) if gains.size > 1 else 0.0
    mean, excess = float(gains.mean()), float(gains.mean()) - GAIN_MAX
    if spread > 0:
        t = excess / spread
    elif gains.size > 1 and excess:
        t = math.copysign(math.inf, excess)
    else:
        t = 0.0
    return Gain(mean, int(gains.size), t)
