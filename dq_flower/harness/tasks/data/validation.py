"""The data a run trains and evaluates on: a validation split for tuning, memoised."""

from __future__ import annotations

import functools

import numpy as np

from dq_flower.harness.tasks.data.container import Dataset
from dq_flower.harness.tasks.data.loaders import load_dataset_cached

__all__ = ["VALIDATION_PURPOSE", "validation_view", "load_task_dataset"]


#: Purpose mixed into the seed of the validation split (so it does not follow the
#: train/test split or the partitions drawn from the same run seed).
VALIDATION_PURPOSE = 0x5A11D


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
                      validation_fraction: float = 0.0) -> Dataset:
    """The data set a run trains and evaluates on (memoised per process).

    With ``validation_fraction`` 0 it is :func:`load_dataset_cached`; otherwise its
    :func:`validation_view`: clients partition the remaining training rows and the server
    evaluates on the held-out ones.
    """
    ds = load_dataset_cached(name, data_dir, seed)
    if not validation_fraction:
        return ds
    return validation_view(ds, float(validation_fraction), seed)
