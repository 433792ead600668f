"""A device's own samples: node-local data files (node config key ``data-file``).

:func:`load_node_data` reads one ``.npz`` (or pickle) file of a device's rows, kept as
given, only checked; :func:`save_node_data` writes one atomically.
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

from dq_flower.harness.tasks.data.arrays import as_inputs, as_labels, as_targets, npz_path

__all__ = ["NODE_DATA_CONFIG_KEY", "NodeData", "load_node_data", "save_node_data"]

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
