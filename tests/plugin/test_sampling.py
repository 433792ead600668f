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


def test_min_available_nodes_waits_for_nodes_but_does_not_raise_the_sample():
    """Flower's meaning: 50 connected, fraction 0.1 and min-available 10 sample 5, not 10."""
    grid = _Grid(range(1, 51))
    picked = sample_node_ids(grid, 0.1, 10, np.random.default_rng(0), min_sampled=1)
    assert len(picked) == 5
    # the evaluation's own minimum (min_sampled not given) still raises its sample
    assert len(sample_node_ids(grid, 0.1, 10, np.random.default_rng(0))) == 10


def test_preferred_nodes_are_drawn_first_and_the_rest_only_fill_the_sample():
    grid = _Grid(range(1, 51))
    left = set(range(1, 12))  # 11 nodes still hold rows the server lacks
    for seed in range(20):
        picked = sample_node_ids(grid, 0.1, 1, np.random.default_rng(seed), min_sampled=1,
                                 prefer=left.__contains__)
        assert len(picked) == 5 and set(picked) <= left
    # fewer preferred nodes than the sample: those alone are worth asking
    few = {3, 7}
    assert sample_node_ids(grid, 0.1, 1, np.random.default_rng(0), min_sampled=1,
                           prefer=few.__contains__) == [3, 7]
    # none preferred: the plain sample
    assert len(sample_node_ids(grid, 0.1, 1, np.random.default_rng(0), min_sampled=1,
                               prefer=lambda n: False)) == 5
