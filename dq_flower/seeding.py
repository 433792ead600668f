"""Seeded random generators: every random choice flows from (run seed, round, node, purpose)."""

from __future__ import annotations

from enum import IntEnum

import numpy as np

__all__ = ["round_rng", "Purpose"]


class Purpose(IntEnum):
    """What a ``round_rng`` stream is for (the values are part of the reproducibility)."""

    CLIENT = 0  # DQ client's own draws (selection, rounding), keyed by its round seed
    SAMPLE = 1  # the server's node sample of a training round
    ROUND_SEED = 2  # DQ's per-round seed sent to the clients
    SERVER_BATCHES = 3  # DQ's server minibatches
    TIES = 4  # majority-vote ties
    EVALUATE_SAMPLE = 5  # the node sample of a federated evaluation round
    FIDELITY = 6  # a DQ node's rows compared raw and coded (dq.client.fidelity)
    BATCH = 11  # a gradient client's minibatch
    CODEC = 12  # a gradient client's codec (stochastic rounding, random projections)
    SHUFFLE = 21  # local-epoch shuffles (FedAvg clients, gradient clients' local-epochs)
    MOD_CODEC = 31  # the compression mod's codec


def round_rng(seed: int, server_round: int, node: int, purpose: int = 0) -> np.random.Generator:
    """Generator for one (run seed, round, node, purpose): never the global RNG or the clock."""
    return np.random.default_rng([int(seed) & 0xFFFFFFFF, int(server_round), int(node),
                                  int(purpose)])
