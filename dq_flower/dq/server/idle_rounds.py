"""Rounds whose new rows train no phase: the server goes on training on the store it has.

A round with no new rows, or too few to train a phase (:meth:`~.schedule.AdaptiveSchedule.
grew_enough`), runs a fresh plateau phase on the store from the kept model (its own
patience judges whether it helps). Its best model is kept only where it beats the kept one
on the held-out rows beyond their noise (:func:`~.plateau.beyond_noise`, as a phase's
progress is judged); else the kept model stays, and the rounds after train nothing until
new rows train a phase (a phase on the unchanged store made no progress: the next one
would start where it did).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from dq_flower.dq.server.plateau import PhaseResult, beyond_noise

__all__ = ["IdleRounds"]


@dataclass
class IdleRounds:
    """Whether a round without new rows trains, and what its phase did."""

    #: a phase on the unchanged store made no progress: no more until new rows train one
    spent: bool = False
    #: the round's phase ran on the unchanged store
    ran: bool = False
    #: and its model was kept (it beat the model before beyond noise)
    kept: bool = False

    def due(self) -> bool:
        """Whether this round, with no new rows to train on, runs a phase (notes it)."""
        self.ran = not self.spent
        return self.ran

    def grown(self) -> None:
        """New rows trained a phase: the store changed, and so may what it can give."""
        self.spent = self.ran = False

    def judge(self, phase: PhaseResult, model: torch.nn.Module,
              start: dict[str, torch.Tensor], evidence: float) -> None:
        """Keep the phase's model where it beats ``start`` beyond noise, else restore ``start``.

        The phase's ``final`` scores become those of the model kept.
        """
        before, after = phase.initial, phase.final
        self.kept = (before is not None and after is not None and after.score > before.score
                     and beyond_noise(after, before, evidence))
        if not self.kept:
            model.load_state_dict(start)
            phase.final = phase.initial
        self.spent = not self.kept

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps."""
        return {"spent": self.spent}

    def load_state(self, state: dict[str, Any] | None) -> None:
        """Inverse of :meth:`state` (``None``: a checkpoint from before idle rounds trained)."""
        self.spent = bool((state or {}).get("spent", False))
