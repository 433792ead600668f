"""A device's own training data, as the client functions accept it.

``data`` may be a pair of numpy arrays ``(x, y)``, a map-style torch ``Dataset`` yielding
``(x, y)`` (a ``TensorDataset``, a torchvision data set with its transform, ...) or a
``DataLoader``. Every form becomes the same two arrays, in a fixed order, because a client
identifies its samples by their row number across rounds:

- ``x``: float32 ``(n, *sample_shape)``, values exactly as given (never rescaled);
- ``y``: int64 ``(n,)`` class labels when the targets are integers, else float32
  ``(n,)`` or ``(n, k)`` regression targets.

A ``DataLoader`` over a map-style data set is read through its ``dataset`` in index
order (its sampler and shuffling are ignored, so row ids stay stable across rounds); a
loader over an iterable data set is read batch by batch and must yield the same rows in the
same order every time.

PyTorch is not needed for numpy data: torch's types are checked only where torch is
already imported (a torch object exists only then), so a client without PyTorch works.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["as_arrays", "is_class_target"]

#: Converted arrays of recently seen data objects (a client handler gets the same object
#: every round), keyed by ``id`` and dropped when the object is collected.
_CACHE: dict[int, tuple[Any, tuple[np.ndarray, np.ndarray]]] = {}


def is_class_target(y: np.ndarray) -> bool:
    """Whether ``y`` holds class labels (integers or booleans) rather than float targets."""
    return np.issubdtype(y.dtype, np.integer) or y.dtype == np.bool_


def _loaded_torch() -> Any:
    """The ``torch`` module if this process imported it, else ``None`` (never imports it)."""
    return sys.modules.get("torch")


def _to_numpy(value: Any) -> np.ndarray:
    torch = _loaded_torch()
    if torch is not None and isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    return np.asarray(value)


def _normalise(x: Any, y: Any, what: str) -> tuple[np.ndarray, np.ndarray]:
    xa, ya = _to_numpy(x), _to_numpy(y)
    if xa.ndim < 1 or ya.ndim < 1:
        raise ValueError(f"{what}: x and y need a leading sample axis")
    if xa.shape[0] != ya.shape[0]:
        raise ValueError(f"{what}: x has {xa.shape[0]} samples, y has {ya.shape[0]}")
    if xa.ndim == 1:
        xa = xa.reshape(-1, 1)
    if not (np.issubdtype(xa.dtype, np.number) or xa.dtype == np.bool_):
        raise ValueError(f"{what}: x must be numeric, got dtype {xa.dtype}")
    xa = np.ascontiguousarray(xa, dtype=np.float32)
    if xa.size and not np.isfinite(xa).all():
        raise ValueError(f"{what}: x contains NaN or infinite values")
    if is_class_target(ya):
        ya = ya.astype(np.int64).reshape(-1)
        if ya.size and ya.min() < 0:
            raise ValueError(f"{what}: class labels must be >= 0, got {int(ya.min())}")
    elif np.issubdtype(ya.dtype, np.floating):
        ya = np.ascontiguousarray(ya, dtype=np.float32)
        if ya.ndim > 2:
            raise ValueError(f"{what}: float targets must be (n,) or (n, k), got {ya.shape}")
        if ya.size and not np.isfinite(ya).all():
            raise ValueError(f"{what}: y contains NaN or infinite values")
    else:
        raise ValueError(f"{what}: y must hold integer labels or float targets, "
                         f"got dtype {ya.dtype}")
    return xa, ya


def _stack_items(items: Sequence[tuple[Any, Any]], what: str) -> tuple[np.ndarray, np.ndarray]:
    if not items:
        raise ValueError(f"{what} is empty")
    xs, ys = [], []
    for i, item in enumerate(items):
        if not isinstance(item, (tuple, list)) or len(item) < 2:
            raise ValueError(f"{what}[{i}] must be a pair (x, y), got {type(item).__name__}")
        xs.append(_to_numpy(item[0]))
        ys.append(_to_numpy(item[1]))
    return np.stack(xs), np.stack(ys)


def _convert(data: Any) -> tuple[np.ndarray, np.ndarray]:
    torch = _loaded_torch()
    if torch is not None:
        from torch.utils.data import DataLoader, Dataset, IterableDataset

    if isinstance(data, (tuple, list)) and len(data) == 2 and not isinstance(data[0], tuple):
        return _normalise(data[0], data[1], "data (x, y)")
    if torch is not None and isinstance(data, DataLoader):
        inner = data.dataset
        if not isinstance(inner, IterableDataset) and hasattr(inner, "__len__"):
            return _convert(inner)
        xs, ys = [], []
        for batch in data:
            if not isinstance(batch, (tuple, list)) or len(batch) < 2:
                raise ValueError("DataLoader batches must be pairs (x, y)")
            xs.append(_to_numpy(batch[0]))
            ys.append(_to_numpy(batch[1]))
        if not xs:
            raise ValueError("the DataLoader yielded no batches")
        return _normalise(np.concatenate(xs), np.concatenate(ys), "DataLoader")
    if (torch is not None and isinstance(data, Dataset)) or (
            hasattr(data, "__getitem__") and hasattr(data, "__len__")):
        if (torch is not None and isinstance(data, torch.utils.data.TensorDataset)
                and len(data.tensors) >= 2):
            return _normalise(data.tensors[0], data.tensors[1], "TensorDataset")
        name = type(data).__name__
        x, y = _stack_items([data[i] for i in range(len(data))], name)
        return _normalise(x, y, name)
    raise TypeError("data must be numpy arrays (x, y), a map-style torch Dataset of (x, y) "
                    f"pairs, or a DataLoader; got {type(data).__name__}")


def as_arrays(data: Any) -> tuple[np.ndarray, np.ndarray]:
    """The device's data as ``(x, y)`` numpy arrays (see the module docstring).

    Raises ``TypeError`` for an unsupported type and ``ValueError`` for inconsistent,
    non-finite or empty data.
    """
    key = id(data)
    hit = _CACHE.get(key)
    if hit is not None and hit[0]() is data:
        return hit[1]
    arrays = _convert(data)
    try:
        ref = weakref.ref(data)
    except TypeError:  # tuples and lists cannot be weakly referenced: convert each time
        return arrays
    _CACHE[key] = (ref, arrays)
    weakref.finalize(data, _CACHE.pop, key, None)
    return arrays
