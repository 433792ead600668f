"""Data sets, node-local data files and federated partitions.

Every data set is held as flat float32 rows plus targets: int64 class labels, or float32
regression targets (``num_classes == 0``). ``Dataset.input_shape`` remembers the original
sample shape so models can reshape.

Values are never rescaled behind the user's back. The named data sets are normalised as
part of their definition, explicitly in their own loaders: scikit-learn's digits
(embedded, no download) divided by 16 (its pixel range is 0..16), Fashion-MNIST from IDX
files and CIFAR-10 from torchvision's python-pickle folder divided by 255 (uint8 pixels),
so their values lie in ``[0, 1]``. User data (any numpy pair given to `from_arrays`, any
``npz:<path>`` file) is used as given: only cast to float32 and checked to be finite.

A device's own samples live in a node-local ``.npz`` file (`load_node_data`,
`save_node_data`; node config key ``data-file``), kept in its sample shape.

Partitions are computed with flwr-datasets partitioners on an in-memory table of
``(idx, label)`` only, so partitioning never copies the samples themselves.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import hashlib
import os
import pickle
import tempfile
import warnings
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "DATASET_NAMES",
    "DEFAULT_FMNIST_DIR",
    "NODE_DATA_CONFIG_KEY",
    "PARTITION_SCHEMES",
    "Dataset",
    "NodeData",
    "default_data_root",
    "from_arrays",
    "load_dataset",
    "load_dataset_cached",
    "load_task_dataset",
    "validation_view",
    "load_node_data",
    "load_partition",
    "parse_idx",
    "partition_indices",
    "save_node_data",
    "save_npz",
]

DATASET_NAMES: tuple[str, ...] = ("digits", "fmnist", "cifar10", "npz:<path>")
PARTITION_SCHEMES: tuple[str, ...] = ("iid", "dirichlet", "pathological")
NODE_DATA_CONFIG_KEY = "data-file"
DEFAULT_FMNIST_DIR = "/usr/share/datasets/fashion-mnist"
_FMNIST_DEBIAN_PACKAGE = "dataset-fashion-mnist"
_IDX_IMAGES_MAGIC = 2051
_IDX_LABELS_MAGIC = 2049


@dataclass(frozen=True, eq=False)
class Dataset:
    """A classification or regression data set held as flat rows (compared by identity).

    Attributes
    ----------
    train_x, test_x : np.ndarray
        float32, shape ``(n, d)``. Named data sets are normalised by their definition
        (values in ``[0, 1]``); user data is as given.
    train_y, test_y : np.ndarray
        Class labels: int64 of shape ``(n,)`` in ``[0, num_classes)``. Regression
        targets (``num_classes == 0``): float32 of shape ``(n,)`` or ``(n, k)``.
    num_classes : int
        Number of classes, ``>= 1`` for class labels; ``0`` for float regression targets.
    input_shape : tuple of int
        Shape of one sample before flattening, e.g. ``(1, 28, 28)`` or ``(d,)``.
    name : str
        Human-readable name of the source.
    """

    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    num_classes: int
    input_shape: tuple[int, ...]
    name: str

    def __post_init__(self) -> None:
        d = int(np.prod(self.input_shape))
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


# --------------------------------------------------------------------------- helpers


def default_data_root() -> Path:
    """Folder for downloads: ``$DQ_FLOWER_DATA`` or ``~/.cache/dq_flower``."""
    return Path(os.environ.get("DQ_FLOWER_DATA", Path.home() / ".cache" / "dq_flower"))


def _unit_from_uint8(x: np.ndarray) -> np.ndarray:
    """uint8 pixels as float32 in ``[0, 1]`` (the definition of fmnist and cifar10)."""
    out = x.astype(np.float32)
    out *= np.float32(1.0 / 255.0)
    return out


def _as_inputs(x: Any, what: str, copy: bool = True) -> np.ndarray:
    """Numeric inputs as float32, values as given; NaN or infinity is an error."""
    x = np.asarray(x)
    if x.dtype.kind not in "fiub":
        raise ValueError(f"{what} must be numeric, got dtype {x.dtype}")
    if x.ndim < 1:
        raise ValueError(f"{what} must have a sample axis, got a scalar")
    with np.errstate(over="ignore"):  # beyond float32 becomes inf, refused below
        out = x.astype(np.float32, copy=copy)
    if not np.all(np.isfinite(out)):
        raise ValueError(f"{what} contains NaN or infinite values (or values beyond the "
                         "float32 range)")
    return out


def _as_labels(y: Any, what: str) -> np.ndarray:
    y = np.asarray(y)
    if y.ndim != 1:
        y = y.reshape(-1)
    if y.dtype.kind == "f":
        if not np.all(np.isfinite(y)) or not np.all(y == np.round(y)):
            raise ValueError(f"{what}: labels must be integers")
    elif y.dtype.kind not in "iub":
        raise ValueError(f"{what}: labels must be integers, got dtype {y.dtype}")
    y = y.astype(np.int64)
    if y.size and y.min() < 0:
        raise ValueError(f"{what}: labels must be >= 0")
    return y


def _as_targets(y: Any, what: str) -> np.ndarray:
    """Float regression targets as float32 of shape ``(n,)`` or ``(n, k)``."""
    y = np.asarray(y)
    if y.dtype.kind not in "fiub":
        raise ValueError(f"{what}: targets must be numeric, got dtype {y.dtype}")
    if y.ndim not in (1, 2):
        raise ValueError(f"{what}: targets must have shape (n,) or (n, k), got {y.shape}")
    with np.errstate(over="ignore"):  # beyond float32 becomes inf, refused below
        out = y.astype(np.float32)
    if not np.all(np.isfinite(out)):
        raise ValueError(f"{what}: targets contain NaN or infinite values (or values "
                         "beyond the float32 range)")
    return out


def _is_regression(y: Any, num_classes: int | None) -> bool:
    """Float targets unless ``num_classes`` names classes; ``num_classes=0`` forces them."""
    if num_classes is not None:
        if int(num_classes) < 0:
            raise ValueError(f"num_classes must be >= 1 (class labels) or 0 (float "
                             f"regression targets), got {num_classes}")
        return int(num_classes) == 0
    return np.asarray(y).dtype.kind == "f"


def _split(
    n: int, y: np.ndarray, test_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Seeded train/test index split, stratified where ``y`` are class labels."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    from sklearn.model_selection import train_test_split

    idx = np.arange(n)
    stratify = None
    if y.ndim == 1 and y.dtype.kind in "iu" and y.size:
        counts = np.bincount(y)
        present = counts[counts > 0]
        stratify = y if present.min() >= 2 else None
    try:
        tr, te = train_test_split(idx, test_size=test_fraction, random_state=seed,
                                  stratify=stratify)
    except ValueError:  # too few samples per class for the test size
        tr, te = train_test_split(idx, test_size=test_fraction, random_state=seed)
    return np.sort(tr), np.sort(te)


# --------------------------------------------------------------------------- arrays


def from_arrays(
    x: np.ndarray,
    y: np.ndarray,
    x_test: np.ndarray | None = None,
    y_test: np.ndarray | None = None,
    num_classes: int | None = None,
    seed: int = 0,
    name: str = "arrays",
    test_fraction: float = 0.2,
) -> Dataset:
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

    Returns
    -------
    Dataset
        Inputs cast to float32 but otherwise unchanged (no rescaling); int64 labels, or
        float32 targets with ``num_classes == 0``.

    Raises
    ------
    ValueError
        Non-numeric, NaN or infinite inputs or targets, mismatched shapes, or labels out
        of range for ``num_classes``.
    """
    return _make_dataset(x, y, x_test, y_test, num_classes, seed, name, test_fraction,
                         copy=True)


