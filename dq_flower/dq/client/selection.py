"""Client-side sample selection under an upload budget.

Pure numpy. Given importance scores of the candidate samples, a rule picks at most
``budget`` of them and returns a weight per pick so that ``sum(w_i * g_i)`` over the picks
estimates the candidates' mean ``(1/n) sum g_i``:

- ``topk``: the highest scores (ties broken at random), weights ``1/m``; biased unless the
  scores are uniform, in which case it is a uniform random subset and unbiased.
- ``sample``: probability-proportional-to-score sampling of a fixed size ``m`` (systematic
  sampling over a random order, inclusion probabilities ``pi_i = min(1, c s_i)`` summing to
  ``m``), weights ``1/(n pi_i)``: the Horvitz-Thompson estimator, unbiased.
- ``threshold``: scores at or above a threshold, highest first, capped by the budget,
  weights ``1/m``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Selection", "select", "inclusion_probabilities", "RULES"]

RULES = ("topk", "sample", "threshold")


@dataclass(frozen=True)
class Selection:
    """Chosen candidate positions and their estimator weights."""

    indices: np.ndarray
    weights: np.ndarray

    def __len__(self) -> int:
        return int(self.indices.size)


def inclusion_probabilities(scores: np.ndarray, m: int) -> np.ndarray:
    """Inclusion probabilities ``min(1, c * s_i)`` that sum to ``m`` (capped PPS).

    Scores are floored at a small fraction of their mean so that every candidate keeps a
    positive probability (needed for unbiasedness).
    """
    s = np.asarray(scores, dtype=np.float64)
    n = s.size
    if m >= n:
        return np.ones(n)
    mean = s.mean() if n else 0.0
    if not np.isfinite(mean) or mean <= 0:
        return np.full(n, m / n)
    s = np.maximum(s, 1e-3 * mean)
    pi = np.zeros(n)
    capped = np.zeros(n, dtype=bool)
    for _ in range(n):  # at most n passes; usually one or two
        free = ~capped
        room = m - capped.sum()
        pi[free] = room * s[free] / s[free].sum()
        pi[capped] = 1.0
        over = free & (pi > 1.0)
        if not over.any():
            break
        capped |= over
    return np.clip(pi, 0.0, 1.0)


def _systematic(pi: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    order = rng.permutation(pi.size)
    cum = np.cumsum(pi[order])
    m = int(round(cum[-1]))
    points = rng.random() + np.arange(m)
    picks = np.searchsorted(cum, points, side="right")
    return np.sort(order[np.minimum(picks, pi.size - 1)])


def select(scores: np.ndarray, budget: int, rule: str, rng: np.random.Generator,
           threshold: float = 0.0) -> Selection:
    """Pick at most ``budget`` candidates by ``rule``; see the module docstring."""
    scores = np.asarray(scores, dtype=np.float64)
    if scores.ndim != 1:
        raise ValueError("scores must be a 1-D array")
    if not np.isfinite(scores).all():
        raise ValueError("scores must be finite")
    n = scores.size
    m = min(int(budget), n)
    if m <= 0:
        return Selection(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32))
    if rule in ("topk", "threshold"):  # the highest scores (topk: ties in a random order)
        pool = rng.permutation(n) if rule == "topk" else np.flatnonzero(scores >= threshold)
        idx = np.sort(pool[np.argsort(-scores[pool], kind="stable")[:m]])
        k = idx.size
        return Selection(idx.astype(np.int64),
                         np.full(k, 1.0 / k if k else 0.0, dtype=np.float32))
    if rule != "sample":
        raise ValueError(f"selection-rule must be one of {RULES}, got {rule!r}")
    pi = inclusion_probabilities(scores, m)
    idx = _systematic(pi, rng)
    return Selection(idx.astype(np.int64), (1.0 / (n * pi[idx])).astype(np.float32))
