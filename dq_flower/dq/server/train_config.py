"""The ``train_config`` given to ``strategy.start``: its optimizer and step size, if usable.

``lr`` (also ``learning-rate``) and ``optimizer`` in the ``train_config`` (Flower's way to
set a step size) set the server's where the knobs are at their defaults; a value the server
cannot use is refused with a logged reason (:func:`from_train_config`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from logging import WARNING
from typing import Any

from flwr.common.logger import log

from dq_flower.config import OPTIMIZERS, knobs_of
from dq_flower.dq.config import DQConfig
from dq_flower.dq.server.optimizer_choice import AUTO, OptimizerChoice, Probed
from dq_flower.server.common import log_round

__all__ = ["LR_KEYS", "from_train_config", "apply_train_config"]

#: ``train_config`` keys read as the server's step size, first found wins.
LR_KEYS = ("lr", "learning-rate", "learning_rate")


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


def apply_train_config(trainer: Probed, config: Mapping[str, Any]) -> None:
    """Honour a ``train_config``'s optimizer and step size in ``trainer`` (see above)."""
    lr_default = float(knobs_of(DQConfig)["lr"].default)
    name, lr, reasons = from_train_config(config, trainer.cfg.optimizer, trainer.cfg.lr,
                                          lr_default)
    for reason in reasons:
        log(WARNING, "[dq] %s", reason)
    trainer.lr_given = trainer.cfg.lr != lr_default or lr is not None
    if lr is not None:
        trainer.lr = lr
    if trainer.choice is not None and trainer.choice.source == "user":
        if name is not None or lr is not None:
            given = " and ".join(k for k, v in (("optimizer", name), ("lr", lr)) if v is not None)
            log(WARNING, "[dq] train_config's %s not used: the strategy was given its "
                "optimizer (%s)", given, trainer.choice.describe())
        return
    if name is not None and (trainer.choice is None or trainer.choice.source != "held-out"):
        trainer.use_optimizer(OptimizerChoice(name, trainer.lr, "train-config"))
    elif lr is not None and trainer.choice is not None and trainer.choice.source != "held-out":
        trainer.use_optimizer(OptimizerChoice(trainer.choice.name, lr, "train-config"))
    if name is not None or lr is not None:
        log_round("dq", 0, f"train_config: the server trains with "
                  f"{trainer.choice.describe() if trainer.choice else f'lr {trainer.lr:g}'}"
                  + ("" if trainer.choice else " (optimizer chosen on the held-out rows)"))