def _make_dataset(
    x: Any,
    y: Any,
    x_test: Any,
    y_test: Any,
    num_classes: int | None,
    seed: int,
    name: str,
    test_fraction: float,
    copy: bool,
) -> Dataset:
    """`from_arrays`; ``copy=False`` lets loaders hand over float32 arrays they own."""
    regression = _is_regression(y, num_classes)
    targets = _as_targets if regression else _as_labels
    x = _as_inputs(x, "x", copy=copy)
    y = targets(y, "y")
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"x and y disagree on the sample count: {x.shape} vs {y.shape}")
    if x.shape[0] == 0:
        raise ValueError("x is empty")
    input_shape = tuple(int(s) for s in x.shape[1:]) or (1,)
    if (x_test is None) != (y_test is None):
        raise ValueError("give both x_test and y_test, or neither")
    if x_test is None:
        tr, te = _split(x.shape[0], y, test_fraction, seed)
        x, x_test, y, y_test = x[tr], x[te], y[tr], y[te]
    else:
        x_test = _as_inputs(x_test, "x_test", copy=copy)
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
    train_x = x.reshape(x.shape[0], d)
    test_x = x_test.reshape(x_test.shape[0], d)
    return Dataset(train_x=np.ascontiguousarray(train_x), train_y=y,
                   test_x=np.ascontiguousarray(test_x), test_y=y_test,
                   num_classes=int(num_classes), input_shape=input_shape, name=name)


