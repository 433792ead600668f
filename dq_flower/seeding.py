"""Seeded random generators: every random choice flows from (run seed, round, node, purpose).

Pure numpy, so that both ends (and a client without PyTorch) import it.
"""

from __future__ import annotations

import numpy as np

__all__ = ["round_rng"]


def round_rng(seed: int, server_round: int, node: int, purpose: int = 0) -> np.random.Generator:
    """Generator for one (run seed, round, node, purpose): never the global RNG or the clock."""
    return np.random.default_rng([int(seed) & 0xFFFFFFFF, int(server_round), int(node), purpose])
