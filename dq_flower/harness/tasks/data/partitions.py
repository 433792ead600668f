"""Federated partitions: flwr-datasets partitioners on the labels, or natural groups.

The label partitions are memoised; the natural one follows the data's own groups (HAPT's
persons).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from dq_flower.harness.tasks.data.loaders import load_task_dataset

__all__ = ["PARTITION_SCHEMES", "natural_partitions", "partition_indices", "load_partition"]

PARTITION_SCHEMES: tuple[str, ...] = ("iid", "dirichlet", "pathological", "natural")


def iid_shards(perm: np.ndarray, num_partitions: int) -> list[np.ndarray]:
    """``perm`` cut into contiguous shards, as ``IidPartitioner`` cuts it, all at once.

    (The partitioner builds each shard as a data-set view: minutes for 100,000 of them.)
    """
    return [np.array(part, dtype=np.int64) for part in np.array_split(perm, num_partitions)]


@functools.lru_cache(maxsize=32)
def _partition_cached(key: bytes, num_partitions: int, scheme: str, alpha: float,
                      classes_per_partition: int, seed: int, min_partition_size: int
                      ) -> tuple[np.ndarray, ...]:
    import datasets  # optional (Hugging Face datasets): loaded for flwr-datasets partitions
    from flwr_datasets.partitioner import (  # optional (flwr-datasets): loaded for its partitions
        DirichletPartitioner,
        PathologicalPartitioner,
    )

    labels = np.frombuffer(key, dtype=np.int64)  # the int64 labels' bytes: the cache key
    n = labels.shape[0]
    datasets.disable_progress_bars()
    if scheme == "iid":
        # IidPartitioner shards contiguously; a seeded permutation makes it random.
        out = iid_shards(np.random.default_rng(seed).permutation(n), num_partitions)
    else:
        table = datasets.Dataset.from_dict({"idx": np.arange(n), "label": labels})
        part: Any
        if scheme == "dirichlet":
            part = DirichletPartitioner(
                num_partitions=num_partitions, partition_by="label", alpha=alpha,
                min_partition_size=min_partition_size, self_balancing=False,
                shuffle=True, seed=seed)
        else:
            num_labels = len(np.unique(labels))
            if classes_per_partition > num_labels:
                raise ValueError(f"classes_per_partition={classes_per_partition} exceeds "
                                 f"the {num_labels} classes present")
            part = PathologicalPartitioner(
                num_partitions=num_partitions, partition_by="label",
                num_classes_per_partition=classes_per_partition,
                class_assignment_mode="first-deterministic", shuffle=True, seed=seed)
        part.dataset = table
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                out = [np.asarray(part.load_partition(i)["idx"], dtype=np.int64)
                       for i in range(num_partitions)]
            except ValueError as exc:
                raise ValueError(
                    f"cannot build {num_partitions} non-empty {scheme} partitions of "
                    f"{n} samples (alpha={alpha}, classes_per_partition="
                    f"{classes_per_partition}, min_partition_size={min_partition_size}): "
                    f"{exc}. Use fewer partitions or a larger alpha.") from exc
    for i, idx in enumerate(out):
        if idx.size == 0:
            raise ValueError(f"{scheme} partition {i} of {num_partitions} is empty; use "
                             "fewer partitions or a larger alpha")
        idx.setflags(write=False)
    return tuple(out)


def _partition_labels(labels: Any, scheme: str) -> np.ndarray:
    """The int64 labels to split by (a private copy); float targets only split ``iid``."""
    arr = np.asarray(labels)
    if arr.dtype.kind == "f" and arr.size:
        if scheme != "iid":
            raise ValueError(f"the {scheme!r} partition scheme splits by class label, but "
                             "the targets are float (a regression data set); use "
                             "scheme='iid'")
        if arr.ndim < 1:
            raise ValueError(f"targets must have a sample axis, got shape {arr.shape}")
        return np.zeros(arr.shape[0], dtype=np.int64)
    return np.array(arr, dtype=np.int64).reshape(-1)


def natural_partitions(groups: np.ndarray | Sequence[int], num_partitions: int
                       ) -> list[np.ndarray]:
    """The rows of each group (sorted by group id) as partitions, ``num_partitions`` of them.

    With as many partitions as groups each partition is one group (HAPT: one person);
    with fewer, consecutive groups share one (``np.array_split`` of the sorted ids).
    """
    g = np.asarray(groups, dtype=np.int64).reshape(-1)
    ids = np.unique(g)
    if not 1 <= int(num_partitions) <= ids.size:
        raise ValueError(f"the natural partition has {ids.size} groups; num_partitions must "
                         f"be 1..{ids.size}, got {num_partitions}")
    return [np.flatnonzero(np.isin(g, chunk)).astype(np.int64)
            for chunk in np.array_split(ids, int(num_partitions))]


def partition_indices(labels: np.ndarray | Sequence[int] | Sequence[float],
                      num_partitions: int, scheme: str = "iid", alpha: float = 0.5,
                      classes_per_partition: int = 2, seed: int = 0,
                      min_partition_size: int | None = None,
                      groups: np.ndarray | None = None) -> list[np.ndarray]:
    """Split sample indices into federated partitions with flwr-datasets.

    Parameters
    ----------
    labels : array-like
        Target of every sample: class labels (every scheme) or float regression targets
        (``iid`` only).
    num_partitions : int
        Number of partitions (clients).
    scheme : {"iid", "dirichlet", "pathological", "natural"}
        ``iid``: seeded shuffle then equal shards (`IidPartitioner`); ``dirichlet``:
        per-class Dirichlet(alpha) proportions (`DirichletPartitioner`); ``pathological``:
        ``classes_per_partition`` classes per client (`PathologicalPartitioner`,
        first class deterministic so every class is used when possible); ``natural``:
        the data's own ``groups`` (:func:`natural_partitions`).
    alpha : float
        Dirichlet concentration (smaller = more skewed).
    classes_per_partition : int
        Classes per client for ``pathological``.
    seed : int
        Seed; the same arguments always give the same partitions.
    min_partition_size : int, optional
        Dirichlet only; default ``min(10, n // (2 * num_partitions))`` but at least 1.
    groups : np.ndarray, optional
        ``natural`` only: the group of every sample (``Dataset.train_groups``).

    Returns
    -------
    list of np.ndarray
        int64 index arrays, one per partition, pairwise disjoint and non-empty;
        together they cover all samples for ``iid`` and ``dirichlet``.

    Raises
    ------
    ValueError
        Bad arguments, float targets with a label-based scheme, ``natural`` without
        groups, or non-empty partitions cannot be built.
    """
    scheme = scheme.lower()
    if scheme not in PARTITION_SCHEMES:
        raise ValueError(f"unknown partition scheme {scheme!r}; known: "
                         f"{', '.join(PARTITION_SCHEMES)}")
    if scheme == "natural":
        if groups is None or len(groups) != len(labels):
            raise ValueError("the natural partition needs the data's groups, one per sample "
                             "(a named data set with them: hapt)")
        return natural_partitions(groups, num_partitions)
    if int(num_partitions) < 1:
        raise ValueError(f"num_partitions must be >= 1, got {num_partitions}")
    y = _partition_labels(labels, scheme)
    min_size = _checked_min_size(scheme, int(y.shape[0]), int(num_partitions), alpha,
                                 classes_per_partition, min_partition_size)
    parts = _partition_cached(y.tobytes(), int(num_partitions), scheme, float(alpha),
                              int(classes_per_partition), int(seed), min_size)
    return [p.copy() for p in parts]


def _checked_min_size(scheme: str, n: int, num_partitions: int, alpha: float,
                      classes_per_partition: int, min_partition_size: int | None) -> int:
    """Check the scheme's arguments; return the Dirichlet minimum partition size."""
    if n < num_partitions:
        raise ValueError(f"cannot split {n} samples into {num_partitions} non-empty "
                         "partitions")
    if scheme == "dirichlet" and not (alpha > 0 and np.isfinite(alpha)):
        raise ValueError(f"alpha must be a positive number, got {alpha}")
    if scheme == "pathological" and classes_per_partition < 1:
        raise ValueError(f"classes_per_partition must be >= 1, got {classes_per_partition}")
    if min_partition_size is None:
        return max(1, min(10, n // (2 * num_partitions)))
    if min_partition_size < 1:
        raise ValueError("min_partition_size must be >= 1 (partitions must be non-empty)")
    return int(min_partition_size)


def load_partition(name: str, partition_id: int, num_partitions: int, scheme: str = "iid",
                   alpha: float = 0.5, seed: int = 0, data_dir: str | None = None,
                   classes_per_partition: int = 2, validation_fraction: float = 0.0,
                   train_rows: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Load one client's training rows (of :func:`load_task_dataset`'s, loaded once).

    The data set (its split seeded by ``seed``, less any validation rows, cut to
    ``train_rows``) is split with `partition_indices`; only this partition's rows are copied.

    Returns
    -------
    x : np.ndarray
        float32 ``(m, d)`` rows (a copy).
    y : np.ndarray
        int64 ``(m,)`` labels, or float32 ``(m,)``/``(m, k)`` targets (a copy).
    global_ids : np.ndarray
        int64 ``(m,)`` row indices in the full training set.
    """
    if not 0 <= partition_id < num_partitions:
        raise ValueError(f"partition_id {partition_id} not in [0, {num_partitions})")
    ds = load_task_dataset(name, data_dir, seed, validation_fraction, train_rows)
    ids = partition_indices(ds.train_y, num_partitions, scheme, alpha=alpha,
                            classes_per_partition=classes_per_partition,
                            seed=seed, groups=ds.train_groups)[partition_id]
    return ds.train_x[ids], ds.train_y[ids], ids