def save_npz(dataset: Dataset, path: str | os.PathLike[str]) -> Path:
    """Write a `Dataset` to ``path`` so that ``load_dataset("npz:<path>")`` reads it back.

    Inputs are stored in their original sample shape (``input_shape``), as float32;
    targets as they are held (int64 labels, or float32 targets with ``num_classes`` 0).

    Returns
    -------
    Path
        The written file (numpy appends ``.npz`` when missing).
    """
    path = Path(path)
    if path.suffix != ".npz":
        path = path.with_name(path.name + ".npz")
    path.parent.mkdir(parents=True, exist_ok=True)
    shape = dataset.input_shape
    np.savez(path,
             x_train=dataset.train_x.reshape((-1, *shape)), y_train=dataset.train_y,
             x_test=dataset.test_x.reshape((-1, *shape)), y_test=dataset.test_y,
             num_classes=np.int64(dataset.num_classes))
    return path


def _load_npz(path: str, seed: int, test_fraction: float) -> Dataset:
    p = Path(path).expanduser()
    if not p.is_file():
        raise FileNotFoundError(f"npz data set not found: {p}")
    with np.load(p, allow_pickle=False) as f:
        keys = set(f.files)
        if not {"x_train", "y_train"} <= keys:
            raise ValueError(f"{p} must contain x_train and y_train (has {sorted(keys)})")
        has_test = {"x_test", "y_test"} <= keys
        nc = int(f["num_classes"]) if "num_classes" in keys else None
        return _make_dataset(f["x_train"], f["y_train"],
                             f["x_test"] if has_test else None,
                             f["y_test"] if has_test else None,
                             num_classes=nc, seed=seed, name=f"npz:{p.name}",
                             test_fraction=test_fraction, copy=False)


# --------------------------------------------------------------------------- node data


def _node_targets(y: Any, what: str) -> np.ndarray:
    """Node targets: int64 labels ``(n,)`` or float32 targets ``(n,)``/``(n, k)``."""
    y = np.asarray(y)
    if y.dtype.kind in "iub":
        if y.ndim != 1:
            raise ValueError(f"{what}: integer class labels must have shape (n,), got "
                             f"{y.shape}")
        return _as_labels(y, what)
    if y.dtype.kind == "f":
        return _as_targets(y, what)
    raise ValueError(f"{what} must hold integer class labels or float targets, got dtype "
                     f"{y.dtype}")


