"""Data sets and a device's own samples from numpy arrays and ``.npz`` files.

:class:`Dataset` holds flat rows plus targets; user arrays, ``npz:`` files and node-local
files (node config key ``data-file``) keep their values as given, only checked.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["Dataset", "from_arrays", "save_npz", "NODE_DATA_CONFIG_KEY", "NodeData",
           "load_node_data", "save_node_data"]


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


NODE_DATA_CONFIG_KEY = "data-file"


def _node_targets(y: Any, what: str) -> np.ndarray:
    """Node targets: int64 labels ``(n,)`` or float32 targets ``(n,)``/``(n, k)``."""
    y = np.asarray(y)
    if y.dtype.kind in "iub":
        if y.ndim != 1:
            raise ValueError(f"{what}: integer class labels must have shape (n,), got "
                             f"{y.shape}")
        return as_labels(y, what)
    if y.dtype.kind == "f":
        return as_targets(y, what)
    raise ValueError(f"{what} must hold integer class labels or float targets, got dtype "
                     f"{y.dtype}")


def _checked_split(x: Any, y: Any, part: str, empty_hint: str = ""
                   ) -> tuple[np.ndarray, np.ndarray]:
    """``x_<part>`` as float32 inputs and ``y_<part>`` as targets: non-empty, equally long."""
    xs = as_inputs(x, f"x_{part}", copy=False)
    ys = _node_targets(y, f"y_{part}")
    if xs.shape[0] == 0:
        raise ValueError(f"x_{part} is empty{empty_hint}")
    if xs.shape[0] != ys.shape[0]:
        raise ValueError(f"x_{part} and y_{part} disagree on the sample count: "
                         f"{xs.shape[0]} vs {ys.shape[0]}")
    return xs, ys


@dataclass(frozen=True, eq=False)
class NodeData:
    """One device's own samples, built checked by :meth:`checked` (may share their memory).

    Attributes
    ----------
    train_x : np.ndarray
        float32, shape ``(n, *sample_shape)``.
    train_y : np.ndarray
        int64 ``(n,)`` labels or float32 ``(n,)``/``(n, k)`` targets.
    test_x, test_y : np.ndarray or None
        The device's own test split, or both None.
    """

    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray | None = None
    test_y: np.ndarray | None = None

    @classmethod
    def checked(cls, train_x: Any, train_y: Any, test_x: Any = None,
                test_y: Any = None) -> NodeData:
        """The arrays checked and converted (``ValueError`` naming the bad one)."""
        x, y = _checked_split(train_x, train_y, "train")
        if (test_x is None) != (test_y is None):
            raise ValueError("give both x_test and y_test, or neither")
        if test_x is None:
            return cls(x, y)
        xt, yt = _checked_split(test_x, test_y, "test", " (leave the test split out instead)")
        if xt.shape[1:] != x.shape[1:]:
            raise ValueError(f"x_test sample shape {xt.shape[1:]} != x_train sample "
                             f"shape {x.shape[1:]}")
        if yt.dtype != y.dtype or yt.shape[1:] != y.shape[1:]:
            raise ValueError(f"y_test ({yt.dtype}, target shape {yt.shape[1:]}) does not "
                             f"match y_train ({y.dtype}, target shape {y.shape[1:]})")
        return cls(x, y, xt, yt)

    @property
    def sample_shape(self) -> tuple[int, ...]:
        """Shape of one input sample, ``train_x.shape[1:]``."""
        return tuple(int(s) for s in self.train_x.shape[1:])

    @property
    def num_train(self) -> int:
        """Number of training samples."""
        return int(self.train_x.shape[0])

    @property
    def has_test(self) -> bool:
        """Whether the file holds a test split."""
        return self.test_x is not None

    @property
    def is_regression(self) -> bool:
        """Whether the targets are float regression targets (not class labels)."""
        return self.train_y.dtype.kind == "f"


def _pick_key(keys: set[str], key: str, alias: str, p: Path) -> str | None:
    if key in keys and alias in keys:
        raise ValueError(f"{p} holds both {key!r} and its alias {alias!r}; keep one "
                         f"(keys present: {sorted(keys)})")
    return key if key in keys else alias if alias in keys else None


def load_node_data(path: str | os.PathLike[str]) -> NodeData:
    """Read a device's own samples from a node-local ``.npz`` file (node config ``data-file``).

    The file holds ``x_train`` and ``y_train`` (or ``x`` and ``y``) and optionally
    ``x_test`` and ``y_test``; other keys are ignored.

    Raises
    ------
    FileNotFoundError
        No such file (the message names the path and the ``data-file`` key).
    ValueError
        Not an ``.npz`` archive, missing keys (the message lists those present),
        mismatched lengths or shapes, non-numeric, NaN or infinite values.
    """
    p = Path(path).expanduser()
    if not p.is_file():
        raise FileNotFoundError(
            f"node data file not found: {p}. Set the node config key "
            f"'{NODE_DATA_CONFIG_KEY}' to this device's .npz file (keys x_train, y_train "
            "and optionally x_test, y_test), e.g. written with save_node_data.")
    try:
        archive = np.load(p, allow_pickle=False)
    except (OSError, ValueError, EOFError, pickle.UnpicklingError,
            zipfile.BadZipFile) as exc:
        raise ValueError(f"{p}: not a readable .npz file ({exc})") from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise ValueError(f"{p}: expected an .npz archive with x_train and y_train, got a "
                         "single .npy array")
    with archive as f:
        keys = set(f.files)
        kx = _pick_key(keys, "x_train", "x", p)
        ky = _pick_key(keys, "y_train", "y", p)
        if kx is None or ky is None:
            raise ValueError(f"{p} must contain 'x_train' and 'y_train' (or 'x' and 'y'); "
                             f"keys present: {sorted(keys)}")
        has_xt, has_yt = "x_test" in keys, "y_test" in keys
        if has_xt != has_yt:
            raise ValueError(f"{p} must contain both 'x_test' and 'y_test', or neither; "
                             f"keys present: {sorted(keys)}")
        try:
            arrays = [f[k] for k in (kx, ky, *(("x_test", "y_test") if has_xt else ()))]
        except (OSError, ValueError, zipfile.BadZipFile) as exc:
            raise ValueError(f"{p}: cannot read its arrays ({exc})") from None
    try:
        return NodeData.checked(*arrays)
    except ValueError as exc:
        raise ValueError(f"{p}: {exc}") from None


def save_node_data(path: str | os.PathLike[str], x_train: np.ndarray, y_train: np.ndarray,
                   x_test: np.ndarray | None = None, y_test: np.ndarray | None = None) -> Path:
    """Write a device's own samples, checked as `NodeData`, for `load_node_data`.

    ``.npz`` is appended to ``path`` when missing and its folders are created; the file is
    renamed into place, so readers never see half a file. Returns the written file.
    """
    data = NodeData.checked(x_train, y_train, x_test, y_test)
    p = npz_path(Path(path).expanduser())
    # np.savez's keyword arrays (its stubs type ``**kwds`` against its own bool options)
    arrays: dict[str, Any] = {"x_train": data.train_x, "y_train": data.train_y}
    if data.has_test:
        arrays.update(x_test=data.test_x, y_test=data.test_y)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, **arrays)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, p)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return p
