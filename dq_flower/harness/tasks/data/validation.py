"""The data a run trains and evaluates on: a row subset, a tuning split, memoised."""

from __future__ import annotations

import functools

import numpy as np

from dq_flower.harness.tasks.data.container import Dataset
from dq_flower.harness.tasks.data.loaders import load_dataset_cached

__all__ = ["VALIDATION_PURPOSE", "SUBSET_PURPOSE", "subset_view", "validation_view",
           "load_task_dataset"]


#: Purpose mixed into the seed of the validation split (so it does not follow the
#: train/test split or the partitions drawn from the same run seed).
VALIDATION_PURPOSE = 0x5A11D

#: Purpose mixed into the seed of the ``train-rows`` / ``test-rows`` subsets.
SUBSET_PURPOSE = 0x50B5E7


def _seeded_rows(n: int, keep: int, seed: int, split: int) -> np.ndarray:
    """``keep`` of ``n`` row indices drawn by the seed, in their original order."""
    rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, SUBSET_PURPOSE, split])
    return np.sort(rng.permutation(n)[:keep])


def subset_view(ds: Dataset, train_rows: int = 0, test_rows: int = 0, seed: int = 0) -> Dataset:
    """``ds`` cut to ``train_rows`` training and ``test_rows`` test rows drawn by ``seed``.

    For runs sized to a slow machine (a large model on a few thousand rows). 0 keeps a
    split whole; a count at or above a split's size keeps it whole too. The rows are drawn
    by ``numpy.random.default_rng([seed, SUBSET_PURPOSE, split])`` and keep their order,
    so every process of a run (server, each client) cuts the same rows.
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

    A fraction ``fraction`` of the training rows (at least one, at least one left), drawn by
    ``numpy.random.default_rng([seed, VALIDATION_PURPOSE])``, becomes the returned data
    set's "test" split; the other training rows are its training split. The original test
    split is not in the result at all, so nothing evaluated or trained on it can see it.

    Parameters
    ----------
    ds : Dataset
        The data set.
    fraction : float
        Held-out fraction of the training rows, in (0, 1).
    seed : int
        Seed of the split; the same arguments always give the same rows.

    Returns
    -------
    Dataset
        Training rows minus the held-out ones, and the held-out rows as its test split
        (both in their original order).
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
    """The data set a run trains and evaluates on (memoised per process).

    :func:`load_dataset_cached`, cut by :func:`subset_view` to ``train_rows`` /
    ``test_rows`` (0: all); with ``validation_fraction`` > 0 its :func:`validation_view`
    of what is left: clients partition the remaining training rows and the server
    evaluates on the held-out ones.
    """
    ds = subset_view(load_dataset_cached(name, data_dir, seed), train_rows, test_rows, seed)
    if not validation_fraction:
        return ds
    return validation_view(ds, float(validation_fraction), seed)