@dataclass(frozen=True, eq=False)
class NodeData:
    """One device's own samples, as read from its node-local ``.npz`` file.

    Values are as given: inputs are cast to float32 and keep their sample shape (not
    flattened); targets are int64 class labels ``(n,)`` or float32 regression targets
    ``(n,)`` or ``(n, k)``. Arrays are checked (finite, matching lengths and shapes) on
    construction and may share memory with the arrays passed in.

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

    def __post_init__(self) -> None:
        x = _as_inputs(self.train_x, "x_train", copy=False)
        y = _node_targets(self.train_y, "y_train")
        if x.shape[0] == 0:
            raise ValueError("x_train is empty")
        if x.shape[0] != y.shape[0]:
            raise ValueError(f"x_train and y_train disagree on the sample count: "
                             f"{x.shape[0]} vs {y.shape[0]}")
        object.__setattr__(self, "train_x", x)
        object.__setattr__(self, "train_y", y)
        if (self.test_x is None) != (self.test_y is None):
            raise ValueError("give both x_test and y_test, or neither")
        if self.test_x is None:
            return
        xt = _as_inputs(self.test_x, "x_test", copy=False)
        yt = _node_targets(self.test_y, "y_test")
        if xt.shape[0] == 0:
            raise ValueError("x_test is empty (leave the test split out instead)")
        if xt.shape[0] != yt.shape[0]:
            raise ValueError(f"x_test and y_test disagree on the sample count: "
                             f"{xt.shape[0]} vs {yt.shape[0]}")
        if xt.shape[1:] != x.shape[1:]:
            raise ValueError(f"x_test sample shape {xt.shape[1:]} != x_train sample "
                             f"shape {x.shape[1:]}")
        if yt.dtype != y.dtype or yt.shape[1:] != y.shape[1:]:
            raise ValueError(f"y_test ({yt.dtype}, target shape {yt.shape[1:]}) does not "
                             f"match y_train ({y.dtype}, target shape {y.shape[1:]})")
        object.__setattr__(self, "test_x", xt)
        object.__setattr__(self, "test_y", yt)

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


def _pick_key(keys: set[str], key: str, alias: str | None, p: Path) -> str | None:
    if alias is not None and key in keys and alias in keys:
        raise ValueError(f"{p} holds both {key!r} and its alias {alias!r}; keep one "
                         f"(keys present: {sorted(keys)})")
    if key in keys:
        return key
    return alias if alias is not None and alias in keys else None


def load_node_data(path: str | os.PathLike[str]) -> NodeData:
    """Read a device's own samples from a node-local ``.npz`` file.

    The file holds ``x_train`` and ``y_train`` (or their aliases ``x`` and ``y``) and
    optionally ``x_test`` and ``y_test``; other keys are ignored. Its path is given to a
    node by the node config key ``data-file``. `save_node_data` writes such files.

    Parameters
    ----------
    path : str or PathLike
        The ``.npz`` file.

    Returns
    -------
    NodeData
        float32 inputs in their sample shape (values as given) and int64 labels or
        float32 targets.

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
        return NodeData(*arrays)
    except ValueError as exc:
        raise ValueError(f"{p}: {exc}") from None


def save_node_data(
    path: str | os.PathLike[str],
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_test: np.ndarray | None = None,
    y_test: np.ndarray | None = None,
) -> Path:
    """Write a device's own samples as a node-local ``.npz`` file for `load_node_data`.

    The arrays are checked as `NodeData` checks them and stored as float32 inputs (sample
    shape kept) and int64 labels or float32 targets. The file is written to a temporary
    name in the same folder and renamed into place, so readers never see half a file.

    Parameters
    ----------
    path : str or PathLike
        Target file; ``.npz`` is appended when missing. Parent folders are created.
    x_train, y_train : np.ndarray
        Training inputs ``(n, *sample_shape)`` and targets.
    x_test, y_test : np.ndarray, optional
        The device's test split (both or neither).

    Returns
    -------
    Path
        The written file.
    """
    data = NodeData(x_train, y_train, x_test, y_test)
    p = Path(path).expanduser()
    if p.suffix != ".npz":
        p = p.with_name(p.name + ".npz")
    p.parent.mkdir(parents=True, exist_ok=True)
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


# --------------------------------------------------------------------------- digits


def _load_digits(seed: int, test_fraction: float) -> Dataset:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    # the definition of the data set: pixels 0..16, normalised to [0, 1]
    x = (np.asarray(bunch.data, dtype=np.float32) / np.float32(16.0)).reshape(-1, 1, 8, 8)
    y = np.asarray(bunch.target, dtype=np.int64)
    tr, te = _split(x.shape[0], y, test_fraction, seed)
    return _make_dataset(x[tr], y[tr], x[te], y[te], num_classes=10, seed=seed,
                         name="digits", test_fraction=test_fraction, copy=False)


