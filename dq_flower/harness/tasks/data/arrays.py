"""Data sets from numpy arrays and ``.npz`` files.

:class:`Dataset` holds flat rows plus targets; user arrays and ``npz:`` files keep their
values as given, only checked (a device's own file: :mod:`.node_data`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["Dataset", "from_arrays", "save_npz", "npz_path", "split_indices", "as_inputs",
           "as_targets"]


@dataclass(frozen=True, eq=False)
class Dataset:
    """A classification or regression data set held as flat rows (compared by identity).

    Attributes
    ----------
    train_x, test_x : np.ndarray
        float32, shape ``(n, d)``. Named image data sets are normalised by their
        definition (values in ``[0, 1]``), HAPT's sensor windows are in their units (g,
        rad/s); user data is as given.
    train_y, test_y : np.ndarray
        Class labels: int64 of shape ``(n,)`` in ``[0, num_classes)``. Regression
        targets (``num_classes == 0``): float32 of shape ``(n,)`` or ``(n, k)``.
    num_classes : int
        Number of classes, ``>= 1`` for class labels; ``0`` for float regression targets.
    input_shape : tuple of int
        Shape of one sample before flattening, e.g. ``(1, 28, 28)`` or ``(d,)``.
    name : str
        Human-readable name of the source.
    train_groups : np.ndarray or None
        Where the data has a natural federation (HAPT: the person who recorded each
        window), int64 ``(n,)``: the group of each training row; ``None`` otherwise.
    """

    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    num_classes: int
    input_shape: tuple[int, ...]
    name: str
    train_groups: np.ndarray | None = None

    def __post_init__(self) -> None:
        d = int(np.prod(self.input_shape))
        groups = self.train_groups
        if groups is not None and (groups.dtype != np.int64
                                   or groups.shape != (self.train_x.shape[0],)):
            raise ValueError(f"train_groups must be int64 of shape ({self.train_x.shape[0]},), "
                             f"got {groups.dtype} {groups.shape}")
        if self.num_classes < 0:
            raise ValueError(f"num_classes must be >= 1 (class labels) or 0 (float "
                             f"regression targets), got {self.num_classes}")
        regression = self.num_classes == 0
        for part, x, y in (("train", self.train_x, self.train_y),
                           ("test", self.test_x, self.test_y)):
            if x.ndim != 2 or x.shape[1] != d:
                raise ValueError(f"{part}_x must have shape (n, {d}), got {x.shape}")
            n = x.shape[0]
            if regression:
                if y.dtype.kind != "f":
                    raise ValueError(f"num_classes=0 means float regression targets, but "
                                     f"{part}_y has dtype {y.dtype}")
                if y.ndim not in (1, 2) or y.shape[0] != n:
                    raise ValueError(f"{part}_y must have shape ({n},) or ({n}, k), got "
                                     f"{y.shape}")
            else:
                if y.dtype.kind not in "iu":
                    raise ValueError(f"num_classes={self.num_classes} needs integer class "
                                     f"labels, but {part}_y has dtype {y.dtype} (use "
                                     "num_classes=0 for float regression targets)")
                if y.shape != (n,):
                    raise ValueError(f"{part}_y must have shape ({n},), got {y.shape}")
        if self.train_y.shape[1:] != self.test_y.shape[1:]:
            raise ValueError(f"train_y and test_y disagree on the target shape: "
                             f"{self.train_y.shape[1:]} vs {self.test_y.shape[1:]}")

    @property
    def dim(self) -> int:
        """Data dimension d (features per flat row)."""
        return int(self.train_x.shape[1])

    @property
    def num_train(self) -> int:
        """Number of training samples."""
        return int(self.train_x.shape[0])

    @property
    def is_regression(self) -> bool:
        """Whether the targets are float regression targets (``num_classes == 0``)."""
        return self.num_classes == 0


def _finite_float32(x: np.ndarray, problem: str, copy: bool = True) -> np.ndarray:
    with np.errstate(over="ignore"):  # beyond float32 becomes inf, refused below
        out = x.astype(np.float32, copy=copy)
    if not np.all(np.isfinite(out)):
        raise ValueError(f"{problem} NaN or infinite values (or values beyond the float32 "
                         "range)")
    return out


def as_inputs(x: Any, what: str, copy: bool = True) -> np.ndarray:
    """Numeric inputs as float32, values as given; NaN or infinity is an error."""
    x = np.asarray(x)
    if x.dtype.kind not in "fiub":
        raise ValueError(f"{what} must be numeric, got dtype {x.dtype}")
    if x.ndim < 1:
        raise ValueError(f"{what} must have a sample axis, got a scalar")
    return _finite_float32(x, f"{what} contains", copy)


def as_labels(y: Any, what: str) -> np.ndarray:
    y = np.asarray(y).reshape(-1)
    if y.dtype.kind == "f":
        if not np.all(np.isfinite(y)) or not np.all(y == np.round(y)):
            raise ValueError(f"{what}: labels must be integers")
    elif y.dtype.kind not in "iub":
        raise ValueError(f"{what}: labels must be integers, got dtype {y.dtype}")
    y = y.astype(np.int64)
    if y.size and y.min() < 0:
        raise ValueError(f"{what}: labels must be >= 0")
    return y


def as_targets(y: Any, what: str) -> np.ndarray:
    """Float regression targets as float32 of shape ``(n,)`` or ``(n, k)``."""
    y = np.asarray(y)
    if y.dtype.kind not in "fiub":
        raise ValueError(f"{what}: targets must be numeric, got dtype {y.dtype}")
    if y.ndim not in (1, 2):
        raise ValueError(f"{what}: targets must have shape (n,) or (n, k), got {y.shape}")
    return _finite_float32(y, f"{what}: targets contain")


def _is_regression(y: Any, num_classes: int | None) -> bool:
    """Float targets unless ``num_classes`` names classes; ``num_classes=0`` forces them."""
    if num_classes is not None:
        if int(num_classes) < 0:
            raise ValueError(f"num_classes must be >= 1 (class labels) or 0 (float "
                             f"regression targets), got {num_classes}")
        return int(num_classes) == 0
    return np.asarray(y).dtype.kind == "f"


def split_indices(n: int, y: np.ndarray, test_fraction: float, seed: int
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Seeded train/test index split, stratified where ``y`` are class labels."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    # scikit-learn: loaded when a split is drawn
    from sklearn.model_selection import train_test_split

    idx = np.arange(n)
    counts = np.bincount(y) if y.ndim == 1 and y.dtype.kind in "iu" and y.size else None
    stratify = y if counts is not None and counts[counts > 0].min() >= 2 else None
    try:
        tr, te = train_test_split(idx, test_size=test_fraction, random_state=seed,
                                  stratify=stratify)
    except ValueError:  # too few samples per class for the test size
        tr, te = train_test_split(idx, test_size=test_fraction, random_state=seed)
    return np.sort(tr), np.sort(te)


def from_arrays(x: np.ndarray, y: np.ndarray, x_test: np.ndarray | None = None,
                y_test: np.ndarray | None = None, num_classes: int | None = None,
                seed: int = 0, name: str = "arrays", test_fraction: float = 0.2,
                copy: bool = True) -> Dataset:
    """Build a `Dataset` from numpy arrays, keeping the values as given.

    Parameters
    ----------
    x, y : np.ndarray
        Inputs of shape ``(n, *input_shape)`` (flattened here) and targets: integer class
        labels ``(n,)``, or float regression targets ``(n,)`` or ``(n, k)``.
    x_test, y_test : np.ndarray, optional
        Test split; when absent, ``test_fraction`` of ``(x, y)`` is held out with ``seed``.
    num_classes : int, optional
        Defaults to ``max(label) + 1`` for integer labels and to ``0`` (regression) for
        float ``y``. Give ``num_classes >= 1`` to read integer-valued float ``y`` as class
        labels, or ``0`` to read integer ``y`` as regression targets.
    seed : int
        Seed of the held-out split.
    name : str
        Name recorded in the data set.
    test_fraction : float
        Held-out fraction when no test split is given.
    copy : bool
        ``False`` lets loaders hand over float32 arrays they own.

    Raises
    ------
    ValueError
        Non-numeric, NaN or infinite inputs or targets, mismatched shapes, or labels out
        of range for ``num_classes``.
    """
    regression = _is_regression(y, num_classes)
    targets = as_targets if regression else as_labels
    x = as_inputs(x, "x", copy=copy)
    y = targets(y, "y")
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"x and y disagree on the sample count: {x.shape} vs {y.shape}")
    if x.shape[0] == 0:
        raise ValueError("x is empty")
    input_shape = tuple(int(s) for s in x.shape[1:]) or (1,)
    if (x_test is None) != (y_test is None):
        raise ValueError("give both x_test and y_test, or neither")
    if x_test is None:
        tr, te = split_indices(x.shape[0], y, test_fraction, seed)
        x, x_test, y, y_test = x[tr], x[te], y[tr], y[te]
    else:
        x_test = as_inputs(x_test, "x_test", copy=copy)
        y_test = targets(y_test, "y_test")
        if int(np.prod(x_test.shape[1:])) != int(np.prod(input_shape)):
            raise ValueError(f"x_test sample shape {x_test.shape[1:]} != {x.shape[1:]}")
        if x_test.shape[0] != y_test.shape[0]:
            raise ValueError("x_test and y_test disagree on the sample count")
        if y_test.shape[1:] != y.shape[1:]:
            raise ValueError(f"y_test target shape {y_test.shape[1:]} != {y.shape[1:]}")
    if regression:
        num_classes = 0
    else:
        max_label = int(max(y.max(initial=-1), y_test.max(initial=-1)))
        if num_classes is None:
            num_classes = max_label + 1
        elif max_label >= num_classes:
            raise ValueError(f"label {max_label} out of range for num_classes={num_classes}")
    d = int(np.prod(input_shape))
    return Dataset(train_x=np.ascontiguousarray(x.reshape(x.shape[0], d)), train_y=y,
                   test_x=np.ascontiguousarray(x_test.reshape(x_test.shape[0], d)),
                   test_y=y_test, num_classes=int(num_classes), input_shape=input_shape,
                   name=name)


def npz_path(path: str | os.PathLike[str]) -> Path:
    """``path`` with ``.npz`` appended when missing, its parent folders created."""
    p = Path(path)
    if p.suffix != ".npz":
        p = p.with_name(p.name + ".npz")
    p.parent.mkdir(parents=True, exist_ok=True)
    return p


def save_npz(dataset: Dataset, path: str | os.PathLike[str]) -> Path:
    """Write a `Dataset` (inputs in their sample shape) for ``load_dataset("npz:<path>")``.

    Returns the written file (``.npz`` appended when missing).
    """
    path = npz_path(path)
    shape = dataset.input_shape
    np.savez(path,
             x_train=dataset.train_x.reshape((-1, *shape)), y_train=dataset.train_y,
             x_test=dataset.test_x.reshape((-1, *shape)), y_test=dataset.test_y,
             num_classes=np.int64(dataset.num_classes))
    return path


def load_npz(path: str, seed: int, test_fraction: float) -> Dataset:
    p = Path(path).expanduser()
    if not p.is_file():
        raise FileNotFoundError(f"npz data set not found: {p}")
    with np.load(p, allow_pickle=False) as f:
        keys = set(f.files)
        if not {"x_train", "y_train"} <= keys:
            raise ValueError(f"{p} must contain x_train and y_train (has {sorted(keys)})")
        has_test = {"x_test", "y_test"} <= keys
        nc = int(f["num_classes"]) if "num_classes" in keys else None
        return from_arrays(f["x_train"], f["y_train"], f["x_test"] if has_test else None,
                           f["y_test"] if has_test else None, num_classes=nc, seed=seed,
                           name=f"npz:{p.name}", test_fraction=test_fraction, copy=False)
