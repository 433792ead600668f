"""Which uploaded rows the server holds out to validate its own training.

Under the adaptive upload schedule the server trains on its store until a held-out part of
the store stops improving (:mod:`dq_flower.dq.server.plateau`). The held-out rows are a
deterministic, seeded fraction of each client's rows, stratified by class (one stratum for
float targets): after every upload, each (client, class) stratum holds
``round(fraction * rows)`` held-out rows, the new ones being the rows of the upload whose
seeded hash of ``(seed, client, local id)`` is smallest. The client is its stable identity
(:mod:`dq_flower.dq.server.identity`), not Flower's node id, so which rows are held out depends
neither on the order in which replies arrive nor on the node ids of a run, only on what
each client uploaded; the test set is never involved.

The hash's key is the run's seed, which every client knows, unless the server is given a
secret (:func:`holdout_key`): a client that knows the key could compute which of its rows
the server holds out, and shape only those.
"""

from __future__ import annotations

import hashlib
import os

import numpy as np

__all__ = ["row_hash", "strata_of", "choose_holdout", "holdout_key", "SECRET_ENV"]

#: Environment variable of the server process that holds the held-out secret, where the
#: strategy is given none (the clients never see the server's environment).
SECRET_ENV = "DQ_FLOWER_HOLDOUT_SECRET"


def holdout_key(seed: int, secret: str | None) -> int:
    """The held-out hash's key: ``seed`` without a secret, else a 64-bit digest of both.

    ``secret`` ``None`` reads :data:`SECRET_ENV` from the environment (unset or empty: no
    secret). The secret never leaves the server: it is neither a knob of the run config,
    which the clients read, nor part of any message.
    """
    if secret is None:
        secret = os.environ.get(SECRET_ENV) or None
    if secret is None:
        return int(seed)
    digest = hashlib.blake2b(f"{int(seed)}\0{secret}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")

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


def strata_of(labels: np.ndarray) -> np.ndarray:
    """Each row's stratum: its class label, or 0 for every float target."""
    labels = np.asarray(labels)
    if labels.dtype.kind in "iu":
        return labels.reshape(-1).astype(np.int64)
    return np.zeros(labels.shape[0] if labels.ndim else 0, dtype=np.int64)


def choose_holdout(labels: np.ndarray, ids: np.ndarray, node: int, fraction: float,
                   seed: int, stored_counts) -> np.ndarray:
    """Boolean mask over a node's new rows: which of them are held out.

    Parameters
    ----------
    labels, ids : numpy.ndarray
        The new rows' labels (or float targets) and client-local ids.
    node : int
        The rows' origin node.
    fraction : float
        Share of each (node, class) stratum held out, in ``[0, 1)``.
    seed : int
        The hash's key: the run seed, or :func:`holdout_key` of it and a secret.
    stored_counts : callable
        ``stored_counts(node, strata) -> (rows, held_out)`` already in the store for each
        stratum (:meth:`dq_flower.dq.server.store.SampleStore.counts`).
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
