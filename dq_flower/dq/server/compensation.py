"""The round's compensations and refreshed residuals: screened, clipped, and kept.

Each kind passes its own norm screen against the round's others
(:func:`~dq_flower.server.pipeline.bound_vectors`; compensations and residuals grow
between rounds of long server training, so each is screened against its own round first)
and is clipped. With ``compensation-mode`` ``store`` or ``refresh`` the accepted ones
enter the control variate (:mod:`dq_flower.dq.server.control_variate`) that corrects every store
step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from dq_flower.dq.config import DQConfig
from dq_flower.dq.server.control_variate import ControlVariate
from dq_flower.dq.server.store import FederationData
from dq_flower.dq.server.validation import Upload
from dq_flower.server.common import log_rejected
from dq_flower.server.pipeline import bound_vectors
from dq_flower.server.robust import NormScreen

__all__ = ["Compensations"]


class Compensations:
    """The norm screens of compensations and refreshed residuals, and the control variate.

    ``data`` holds the store whose per-client weights a refreshed residual replaces.
    """

    def __init__(self, cfg: DQConfig, num_params: int, data: FederationData) -> None:
        self.cfg, self.data = cfg, data
        self.cv = (ControlVariate(num_params, cfg.compensation_decay)
                   if cfg.compensation_mode != "first-step" else None)
        self.comp_norms = NormScreen(cfg.norm_bound_factor, round_first=True)
        self.refresh_norms = NormScreen(cfg.norm_bound_factor, round_first=True)

    def _screen(self, uploads: list[Upload], get: Callable[[Upload], np.ndarray | None],
                put: Callable[[Upload, np.ndarray | None], Upload], screen: NormScreen,
                what: str) -> tuple[list[Upload], list[int]]:
        """Norm-screen and clip the uploads' vectors (``get``; ``put`` a new one in).

        Returns the uploads with their vectors clipped (a rejected one's dropped: ``None``)
        and the positions of the rejected ones; ``what`` names the vector in the log.
        """
        vectors = [get(u) for u in uploads]
        having = [i for i, v in enumerate(vectors) if v is not None]
        out = list(uploads)
        if not having:
            return out, []
        bounded = bound_vectors([v for v in vectors if v is not None], [1.0] * len(having),
                                screen, clip_factor=self.cfg.clip_factor,
                                clip_norm=self.cfg.clip_norm)
        kept = iter(bounded.vectors)
        rejected = []
        for i, k in zip(having, bounded.keep, strict=True):
            out[i] = put(uploads[i], next(kept) if k else None)
            if not k:
                rejected.append(i)
                log_rejected(uploads[i].node, f"{what} is implausibly large against the "
                             "other clients' (norm-bound-factor)")
        return out, rejected

    def screen_deltas(self, uploads: list[Upload]) -> tuple[list[Upload], int]:
        """Drop uploads whose compensation norm is implausible; clip the others'.

        See :func:`dq_flower.server.pipeline.bound_vectors`.
        """
        screened, bad = self._screen(uploads, lambda u: u.delta,
                                     lambda u, v: replace(u, delta=v), self.comp_norms,
                                     "compensation norm")
        return [u for i, u in enumerate(screened) if i not in set(bad)], len(bad)

    def update_control_variate(self, fresh: list[Upload]) -> tuple[int, int]:
        """Age the control variate, then enter the round's refreshed and fresh deltas.

        Called before the round's rows are stored, so a refreshed residual replaces the
        share of exactly the node's earlier rows. Refreshed residuals pass their own norm
        screen and clip, as compensations do. Returns ``(refreshed, rejected refreshes)``.
        """
        if self.cv is None:
            return 0, 0
        self.cv.age()
        fresh, dropped = self._screen_refreshes(fresh)
        refreshed = 0
        store = self.data.store
        for u in fresh:
            if u.refresh is not None and store is not None:
                self.cv.replace(u.node, u.refresh, store.node_weight(u.node))
                refreshed += 1
            if u.delta is not None and len(u.batch):
                self.cv.add(u.node, u.delta, float(u.batch.weights.sum()))
        return refreshed, dropped

    def _screen_refreshes(self, uploads: list[Upload]) -> tuple[list[Upload], int]:
        """Norm-screen and clip the refreshed residuals; a rejected one is dropped."""
        screened, bad = self._screen(uploads, lambda u: u.refresh,
                                     lambda u, v: replace(u, refresh=v), self.refresh_norms,
                                     "refreshed residual's norm")
        return screened, len(bad)

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The two norm screens' histories and the control variate."""
        return {"refresh_norms": self.refresh_norms.state_dict(),
                "comp_norms": self.comp_norms.state_dict(),
                "control_variate": None if self.cv is None else self.cv.state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`state_dict`."""
        self.refresh_norms.load_state_dict(state.get("refresh_norms", {}))
        self.comp_norms.load_state_dict(state.get("comp_norms", {}))
        if self.cv is not None and state.get("control_variate") is not None:
            self.cv.load_state(state["control_variate"])