# --------------------------------------------------------------------------- IDX


def _read_maybe_gzip(path: Path) -> bytes:
    with open(path, "rb") as f:
        head = f.read(2)
    opener = gzip.open if head == b"\x1f\x8b" else open
    with opener(path, "rb") as f:
        return f.read()


def parse_idx(path: str | os.PathLike[str], expected_magic: int | None = None) -> np.ndarray:
    """Parse an IDX file (gzipped or plain) of unsigned bytes.

    Parameters
    ----------
    path : str or PathLike
        The file.
    expected_magic : int, optional
        ``2051`` for images, ``2049`` for labels; checked when given.

    Returns
    -------
    np.ndarray
        uint8 array of the shape declared in the header.

    Raises
    ------
    ValueError
        Bad magic number, unsupported element type, or a size that disagrees with the
        header.
    """
    path = Path(path)
    raw = _read_maybe_gzip(path)
    if len(raw) < 4:
        raise ValueError(f"{path}: too short to be an IDX file")
    magic = int.from_bytes(raw[:4], "big")
    zero, dtype_code, ndim = int.from_bytes(raw[:2], "big"), raw[2], raw[3]
    if zero != 0 or dtype_code != 0x08 or ndim == 0:
        raise ValueError(f"{path}: bad IDX magic number {magic} (expected unsigned-byte "
                         "IDX, e.g. 2051 for images or 2049 for labels)")
    if expected_magic is not None and magic != expected_magic:
        raise ValueError(f"{path}: bad IDX magic number {magic}, expected {expected_magic}")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise ValueError(f"{path}: truncated IDX header")
    dims = tuple(int(v) for v in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    count = int(np.prod(dims, dtype=np.int64))
    if len(raw) - header != count:
        raise ValueError(f"{path}: IDX header declares {dims} ({count} bytes) but the file "
                         f"holds {len(raw) - header} data bytes")
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims).copy()


_FMNIST_FILES = {
    "train_x": "train-images-idx3-ubyte",
    "train_y": "train-labels-idx1-ubyte",
    "test_x": "t10k-images-idx3-ubyte",
    "test_y": "t10k-labels-idx1-ubyte",
}


def _find_idx_files(folder: Path) -> dict[str, Path] | None:
    for base in (folder, folder / "FashionMNIST" / "raw"):
        found = {}
        for key, stem in _FMNIST_FILES.items():
            for cand in (base / stem, base / f"{stem}.gz"):
                if cand.is_file():
                    found[key] = cand
                    break
        if len(found) == len(_FMNIST_FILES):
            return found
    return None


def _load_fmnist(data_dir: str | None, download: bool) -> Dataset:
    folders = ([Path(data_dir).expanduser()] if data_dir is not None
               else [Path(DEFAULT_FMNIST_DIR), default_data_root() / "fashion-mnist"])
    files = next((f for f in map(_find_idx_files, folders) if f is not None), None)
    if files is None and download:
        from torchvision.datasets import FashionMNIST

        target = folders[0] if data_dir is not None else folders[-1]
        target.mkdir(parents=True, exist_ok=True)
        FashionMNIST(root=str(target), train=True, download=True)
        FashionMNIST(root=str(target), train=False, download=True)
        files = _find_idx_files(target)
    if files is None:
        where = ", ".join(str(f) for f in folders)
        raise FileNotFoundError(
            f"Fashion-MNIST IDX files ({', '.join(_FMNIST_FILES.values())}, optionally "
            f".gz) not found in {where}. Install the Debian package "
            f"'{_FMNIST_DEBIAN_PACKAGE}' (apt-get install {_FMNIST_DEBIAN_PACKAGE}, files "
            f"in {DEFAULT_FMNIST_DIR}), point data_dir at a folder holding them, or pass "
            "download=True to fetch them with torchvision.")
    train_x = parse_idx(files["train_x"], _IDX_IMAGES_MAGIC)
    train_y = parse_idx(files["train_y"], _IDX_LABELS_MAGIC)
    test_x = parse_idx(files["test_x"], _IDX_IMAGES_MAGIC)
    test_y = parse_idx(files["test_y"], _IDX_LABELS_MAGIC)
    for xs, ys, part in ((train_x, train_y, "train"), (test_x, test_y, "test")):
        if xs.ndim != 3 or ys.ndim != 1 or xs.shape[0] != ys.shape[0]:
            raise ValueError(f"Fashion-MNIST {part}: images {xs.shape} and labels "
                             f"{ys.shape} do not match")
    if max(int(train_y.max(initial=0)), int(test_y.max(initial=0))) > 9:
        raise ValueError("Fashion-MNIST labels must be in 0..9")
    # the definition of the data set: uint8 pixels normalised to [0, 1]
    return _make_dataset(_unit_from_uint8(train_x[:, None]), train_y,
                         _unit_from_uint8(test_x[:, None]), test_y, num_classes=10, seed=0,
                         name="fmnist", test_fraction=0.2, copy=False)


