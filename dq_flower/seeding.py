"""Seeded random generators: every random choice flows from (run seed, round, node, purpose).

Pure numpy, so that both ends (and a client without PyTorch) import it. Each random choice
has its own named purpose (:class:`Purpose`), so two choices never share a stream.
"""

from __future__ import annotations

from enum import IntEnum

import numpy as np

__all__ = ["round_rng", "Purpose"]


class Purpose(IntEnum):
    """What a ``round_rng`` stream is for (the values are part of the reproducibility)."""

    #: DQ client's own draws (selection, stochastic rounding), keyed by its round seed
    CLIENT = 0
    #: the server's node sample of a training round
    SAMPLE = 1
    #: DQ's per-round seed sent to the clients
    ROUND_SEED = 2
    #: DQ's server minibatches
    SERVER_BATCHES = 3
    #: majority-vote ties
    TIES = 4
    #: the node sample of a federated evaluation round
    EVALUATE_SAMPLE = 5
    #: a gradient client's minibatch
    BATCH = 11
    #: a gradient client's codec (stochastic rounding, random projections)
    CODEC = 12
    #: local-epoch shuffles (FedAvg clients and gradient clients with ``local-epochs``)
    SHUFFLE = 21
    #: the compression mod's codec
    MOD_CODEC = 31


def round_rng(seed: int, server_round: int, node: int, purpose: int = 0) -> np.random.Generator:
    """Generator for one (run seed, round, node, purpose): never the global RNG or the clock."""
    return np.random.default_rng([int(seed) & 0xFFFFFFFF, int(server_round), int(node),
                                  int(purpose)])
