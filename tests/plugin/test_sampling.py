"""Node sampling with Flower's real node ids (unsigned 64-bit, on both sides of 2**63)."""

import numpy as np

from dq_flower.server.common import sample_node_ids


class _Grid:
    def __init__(self, ids):
        self.ids = ids

    def get_node_ids(self):
        return list(self.ids)


def test_sampled_ids_are_the_grid_s_own_ids_exactly():
    ids = [9228311925801297201, 1234567890123456789, 10336466465861679999, 42,
           18446744073709551557]
    for seed in range(50):
        picked = sample_node_ids(_Grid(ids), 0.5, 1, np.random.default_rng(seed))
        assert len(picked) == 3 and set(picked) <= set(ids), picked
    counts = {i: 0 for i in ids}
    for seed in range(400):
        for i in sample_node_ids(_Grid(ids), 0.2, 1, np.random.default_rng(seed)):
            counts[i] += 1
    assert min(counts.values()) > 400 / 5 * 0.6  # every node gets drawn (uniform: 80 each)