# --------------------------------------------------------------------------- CIFAR-10


class _NumpyOnlyUnpickler(pickle.Unpickler):
    """Unpickler that only rebuilds numpy arrays and plain containers."""

    _ALLOWED = {
        ("numpy", "ndarray"), ("numpy", "dtype"),
        ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
        ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"),
        ("_codecs", "encode"),  # how protocol-2 pickles carry bytes
    }

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a data file")
        if module.startswith("numpy.core.") and hasattr(np, "_core"):
            module = "numpy._core." + module.split(".", 2)[2]
        return super().find_class(module, name)


def _load_pickle(path: Path) -> dict[Any, Any]:
    with open(path, "rb") as f:
        obj = _NumpyOnlyUnpickler(f, encoding="bytes").load()
    if not isinstance(obj, dict):
        raise ValueError(f"{path}: expected a dict, got {type(obj).__name__}")
    return {(k.decode() if isinstance(k, bytes) else k): v for k, v in obj.items()}


def _read_cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    batch = _load_pickle(path)
    if "data" not in batch or "labels" not in batch:
        raise ValueError(f"{path}: not a CIFAR-10 batch (needs 'data' and 'labels')")
    data = np.asarray(batch["data"])
    labels = np.asarray(batch["labels"], dtype=np.int64)
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise ValueError(f"{path}: data must be uint8 (n, 3072), got {data.dtype} "
                         f"{data.shape}")
    if labels.shape != (data.shape[0],) or (labels.size and
                                            (labels.min() < 0 or labels.max() > 9)):
        raise ValueError(f"{path}: labels must be {data.shape[0]} integers in 0..9")
    return data, labels


def _load_cifar10(data_dir: str | None, download: bool) -> Dataset:
    root = Path(data_dir).expanduser() if data_dir is not None else (
        default_data_root() / "cifar10")
    folder = root / "cifar-10-batches-py"
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    missing = [n for n in names if not (folder / n).is_file()]
    if missing and download:
        from torchvision.datasets import CIFAR10

        root.mkdir(parents=True, exist_ok=True)
        CIFAR10(root=str(root), train=True, download=True)
        missing = [n for n in names if not (folder / n).is_file()]
    if missing:
        raise FileNotFoundError(
            f"CIFAR-10 python batches not found in {folder} (missing {', '.join(missing)}). "
            "Unpack cifar-10-python.tar.gz under data_dir, or pass download=True to fetch "
            "it with torchvision.")
    parts = [_read_cifar_batch(folder / n) for n in names[:5]]
    train_x = np.concatenate([p[0] for p in parts])
    train_y = np.concatenate([p[1] for p in parts])
    test_x, test_y = _read_cifar_batch(folder / "test_batch")
    # rows are already channel-major: 1024 red, 1024 green, 1024 blue values
    # the definition of the data set: uint8 pixels normalised to [0, 1]
    return _make_dataset(_unit_from_uint8(train_x.reshape(-1, 3, 32, 32)), train_y,
                         _unit_from_uint8(test_x.reshape(-1, 3, 32, 32)), test_y,
                         num_classes=10, seed=0, name="cifar10", test_fraction=0.2,
                         copy=False)


# --------------------------------------------------------------------------- entry


