"""A device's arrays as DQ reads them: numbers of one dtype, finite, with typed targets.

:func:`to_numpy` takes tensors, SciPy sparse matrices and pandas tables of numbers;
:func:`normalise` makes ``(x, y)`` float32 samples and int64 class labels or float32
targets, refusing what DQ cannot send with what to do (:mod:`dq_flower.data_input` reads
every form of a device's data down to these).
"""

from __future__ import annotations

import math
import random
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from logging import WARNING
from typing import Any

import numpy as np

from dq_flower.wire.targets import IGNORE_INDEX

__all__ = ["is_class_target", "normalise", "to_numpy", "missing_values", "fill_holes",
           "fixed_draws"]

_TOLD: set[tuple[Any, ...]] = set()  # warnings given in this process (each said once)
#: How missing values (NaN) of the samples are read (:func:`missing_values`).
_NAN_MODE: ContextVar[str] = ContextVar("nan_mode", default="")


@contextmanager
def missing_values(mode: str) -> Iterator[None]:
    """Within it, :func:`normalise` keeps NaN values as 0 (``zero``) or NaN (``keep``).

    Else (``""``) a row holding one is left out. The server asks so where its model reads
    NaN as 0 (``torch.nan_to_num(x)`` first), or otherwise but finite (``torch.isnan(x)``
    beside them: where they are travels too).
    """
    token = _NAN_MODE.set(mode)
    try:
        yield
    finally:
        _NAN_MODE.reset(token)


@contextmanager
def fixed_draws(seed: int = 0) -> Iterator[None]:
    """Within it, the global generators (PyTorch's CPU one, numpy's, ``random``'s) are seeded.

    Each starts at ``seed`` and is restored after.

    A data set that draws as it reads (torchvision's ``RandomCrop``, ``RandomHorizontalFlip``
    on every ``__getitem__``) then gives the same rows each round: a row keeps its name
    (:func:`dq_flower.dq.client.sent.row_names` names rows by content), so one uploaded
    is not offered again as new, and the node's count is its rows, not its reads.
    """
    torch = sys.modules.get("torch")  # never imported here
    generator = torch.random.default_generator if torch is not None else None
    states = (random.getstate(), np.random.get_state(),
              None if generator is None else generator.get_state())
    try:
        random.seed(seed)
        np.random.seed(seed)
        if generator is not None:
            generator.manual_seed(seed)
        yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        if generator is not None:
            generator.set_state(states[2])


