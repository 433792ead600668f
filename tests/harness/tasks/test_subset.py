"""``train-rows`` / ``test-rows``: a seeded subset of a named data set's rows."""

from __future__ import annotations

import numpy as np
import pytest

from dq_flower.harness.task_config import TaskConfig
from dq_flower.harness.tasks.data import load_dataset, load_partition
from dq_flower.harness.tasks.data.loaders import load_task_dataset, subset_view


def _rows(x: np.ndarray, of: np.ndarray) -> np.ndarray:
    """Index in ``of`` of each row of ``x`` (digits rows are unique enough to find)."""
    keys = {r.tobytes(): i for i, r in enumerate(of)}
    return np.array([keys[r.tobytes()] for r in x])


def test_a_subset_keeps_seeded_rows_in_their_order_and_each_split_on_its_own():
    ds = load_dataset("digits", seed=0)
    sub = subset_view(ds, 300, 50, seed=4)
    assert (sub.num_train, len(sub.test_y)) == (300, 50)
    at = _rows(sub.train_x, ds.train_x)
    assert np.all(np.diff(at) > 0)  # original order, no repeats
    np.testing.assert_array_equal(sub.train_y, ds.train_y[at])
    assert np.array_equal(subset_view(ds, 300, 50, seed=4).train_x, sub.train_x)  # seeded
    assert not np.array_equal(subset_view(ds, 300, 50, seed=5).train_x, sub.train_x)
    # the training subset does not depend on the test subset (server and clients agree)
    assert np.array_equal(subset_view(ds, 300, 0, seed=4).train_x, sub.train_x)
    assert len(subset_view(ds, 300, 0, seed=4).test_y) == len(ds.test_y)
    assert subset_view(ds, 0, 0) is ds and subset_view(ds, 10**6, 10**6) is ds
    with pytest.raises(ValueError, match="train_rows"):
        subset_view(ds, -1, 0)


def test_clients_partition_the_subset_the_server_evaluates_beside():
    full = load_task_dataset("digits", None, 2, 0.0, 400, 60)
    parts = [load_partition("digits", k, 4, "iid", seed=2, train_rows=400) for k in range(4)]
    ids = np.concatenate([p[2] for p in parts])
    assert sorted(ids.tolist()) == list(range(400))  # the four shards cover the subset
    np.testing.assert_array_equal(np.concatenate([p[0] for p in parts]), full.train_x[ids])
    assert len(full.test_y) == 60


def test_the_task_config_refuses_a_negative_count():
    assert TaskConfig(train_rows=5000, test_rows=1000).train_rows == 5000
    with pytest.raises(ValueError, match="test-rows"):
        TaskConfig(test_rows=-1)