def load_dataset(
    name: str,
    data_dir: str | None = None,
    seed: int = 0,
    test_fraction: float = 0.2,
    download: bool = False,
) -> Dataset:
    """Load a data set by name.

    Parameters
    ----------
    name : str
        ``"digits"``, ``"fmnist"``, ``"cifar10"`` or ``"npz:<path>"``.
    data_dir : str, optional
        Folder of the files (fmnist: IDX files, default ``/usr/share/datasets/
        fashion-mnist``; cifar10: the folder holding ``cifar-10-batches-py``).
    seed : int
        Seed of the train/test split where the source has none (digits, npz).
    test_fraction : float
        Held-out fraction for those splits.
    download : bool
        Let torchvision download fmnist/cifar10 into ``data_dir`` when missing.

    Returns
    -------
    Dataset
        The loaded data set.

    Raises
    ------
    ValueError
        Unknown name or malformed files.
    FileNotFoundError
        Files missing (the message says where and how to get them).
    """
    key = name.strip()
    if key.lower() == "digits":
        return _load_digits(seed, test_fraction)
    if key.lower() in ("fmnist", "fashion-mnist", "fashion_mnist"):
        return _load_fmnist(data_dir, download)
    if key.lower() in ("cifar10", "cifar-10"):
        return _load_cifar10(data_dir, download)
    if key.lower().startswith("npz:"):
        return _load_npz(key[4:], seed, test_fraction)
    raise ValueError(f"unknown data set {name!r}; known: {', '.join(DATASET_NAMES)}")


@functools.lru_cache(maxsize=4)
def load_dataset_cached(
    name: str,
    data_dir: str | None = None,
    seed: int = 0,
    test_fraction: float = 0.2,
    download: bool = False,
) -> Dataset:
    """`load_dataset` memoised per process (shared by simulated clients in one worker).

    The returned arrays are shared: treat them as read-only.
    """
    return load_dataset(name, data_dir=data_dir, seed=seed, test_fraction=test_fraction,
                        download=download)


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


# --------------------------------------------------------------------------- partitions


class _LabelsKey:
    """Hashable wrapper of a label array (hash of its bytes) for `lru_cache`."""

    __slots__ = ("digest", "labels")

    def __init__(self, labels: np.ndarray) -> None:
        self.labels = labels
        self.digest = hashlib.blake2b(labels.tobytes(), digest_size=16).hexdigest()

    def __hash__(self) -> int:
        return hash(self.digest)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _LabelsKey) and other.digest == self.digest


def _indices_of(partitioner: Any, num_partitions: int) -> list[np.ndarray]:
    return [np.asarray(partitioner.load_partition(i)["idx"], dtype=np.int64)
            for i in range(num_partitions)]


@functools.lru_cache(maxsize=32)
def _partition_cached(
    key: _LabelsKey,
    num_partitions: int,
    scheme: str,
    alpha: float,
    classes_per_partition: int,
    seed: int,
    min_partition_size: int,
) -> tuple[np.ndarray, ...]:
    import datasets
    from flwr_datasets.partitioner import (
        DirichletPartitioner,
        IidPartitioner,
        PathologicalPartitioner,
    )

    labels = key.labels
    n = labels.shape[0]
    datasets.disable_progress_bars()
    if scheme == "iid":
        # IidPartitioner shards contiguously; a seeded permutation makes it random.
        perm = np.random.default_rng(seed).permutation(n)
        table = datasets.Dataset.from_dict({"idx": perm, "label": labels[perm]})
        part: Any = IidPartitioner(num_partitions=num_partitions)
        part.dataset = table
        out = _indices_of(part, num_partitions)
    else:
        table = datasets.Dataset.from_dict({"idx": np.arange(n), "label": labels})
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
                out = _indices_of(part, num_partitions)
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


