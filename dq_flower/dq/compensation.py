"""The round's compensations and refreshed residuals: screened, clipped, and kept.

Each kind passes its own norm screen against the round's others
(:func:`~dq_flower.server.pipeline.bound_vectors`; compensations and residuals grow
between rounds of long server training, so each is screened against its own round first)
and is clipped. With ``compensation-mode`` ``store`` or ``refresh`` the accepted ones
enter the control variate (:mod:`dq_flower.dq.control_variate`) that corrects every store
step.
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np

from dq_flower.dq.config import DQConfig
from dq_flower.dq.control_variate import ControlVariate
from dq_flower.dq.intake import UploadIntake
from dq_flower.dq.validation import Upload
from dq_flower.server.common import log_rejected
from dq_flower.server.pipeline import bound_vectors
from dq_flower.server.robust import NormScreen

__all__ = ["Compensations"]


class Compensations:
    """The norm screens of compensations and refreshed residuals, and the control variate.

    ``intake`` holds the store whose per-client weights a refreshed residual replaces.
    """

    def __init__(self, cfg: DQConfig, num_params: int, intake: UploadIntake) -> None:
        self.cfg, self.intake = cfg, intake
        self.cv = (ControlVariate(num_params, cfg.compensation_decay)
                   if cfg.compensation_mode != "first-step" else None)
        self.comp_norms = NormScreen(cfg.norm_bound_factor, round_first=True)
        self.refresh_norms = NormScreen(cfg.norm_bound_factor, round_first=True)

    def _bound(self, vectors: list[np.ndarray], screen: NormScreen
               ) -> tuple[list[bool], list[np.ndarray]]:
        """Which of ``vectors`` pass ``screen``, and those that do, clipped."""
        bounded = bound_vectors(vectors, [1.0] * len(vectors), screen,
                                clip_factor=self.cfg.clip_factor, clip_norm=self.cfg.clip_norm)
        return bounded.keep, bounded.vectors

    def screen_deltas(self, uploads: list[Upload]) -> tuple[list[Upload], int]:
        """Drop uploads whose compensation norm is implausible; clip the others' in place.

        See :func:`dq_flower.server.pipeline.bound_vectors`.
        """
        with_delta = [u for u in uploads if u.delta is not None]
        if not with_delta:
            return uploads, 0
        keep, vectors = self._bound([cast(np.ndarray, u.delta) for u in with_delta],
                                    self.comp_norms)
        kept = iter(vectors)
        for u, k in zip(with_delta, keep, strict=True):
            if k:
                u.delta = next(kept)
        bad = {id(u) for u, k in zip(with_delta, keep, strict=True) if not k}
        for u in with_delta:
            if id(u) in bad:
                log_rejected(u.node, "compensation norm is implausibly large against the "
                             "other clients' (norm-bound-factor)")
        return [u for u in uploads if id(u) not in bad], len(bad)

    def update_control_variate(self, fresh: list[Upload]) -> tuple[int, int]:
        """Age the control variate, then enter the round's refreshed and fresh deltas.

        Called before the round's rows are stored, so a refreshed residual replaces the
        share of exactly the node's earlier rows. Refreshed residuals pass their own norm
        screen and clip, as compensations do. Returns ``(refreshed, rejected refreshes)``.
        """
        if self.cv is None:
            return 0, 0
        self.cv.age()
        dropped = self._screen_refreshes(fresh)
        refreshed = 0
        store = self.intake.store
        for u in fresh:
            if u.refresh is not None and store is not None:
                self.cv.replace(u.node, u.refresh, store.node_weight(u.node))
                refreshed += 1
            if u.delta is not None and len(u.batch):
                self.cv.add(u.node, u.delta, float(u.batch.weights.sum()))
        return refreshed, dropped

    def _screen_refreshes(self, uploads: list[Upload]) -> int:
        """Norm-screen and clip the refreshed residuals in place; a rejected one is dropped."""
        with_refresh = [u for u in uploads if u.refresh is not None]
        if not with_refresh:
            return 0
        keep, vectors = self._bound([cast(np.ndarray, u.refresh) for u in with_refresh],
                                    self.refresh_norms)
        kept = iter(vectors)
        for u, k in zip(with_refresh, keep, strict=True):
            if k:
                u.refresh = next(kept)
            else:
                u.refresh = None
                log_rejected(u.node, "refreshed residual's norm is implausibly large against "
                             "the other clients' (norm-bound-factor)")
        return keep.count(False)

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
