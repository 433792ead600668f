"""Data sets and federated partitions.

Every data set is held as flat float32 rows scaled to ``[0, 1]`` plus int64 labels;
``Dataset.input_shape`` remembers the original sample shape so models can reshape.
Sources: scikit-learn's digits (embedded, no download), Fashion-MNIST from IDX files,
CIFAR-10 from torchvision's python-pickle folder, any ``.npz`` file and any numpy pair.

Partitions are computed with flwr-datasets partitioners on an in-memory table of
``(idx, label)`` only, so partitioning never copies the samples themselves.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import os
import pickle
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "DATASET_NAMES",
    "DEFAULT_FMNIST_DIR",
    "PARTITION_SCHEMES",
    "Dataset",
    "default_data_root",
    "from_arrays",
    "load_dataset",
    "load_dataset_cached",
    "load_partition",
    "parse_idx",
    "partition_indices",
    "save_npz",
]

DATASET_NAMES: tuple[str, ...] = ("digits", "fmnist", "cifar10", "npz:<path>")
PARTITION_SCHEMES: tuple[str, ...] = ("iid", "dirichlet", "pathological")
DEFAULT_FMNIST_DIR = "/usr/share/datasets/fashion-mnist"
_FMNIST_DEBIAN_PACKAGE = "dataset-fashion-mnist"
_IDX_IMAGES_MAGIC = 2051
_IDX_LABELS_MAGIC = 2049


@dataclass(frozen=True, eq=False)
class Dataset:
    """A classification data set held as flat rows (compared by identity).

    Attributes
    ----------
    train_x, test_x : np.ndarray
        float32, shape ``(n, d)``, values in ``[0, 1]``.
    train_y, test_y : np.ndarray
        int64 labels in ``[0, num_classes)``.
    num_classes : int
        Number of classes.
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
        for part, x, y in (("train", self.train_x, self.train_y),
                           ("test", self.test_x, self.test_y)):
            if x.ndim != 2 or x.shape[1] != d:
                raise ValueError(f"{part}_x must have shape (n, {d}), got {x.shape}")
            if y.shape != (x.shape[0],):
                raise ValueError(f"{part}_y must have shape ({x.shape[0]},), got {y.shape}")
        if self.num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {self.num_classes}")

    @property
    def dim(self) -> int:
        """Data dimension d (features per flat row)."""
        return int(self.train_x.shape[1])

    @property
    def num_train(self) -> int:
        """Number of training samples."""
        return int(self.train_x.shape[0])


# --------------------------------------------------------------------------- helpers


def default_data_root() -> Path:
    """Folder for downloads: ``$DQ_FLOWER_DATA`` or ``~/.cache/dq_flower``."""
    return Path(os.environ.get("DQ_FLOWER_DATA", Path.home() / ".cache" / "dq_flower"))