def partition_indices(
    labels: np.ndarray | Sequence[int] | Sequence[float],
    num_partitions: int,
    scheme: str = "iid",
    alpha: float = 0.5,
    classes_per_partition: int = 2,
    seed: int = 0,
    min_partition_size: int | None = None,
) -> list[np.ndarray]:
    """Split sample indices into federated partitions with flwr-datasets.

    Parameters
    ----------
    labels : array-like
        Target of every sample; only targets are used, never the samples. Integer class
        labels work with every scheme; float regression targets (``(n,)`` or ``(n, k)``)
        only with ``iid``, which needs nothing but their count.
    num_partitions : int
        Number of partitions (clients).
    scheme : {"iid", "dirichlet", "pathological"}
        ``iid``: seeded shuffle then equal shards (`IidPartitioner`); ``dirichlet``:
        per-class Dirichlet(alpha) proportions (`DirichletPartitioner`); ``pathological``:
        ``classes_per_partition`` classes per client (`PathologicalPartitioner`,
        first class deterministic so every class is used when possible).
    alpha : float
        Dirichlet concentration (smaller = more skewed).
    classes_per_partition : int
        Classes per client for ``pathological``.
    seed : int
        Seed; the same arguments always give the same partitions.
    min_partition_size : int, optional
        Dirichlet only; default ``min(10, n // (2 * num_partitions))`` but at least 1.

    Returns
    -------
    list of np.ndarray
        int64 index arrays, one per partition, pairwise disjoint and non-empty;
        together they cover all samples for ``iid`` and ``dirichlet``.

    Raises
    ------
    ValueError
        Bad arguments, float targets with a label-based scheme, or non-empty partitions
        cannot be built.
    """
    arr = np.asarray(labels)
    scheme = scheme.lower()
    if scheme not in PARTITION_SCHEMES:
        raise ValueError(f"unknown partition scheme {scheme!r}; known: "
                         f"{', '.join(PARTITION_SCHEMES)}")
    if int(num_partitions) < 1:
        raise ValueError(f"num_partitions must be >= 1, got {num_partitions}")
    if arr.dtype.kind == "f" and arr.size:
        if scheme != "iid":
            raise ValueError(f"the {scheme!r} partition scheme splits by class label, but "
                             "the targets are float (a regression data set); use "
                             "scheme='iid'")
        if arr.ndim < 1:
            raise ValueError(f"targets must have a sample axis, got shape {arr.shape}")
        # IID shards depend on the sample count only
        y = np.zeros(arr.shape[0], dtype=np.int64)
    else:
        y = np.array(arr, dtype=np.int64).reshape(-1)  # a private copy for the cache key
    n = int(y.shape[0])
    if n < num_partitions:
        raise ValueError(f"cannot split {n} samples into {num_partitions} non-empty "
                         "partitions")
    if scheme == "dirichlet" and not (alpha > 0 and np.isfinite(alpha)):
        raise ValueError(f"alpha must be a positive number, got {alpha}")
    if scheme == "pathological" and classes_per_partition < 1:
        raise ValueError(f"classes_per_partition must be >= 1, got {classes_per_partition}")
    if min_partition_size is None:
        min_partition_size = max(1, min(10, n // (2 * num_partitions)))
    elif min_partition_size < 1:
        raise ValueError("min_partition_size must be >= 1 (partitions must be non-empty)")
    key = _LabelsKey(y)
    parts = _partition_cached(key, int(num_partitions), scheme, float(alpha),
                              int(classes_per_partition), int(seed), int(min_partition_size))
    return [p.copy() for p in parts]


def load_partition(
    name: str,
    partition_id: int,
    num_partitions: int,
    scheme: str = "iid",
    alpha: float = 0.5,
    seed: int = 0,
    data_dir: str | None = None,
    classes_per_partition: int = 2,
    validation_fraction: float = 0.0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Load one client's training rows.

    With ``validation_fraction`` > 0 the partitions split the training rows left after the
    validation split of :func:`load_task_dataset` (the ids index those rows).

    The data set is loaded once per process (`load_dataset_cached`, whose split uses
    ``seed``), partitioned with `partition_indices` on the training targets, and only
    this partition's rows are copied out. Regression data sets (float targets) can only
    be partitioned ``iid``.

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
    ds = load_task_dataset(name, data_dir, seed, validation_fraction)
    ids = partition_indices(ds.train_y, num_partitions, scheme, alpha=alpha,
                            classes_per_partition=classes_per_partition,
                            seed=seed)[partition_id]
    return ds.train_x[ids], ds.train_y[ids], ids
