"""Which of a client's stored rows are held out: a seeded hash draw, whatever the order.

Held-out rows are ``round(fraction * rows)`` of each (client, class) stratum after every
upload: the rows with the smallest hash of ``(key, client, local id)``
(:func:`choose_holdout`), whatever the replies' order; with a server secret in the key no
client can compute which of its rows are held out.
"""

from __future__ import annotations

import numpy as np

from dq_flower.dq.server.store import strata_of

__all__ = ["choose_holdout", "row_hash"]

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser, vectorised (uint64 in, uint64 out)."""
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return z ^ (z >> np.uint64(31))


def row_hash(seed: int, node: int, ids: np.ndarray) -> np.ndarray:
    """A seeded 64-bit hash of each ``(seed, node, local id)``: the held-out draw order."""
    with np.errstate(over="ignore"):
        base = _mix(np.array([int(seed) & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64) + _GOLDEN)
        base = _mix(base ^ np.array([int(node) & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64))
        return _mix(base ^ (np.asarray(ids).astype(np.uint64) * _GOLDEN))


def choose_holdout(labels: np.ndarray, ids: np.ndarray, node: int, fraction: float,
                   seed: int, stored_counts) -> np.ndarray:
    """Boolean mask over client ``node``'s new rows (``labels``, ``ids``): the held-out ones.

    ``fraction`` (in ``[0, 1)``) of each stratum; ``seed``: the hash's key;
    ``stored_counts(node, strata) -> (rows, held_out)``: :meth:`SampleStore.counts`.
    """
    ids = np.asarray(ids)
    mask = np.zeros(ids.shape[0], dtype=bool)
    if fraction <= 0 or not ids.size:
        return mask
    strata = strata_of(labels)
    keys = np.unique(strata)
    stored, held = stored_counts(node, keys)
    order = row_hash(seed, node, ids)
    for key, before, kept in zip(keys, stored, held, strict=True):
        rows = np.flatnonzero(strata == key)
        target = int(np.floor(fraction * (int(before) + rows.size) + 0.5)) - int(kept)
        take = min(max(target, 0), rows.size)
        if take:
            mask[rows[np.argsort(order[rows], kind="stable")[:take]]] = True
    return mask
