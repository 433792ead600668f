"""A DataLoader's sampler decides which rows are the node's (DQ's data input).

A node holding a whole data set and a loader sampling its share of it
(``SubsetRandomSampler(indices)``, a common way to partition) uploaded every row of the
data set: the loader's data set was read, its sampler not.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import (
    DataLoader,
    RandomSampler,
    Sampler,
    SubsetRandomSampler,
    TensorDataset,
    WeightedRandomSampler,
)

from dq_flower.data_input import as_arrays

X = torch.arange(200, dtype=torch.float32).reshape(100, 2)
Y = torch.arange(100) % 3
DATA = TensorDataset(X, Y)


def test_a_subset_samplers_rows_are_the_nodes_in_index_order():
    share = [42, 7, 13, 99, 8]
    x, y = as_arrays(DataLoader(DATA, batch_size=4, sampler=SubsetRandomSampler(share)))
    assert np.array_equal(x, X[sorted(share)].numpy()) and np.array_equal(y, Y[sorted(share)])


def test_a_weighted_sampler_draws_from_its_rows_of_weight_above_zero():
    weights = torch.zeros(100)
    weights[10:20] = 1.0
    x, _ = as_arrays(DataLoader(DATA, batch_size=4, sampler=WeightedRandomSampler(weights, 50)))
    assert np.array_equal(x, X[10:20].numpy())


def test_another_samplers_rows_are_those_one_pass_yields():
    class Evens(Sampler[int]):
        def __iter__(self):
            return iter(range(98, -1, -2))

        def __len__(self) -> int:
            return 50

    x, _ = as_arrays(DataLoader(DATA, batch_size=8, sampler=Evens()))
    assert np.array_equal(x, X[::2].numpy())


def test_shuffling_loaders_read_every_row():
    x, _ = as_arrays(DataLoader(DATA, batch_size=8, shuffle=True))
    assert np.array_equal(x, X.numpy())
    x, _ = as_arrays(DataLoader(DATA, batch_size=8, sampler=RandomSampler(DATA)))
    assert np.array_equal(x, X.numpy())