def fill_holes(x: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """Flat rows ``x``, each NaN its column's lowest value (or 0), and where they were.

    Where none is: ``x`` itself and ``None``.
    """
    holes = np.isnan(x)
    if not holes.any():
        return x, None
    low = np.nan_to_num(np.min(x, axis=0, initial=np.inf, where=~holes), posinf=0.0)
    return np.where(holes, low.astype(x.dtype), x), holes


def is_class_target(y: np.ndarray) -> bool:
    """Whether ``y`` holds class labels (integers or booleans) rather than float targets."""
    return np.issubdtype(y.dtype, np.integer) or y.dtype == np.bool_


def to_numpy(value: Any) -> np.ndarray:
    """``value`` (a tensor, an array, a sparse matrix, a pandas table) as a numpy array."""
    torch = sys.modules.get("torch")  # never imported here
    if torch is not None and isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    if hasattr(value, "toarray") and hasattr(value, "nnz"):  # a SciPy sparse matrix (TF-IDF)
        return np.asarray(value.toarray())
    out = np.asarray(value)
    if out.dtype == object and hasattr(value, "to_numpy") and hasattr(value, "isna"):
        return _pandas_numbers(value, out)
    return out


def _pandas_numbers(value: Any, mixed: np.ndarray) -> np.ndarray:
    """A pandas frame or series whose columns are all numbers or booleans, as one array.

    ``pd.get_dummies`` (bool columns beside float ones) and nullable ``Int64`` columns make
    ``np.asarray`` an object array; they are numbers: int64 where every column is integer or
    bool and no value is missing, else float64 (a missing value as NaN, refused later with
    its reason). ``mixed`` (the object array) is returned where a column is not a number.
    """
    dtypes = list(value.dtypes) if hasattr(value, "columns") else [value.dtype]
    try:
        kinds = {np.dtype(getattr(d, "numpy_dtype", d)).kind for d in dtypes}
    except TypeError:  # a dtype numpy does not know (categories, strings)
        return mixed
    if not kinds <= set("biuf"):
        return mixed
    if kinds <= set("biu") and not bool(np.asarray(value.isna()).any()):
        return value.to_numpy(dtype=np.int64)
    return value.to_numpy(dtype=np.float64, na_value=np.nan)


def normalise(x: Any, y: Any, what: str) -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)`` as float32 samples and int64 labels or float32 targets; or ValueError."""
    xa, ya = to_numpy(x), to_numpy(y)
    if xa.ndim < 1 or ya.ndim < 1:
        raise ValueError(f"{what}: x and y need a leading sample axis")
    if xa.shape[0] != ya.shape[0]:
        raise ValueError(f"{what}: x has {xa.shape[0]} samples, y has {ya.shape[0]}")
    if xa.ndim == 1:
        xa = xa.reshape(-1, 1)
    if not (np.issubdtype(xa.dtype, np.number) or xa.dtype == np.bool_):
        named = [f"{c!r} ({t})" for c, t in getattr(x, "dtypes", {}).items()
                 if str(t) in ("object", "category", "string", "str")]
        raise ValueError(f"{what}: x must be numeric, got dtype {xa.dtype}"
                         + (f": columns {', '.join(named)}" if named else "")
                         + " (a table's text columns: encode them as numbers, one mapping for "
                         "every node; a category column: frame[col].cat.codes, the same "
                         "categories everywhere)")
    xa = np.ascontiguousarray(xa, dtype=np.float32)
    holes = np.isnan(xa) if _NAN_MODE.get() else None  # as the server's model reads them
    if holes is not None and holes.any():  # NaN as 0, or kept: rows of an infinity left out
        bad = _non_finite(filled := np.where(holes, np.float32(0), xa))
        xa = filled if _NAN_MODE.get() == "zero" else xa
    else:
        bad = _non_finite(xa)
    several = ya.ndim > 1 and math.prod(ya.shape[1:]) > 1
    if is_class_target(ya) and several:
        ya = _several_labels(ya, what)
    if is_class_target(ya):
        ya = ya.astype(np.int64) if several else ya.astype(np.int64).reshape(-1)
        low = int((ya[ya != IGNORE_INDEX] if several else ya).min(initial=0))
        if low < 0:  # a tagger's padding may be PyTorch's ignore_index
            raise ValueError(f"{what}: class labels must be >= 0, got {low}" + (
                f" ({IGNORE_INDEX}, PyTorch's ignore_index, is taken among the labels of each "
                "element of a sample)" if several else ""))
    elif np.issubdtype(ya.dtype, np.floating):
        ya = np.ascontiguousarray(ya, dtype=np.float32)
        if ya.ndim > 2 and not (ya.shape == xa.shape and np.array_equal(ya, xa)):
            raise ValueError(f"{what}: float targets must be (n,) or (n, k) (or the samples "
                             f"themselves, an autoencoder's), got {ya.shape}")
        bad |= _non_finite(ya)
    else:
        hint = ("; map class names to ids with one mapping for every node (a fixed list of "
                "names; a LabelEncoder fitted on each node's own labels numbers them apart)"
                if ya.dtype.kind in "OUS" else "")
        raise ValueError(f"{what}: y must hold integer labels or float targets, "
                         f"got dtype {ya.dtype}{hint}")
    return _finite_rows(xa, ya, bad, what)


def _non_finite(a: np.ndarray) -> np.ndarray:
    """Which rows of ``a`` hold a NaN or an infinity."""
    if not a.size:
        return np.zeros(a.shape[0], dtype=bool)
    return ~np.isfinite(a).reshape(a.shape[0], -1).all(axis=1)


def _finite_rows(x: np.ndarray, y: np.ndarray, bad: np.ndarray, what: str
                 ) -> tuple[np.ndarray, np.ndarray]:
    """The rows of ``(x, y)`` without a NaN or infinite value; said once, or refused if none.

    DQ quantizes values, so a row with a missing one cannot travel: it is left out (a node
    with 8 such rows of 1,000 was refused whole, every round).
    """
    if not bad.any():
        return x, y
    fill = ("fill missing values on the device before dq_train to keep those rows (as your "
            "model would: np.nan_to_num, or each column's mean)")
    if bad.all():
        raise ValueError(f"{what}: every row contains NaN or infinite values: DQ quantizes "
                         f"values, so {fill}")
    line = (f"{what}: %d of %d rows contain NaN or infinite values and are left out; {fill}",
            int(bad.sum()), int(bad.size))
    if line not in _TOLD:
        _TOLD.add(line)
        from flwr.common.logger import log  # Flower's logger: the node's log

        log(WARNING, *line)
    return x[~bad], y[~bad]


def _several_labels(ya: np.ndarray, what: str) -> np.ndarray:
    """Integer targets of several values a sample: 0/1 labels ``(n, k)`` as float32 targets.

    (``MultiLabelBinarizer`` and ``one_hot`` give them as integers; a multi-label model's
    loss reads them as floats.) Others are class labels of each element of a sample, kept
    in shape: a segmentation mask ``(n, H, W)``, per-token tags ``(n, L)`` (0/1 tags read
    as several labels a sample: give a mask of 0/1 as ``(n, H, W)``).
    """
    if ya.ndim == 2 and ya.size and np.isin(ya, (0, 1)).all():
        return ya.astype(np.float32)
    if ya.ndim > 5:
        raise ValueError(f"{what}: integer targets of shape {ya.shape}: class labels of at "
                         "most 4 axes a sample are taken (a mask (n, H, W), tags (n, L))")
    return ya
