"""The store-level compensation: a control variate over the stored samples.

A client's compensation ``delta_u`` is the weighted mean of ``grad f(x_i) - grad f(Q(x_i))``
over the rows of its upload ``u`` (total weight ``W_u``). Per client identity the server
keeps ``sum_u W_u delta_u`` and ``sum_u W_u``, so ``c = sum W_u delta_u / sum W_u`` over
everything stored corrects a store step in expectation. Staleness is reduced by ``decay``
(old contributions shrink each round) and refreshed residuals (a client's whole share
replaced by one delta at the current model). Evicted rows keep their contribution.
"""

from __future__ import annotations

import numpy as np

__all__ = ["ControlVariate"]


class ControlVariate:
    """Per-node weighted sums of decoded compensation deltas (one model-sized vector each)."""

    def __init__(self, dim: int, decay: float = 1.0) -> None:
        self.dim = int(dim)
        self.decay = float(decay)
        self.sums: dict[int, np.ndarray] = {}
        self.weights: dict[int, float] = {}

    def __bool__(self) -> bool:
        return bool(self.weights) and sum(self.weights.values()) > 0

    def age(self) -> None:
        """One round passes: old contributions are multiplied by ``decay``."""
        if self.decay == 1.0:
            return
        for node in self.sums:
            self.sums[node] *= np.float32(self.decay)
            self.weights[node] *= self.decay

    def add(self, node: int, delta: np.ndarray, weight: float) -> None:
        """Add an upload's ``delta`` standing for rows of total weight ``weight``."""
        node = int(node)
        contribution = np.float32(weight) * delta.astype(np.float32)
        self.sums[node] = self.sums[node] + contribution if node in self.sums else contribution
        self.weights[node] = self.weights.get(node, 0.0) + float(weight)

    def replace(self, node: int, delta: np.ndarray, weight: float) -> None:
        """Replace a node's whole share by one ``delta`` over rows of weight ``weight``."""
        self.sums.pop(int(node), None)
        self.weights.pop(int(node), None)
        self.add(node, delta, weight)

    def value(self) -> np.ndarray:
        """The weighted mean delta ``c`` (zeros while nothing is recorded)."""
        total = sum(self.weights.values())
        if total <= 0:
            return np.zeros(self.dim, dtype=np.float32)
        acc = sum((s.astype(np.float64) for s in self.sums.values()),
                  np.zeros(self.dim, dtype=np.float64))
        return (acc / total).astype(np.float32)

    def state(self) -> dict:
        """Arrays for a checkpoint."""
        return {"sums": {k: v.copy() for k, v in self.sums.items()},
                "weights": dict(self.weights)}

    def load_state(self, state: dict) -> None:
        """Inverse of :meth:`state`."""
        self.sums = {int(k): np.asarray(v, dtype=np.float32) for k, v in state["sums"].items()}
        self.weights = {int(k): float(v) for k, v in state["weights"].items()}