def _scale_pair(train: np.ndarray, test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Scale train and test inputs to float32 in ``[0, 1]`` with the training range.

    uint8 data is divided by 255. Data already inside ``[0, 1]`` is kept. Non-negative
    data is divided by its maximum; data with negative values is min-max scaled. Test
    values outside the training range are clipped.
    """
    if train.dtype == np.uint8 and test.dtype == np.uint8:
        scale = np.float32(1.0 / 255.0)
        return train.astype(np.float32) * scale, test.astype(np.float32) * scale
    tr, te = train.astype(np.float32), test.astype(np.float32)
    if not (np.all(np.isfinite(tr)) and np.all(np.isfinite(te))):
        raise ValueError("inputs contain NaN or infinite values")
    lo, hi = (float(tr.min()), float(tr.max())) if tr.size else (0.0, 1.0)
    if lo >= 0.0 and hi <= 1.0:
        return tr, np.clip(te, 0.0, 1.0)
    lo = min(lo, 0.0)  # non-negative data: divide by the max
    span = np.float32(hi - lo if hi > lo else 1.0)
    tr = np.clip((tr - np.float32(lo)) / span, 0.0, 1.0)
    te = np.clip((te - np.float32(lo)) / span, 0.0, 1.0)
    return tr, te


def _as_labels(y: np.ndarray, what: str) -> np.ndarray:
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


def _split(
    n: int, y: np.ndarray, test_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Seeded (stratified where possible) train/test index split."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    from sklearn.model_selection import train_test_split

    idx = np.arange(n)
    counts = np.bincount(y) if y.size else np.zeros(0, dtype=np.int64)
    present = counts[counts > 0]
    stratify = y if present.size and present.min() >= 2 else None
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
    """Build a `Dataset` from numpy arrays.

    Parameters
    ----------
    x, y : np.ndarray
        Inputs of shape ``(n, *input_shape)`` (flattened here) and integer labels.
    x_test, y_test : np.ndarray, optional
        Test split; when absent, ``test_fraction`` of ``(x, y)`` is held out with ``seed``.
    num_classes : int, optional
        Defaults to ``max(label) + 1``.
    seed : int
        Seed of the held-out split.
    name : str
        Name recorded in the data set.
    test_fraction : float
        Held-out fraction when no test split is given.

    Returns
    -------
    Dataset
        Inputs scaled to ``[0, 1]`` (uint8 by 255; other data outside ``[0, 1]`` by the
        training range).
    """
    x = np.asarray(x)
    y = _as_labels(y, "y")
    if x.ndim < 1 or x.shape[0] != y.shape[0]:
        raise ValueError(f"x and y disagree on the sample count: {x.shape} vs {y.shape}")
    if x.shape[0] == 0:
        raise ValueError("x is empty")
    if x.dtype.kind not in "fiub":
        raise ValueError(f"x must be numeric, got dtype {x.dtype}")
    input_shape = tuple(int(s) for s in x.shape[1:]) or (1,)
    if (x_test is None) != (y_test is None):
        raise ValueError("give both x_test and y_test, or neither")
    if x_test is None:
        tr, te = _split(x.shape[0], y, test_fraction, seed)
        x, x_test, y, y_test = x[tr], x[te], y[tr], y[te]
    else:
        x_test = np.asarray(x_test)
        y_test = _as_labels(y_test, "y_test")
        if int(np.prod(x_test.shape[1:])) != int(np.prod(input_shape)):
            raise ValueError(f"x_test sample shape {x_test.shape[1:]} != {x.shape[1:]}")
        if x_test.shape[0] != y_test.shape[0]:
            raise ValueError("x_test and y_test disagree on the sample count")
    max_label = int(max(y.max(initial=-1), y_test.max(initial=-1)))
    if num_classes is None:
        num_classes = max_label + 1
    elif max_label >= num_classes:
        raise ValueError(f"label {max_label} out of range for num_classes={num_classes}")
    d = int(np.prod(input_shape))
    train_x, test_x = _scale_pair(x.reshape(x.shape[0], d), x_test.reshape(x_test.shape[0], d))
    return Dataset(train_x=np.ascontiguousarray(train_x), train_y=y,
                   test_x=np.ascontiguousarray(test_x), test_y=y_test,
                   num_classes=int(num_classes), input_shape=input_shape, name=name)


def save_npz(dataset: Dataset, path: str | os.PathLike[str]) -> Path:
    """Write a `Dataset` to ``path`` so that ``load_dataset("npz:<path>")`` reads it back.

    Inputs are stored in their original sample shape (``input_shape``), as float32.

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
        return from_arrays(f["x_train"], f["y_train"],
                           f["x_test"] if has_test else None,
                           f["y_test"] if has_test else None,
                           num_classes=nc, seed=seed, name=f"npz:{p.name}",
                           test_fraction=test_fraction)


# --------------------------------------------------------------------------- digits


def _load_digits(seed: int, test_fraction: float) -> Dataset:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = (np.asarray(bunch.data, dtype=np.float32) / np.float32(16.0)).reshape(-1, 1, 8, 8)
    y = np.asarray(bunch.target, dtype=np.int64)
    tr, te = _split(x.shape[0], y, test_fraction, seed)
    return from_arrays(x[tr], y[tr], x[te], y[te], num_classes=10, name="digits")


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
    return from_arrays(train_x[:, None], train_y, test_x[:, None], test_y, num_classes=10,
                       name="fmnist")


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
    return from_arrays(train_x.reshape(-1, 3, 32, 32), train_y,
                       test_x.reshape(-1, 3, 32, 32), test_y, num_classes=10,
                       name="cifar10")


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
    labels: np.ndarray | Sequence[int],
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
    labels : array-like of int
        Label of every sample; only labels are used, never the samples.
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
        Bad arguments, or non-empty partitions cannot be built.
    """
    y = np.array(labels, dtype=np.int64).reshape(-1)  # a private copy for the cache key
    n = int(y.shape[0])
    scheme = scheme.lower()
    if scheme not in PARTITION_SCHEMES:
        raise ValueError(f"unknown partition scheme {scheme!r}; known: "
                         f"{', '.join(PARTITION_SCHEMES)}")
    if int(num_partitions) < 1:
        raise ValueError(f"num_partitions must be >= 1, got {num_partitions}")
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
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Load one client's training rows.

    The data set is loaded once per process (`load_dataset_cached`, whose split uses
    ``seed``), partitioned with `partition_indices` on the training labels, and only
    this partition's rows are copied out.

    Returns
    -------
    x : np.ndarray
        float32 ``(m, d)`` rows (a copy).
    y : np.ndarray
        int64 ``(m,)`` labels (a copy).
    global_ids : np.ndarray
        int64 ``(m,)`` row indices in the full training set.
    """
    if not 0 <= partition_id < num_partitions:
        raise ValueError(f"partition_id {partition_id} not in [0, {num_partitions})")
    ds = load_dataset_cached(name, data_dir, seed)
    ids = partition_indices(ds.train_y, num_partitions, scheme, alpha=alpha,
                            classes_per_partition=classes_per_partition,
                            seed=seed)[partition_id]
    return ds.train_x[ids], ds.train_y[ids], ids
