"""The server's optimizer and step size: the user's where given, else chosen on held-out rows.

The server trains the user's model on rows it has never seen the scale of: raw tables
(features of about 1,000 beside features of about 1) make SGD with momentum at 0.05
diverge or collapse to the class prior where Adam at 1e-3 learns. So with ``optimizer =
"auto"`` (the default) the first training phase of the adaptive schedule starts with a
probe: each :func:`candidates` entry trains a short phase from the same weights on the same
minibatches, and a later candidate replaces the first (SGD, the documented default) only
where the first went non-finite or the later one's held-out loss is lower beyond the paired
comparison's uncertainty (:func:`pick`). The winner is logged and checkpointed; the phase
then starts again from the same weights with it.

A user's choice is honoured: the ``optimizer`` and ``lr`` knobs, or ``lr`` (also
``learning-rate``) and ``optimizer`` in the ``train_config`` given to ``strategy.start``
(Flower's way to set a step size), where the knobs are at their defaults; a value the
server cannot use is refused with a logged reason (:func:`from_train_config`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dq_flower.config import OPTIMIZERS
from dq_flower.dq.server.schedule import (
    Z_ONE_SIDED,
    HeldOutScores,
    PairedGain,
    paired_gain,
    significantly_worse,
)

__all__ = ["OptimizerChoice", "candidates", "pick", "from_train_config", "AUTO",
           "ADAM_LR", "LR_KEYS"]

#: The ``optimizer`` value that lets the server choose.
AUTO = "auto"
#: Adam's step size where the user gave none (PyTorch's own default).
ADAM_LR = 1e-3
#: ``train_config`` keys read as the server's step size, first found wins.
LR_KEYS = ("lr", "learning-rate", "learning_rate")


@dataclass(frozen=True)
class OptimizerChoice:
    """An optimizer by name and its base step size, and where the choice came from."""

    name: str
    lr: float
    source: str = "knobs"  # knobs, train-config, held-out or default

    def describe(self) -> str:
        """``sgd lr 0.05`` and the like."""
        return f"{self.name} lr {self.lr:g}"

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps."""
        return {"name": self.name, "lr": self.lr, "source": self.source}

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> OptimizerChoice:
        """Inverse of :meth:`state`."""
        return cls(str(state["name"]), float(state["lr"]), str(state.get("source", "knobs")))


def candidates(lr: float, lr_given: bool) -> list[OptimizerChoice]:
    """The probe's optimizers: SGD at ``lr``, then Adam (at ``lr`` where it was given)."""
    return [OptimizerChoice("sgd", lr, "held-out"),
            OptimizerChoice("adam", lr if lr_given else ADAM_LR, "held-out")]


def pick(scores: list[Any]) -> tuple[int, PairedGain | None]:
    """The index of the winning candidate and its paired gain over the first.

    ``scores``: each candidate's held-out scores (``HeldOutScores``, ``None`` where it went
    non-finite). The first stands unless it failed, or a later one has a lower held-out loss
    beyond the paired comparison's uncertainty (the relative loss reduction, row by row,
    one-sided 95%: more telling on a few rows than right or wrong) and is not worse in
    accuracy beyond its own. The gain returned is that relative loss reduction.
    """
    first = scores[0]
    best, best_gain = 0, None
    if not _finite(first):
        finite = [i for i, s in enumerate(scores) if _finite(s)]
        return (finite[0] if finite else 0), None
    for i, s in enumerate(scores[1:], start=1):
        if not _finite(s):
            continue
        gain = paired_gain(_losses(first), _losses(s))  # relative loss, row by row
        if (gain.gain - Z_ONE_SIDED * gain.stderr > 0
                and not significantly_worse(paired_gain(first, s))  # nor worse in accuracy
                and (best_gain is None or gain.gain > best_gain.gain)):
            best, best_gain = i, gain
    return best, best_gain


def _losses(scores: HeldOutScores) -> HeldOutScores:
    """``scores`` compared by their per-row losses alone (no accuracy)."""
    return HeldOutScores(scores.loss, None, scores.nodes)


def _finite(scores: Any) -> bool:
    """Whether a probe left held-out scores with a finite mean loss."""
    return (scores is not None and scores.loss.size > 0
            and math.isfinite(float(scores.loss.mean())))


def from_train_config(config: Mapping[str, Any], knob_optimizer: str, knob_lr: float,
                      default_lr: float) -> tuple[str | None, float | None, list[str]]:
    """The optimizer and step size a ``train_config`` asks of the server, and refusals.

    Returns ``(optimizer or None, lr or None, reasons)``: a value is taken only where the
    matching knob is at its default (``knob_optimizer`` ``auto``, ``knob_lr`` equal to
    ``default_lr``); each value not taken is explained in ``reasons``.
    """
    reasons: list[str] = []
    lr: float | None = None
    name: str | None = None
    key = next((k for k in LR_KEYS if k in config), None)
    if key is not None:
        value = config[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                math.isfinite(float(value)) and float(value) > 0):
            reasons.append(f"train_config {key}={value!r} is not a positive number: the "
                           "server keeps its own step size")
        elif knob_lr != default_lr:
            reasons.append(f"train_config {key}={value!r} is not used: the lr knob "
                           f"({knob_lr:g}) sets the server's step size")
        else:
            lr = float(value)
    if "optimizer" in config:
        value = config["optimizer"]
        text = str(value).lower()
        if text not in OPTIMIZERS:
            reasons.append(f"train_config optimizer={value!r} is not one the server has "
                           f"({', '.join(OPTIMIZERS)}): it chooses its own")
        elif knob_optimizer != AUTO:
            reasons.append(f"train_config optimizer={value!r} is not used: the optimizer "
                           f"knob ({knob_optimizer}) sets it")
        else:
            name = text
    return name, lr, reasons
