"""Rounds whose new rows train no phase: the server goes on training on the store it has.

A round with no new rows, or too few to train a phase (:meth:`~.schedule.AdaptiveSchedule.
grew_enough`), runs a fresh plateau phase on the store from the kept model (its own
patience judges whether it helps). Its best model is kept only where it beats the kept one
on the held-out rows beyond their noise (:func:`~.plateau.beyond_noise`, as a phase's
progress is judged); else the kept model stays, and the rounds after train nothing until
phases on new rows have grown the store by the schedule's least ask (``min_growth``, a
tenth) since: a phase on the store as it was made no progress, and one on a store a few
rows larger would start where it did (a stream of 5 rows a round on 910 re-ran one after
every phase on new rows, 350 to 500 steps each).
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

    #: a phase on the unchanged store made no progress: no more until the store grows
    spent: bool = False
    #: the store's rows when that phase ran
    spent_at: int = 0
    #: the round's phase ran on the unchanged store
    ran: bool = False
    #: and its model was kept (it beat the model before beyond noise)
    kept: bool = False

    def due(self) -> bool:
        """Whether this round, with no new rows to train on, runs a phase (notes it)."""
        self.ran = not self.spent
        return self.ran

    def grown(self, stored: int, growth: float) -> None:
        """New rows trained a phase (the store now ``stored`` rows).

        Idle phases may pay again once the store is ``growth`` times that of the last that
        did not.
        """
        self.ran = False
        self.spent = self.spent and stored < growth * self.spent_at

    def judge(self, phase: PhaseResult, model: torch.nn.Module,
              start: dict[str, torch.Tensor], evidence: float, stored: int) -> None:
        """Keep the phase's model where it beats ``start`` beyond noise, else restore ``start``.

        The phase's ``final`` scores become those of the model kept.
        """
        before, after = phase.initial, phase.final
        self.kept = (before is not None and after is not None and after.score > before.score
                     and beyond_noise(after, before, evidence))
        if not self.kept:
            model.load_state_dict(start)
            phase.final = phase.initial
        self.spent, self.spent_at = not self.kept, stored

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps."""
        return {"spent": self.spent, "spent_at": self.spent_at}

    def load_state(self, state: dict[str, Any] | None) -> None:
        """Inverse of :meth:`state` (``None``: a checkpoint from before idle rounds trained)."""
        self.spent = bool((state or {}).get("spent", False))
        self.spent_at = int((state or {}).get("spent_at", 0))
