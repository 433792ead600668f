"""The data a run trains and evaluates on: a row subset, a tuning split, memoised."""

from __future__ import annotations

import functools

import numpy as np

from dq_flower.harness.tasks.data.container import Dataset
from dq_flower.harness.tasks.data.loaders import load_dataset_cached

__all__ = ["VALIDATION_PURPOSE", "SUBSET_PURPOSE", "subset_view", "validation_view",
           "load_task_dataset"]


#: Mixed into the seeds of the validation split and of the train-rows/test-rows subsets.
VALIDATION_PURPOSE = 0x5A11D
SUBSET_PURPOSE = 0x50B5E7


def _seeded_rows(n: int, keep: int, seed: int, split: int) -> np.ndarray:
    """``keep`` of ``n`` row indices drawn by the seed, in their original order."""
    rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, SUBSET_PURPOSE, split])
    return np.sort(rng.permutation(n)[:keep])


def subset_view(ds: Dataset, train_rows: int = 0, test_rows: int = 0, seed: int = 0) -> Dataset:
    """``ds`` cut to ``train_rows`` / ``test_rows`` rows (0 or more: whole) drawn by ``seed``.

    The rows keep their order and are the same in every process of a run.
    """
    if train_rows < 0 or test_rows < 0:
        raise ValueError(f"train_rows and test_rows must be >= 0, got {train_rows}, {test_rows}")
    tr = (_seeded_rows(ds.num_train, train_rows, seed, 0)
          if 0 < train_rows < ds.num_train else slice(None))
    te = (_seeded_rows(len(ds.test_y), test_rows, seed, 1)
          if 0 < test_rows < len(ds.test_y) else slice(None))
    if isinstance(tr, slice) and isinstance(te, slice):
        return ds
    return Dataset(ds.train_x[tr], ds.train_y[tr], ds.test_x[te], ds.test_y[te],
                   ds.num_classes, tuple(ds.input_shape), f"{ds.name} (subset)")


def validation_view(ds: Dataset, fraction: float, seed: int = 0) -> Dataset:
    """``ds`` with a validation split carved from its TRAINING rows, for tuning.

    ``fraction`` (in (0, 1)) of the training rows, drawn by ``seed`` (at least one, at
    least one left), becomes the "test" split, both splits in their original order; the
    original test split is not in the result at all.
    """
    if not 0 < fraction < 1:
        raise ValueError(f"validation fraction must be in (0, 1), got {fraction}")
    n = ds.num_train
    if n < 2:
        raise ValueError(f"cannot hold out validation rows from {n} training row(s)")
    held = min(n - 1, max(1, int(round(fraction * n))))
    perm = np.random.default_rng([int(seed) & 0xFFFFFFFF, VALIDATION_PURPOSE]).permutation(n)
    val, keep = np.sort(perm[:held]), np.sort(perm[held:])
    return Dataset(ds.train_x[keep], ds.train_y[keep], ds.train_x[val], ds.train_y[val],
                   ds.num_classes, tuple(ds.input_shape), f"{ds.name} (validation split)")


@functools.lru_cache(maxsize=4)
def load_task_dataset(name: str, data_dir: str | None = None, seed: int = 0,
                      validation_fraction: float = 0.0, train_rows: int = 0,
                      test_rows: int = 0) -> Dataset:
    """The run's data: cached, :func:`subset_view`, then :func:`validation_view` (memoised)."""
    ds = subset_view(load_dataset_cached(name, data_dir, seed), train_rows, test_rows, seed)
    if not validation_fraction:
        return ds
    return validation_view(ds, float(validation_fraction), seed)
