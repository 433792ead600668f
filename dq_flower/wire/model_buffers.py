"""A model's float buffers (BatchNorm's statistics), sent by the gradient baselines both ways."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from flwr.app import Array, ArrayRecord

from dq_flower.codecs import PayloadError

__all__ = ["BUFFERS_KEY", "buffers_record", "read_buffers", "statistic_problem",
           "weighted_buffers"]

BUFFERS_KEY = "model-buffers"


def buffers_record(buffers: Mapping[str, np.ndarray]) -> ArrayRecord:
    """The buffers as a record of float32 arrays, in the given order."""
    return ArrayRecord({name: Array(np.array(value, dtype=np.float32, order="C"))
                        for name, value in buffers.items()})


def read_buffers(record: ArrayRecord, shapes: Mapping[str, tuple[int, ...]],
                 own: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """The buffers of ``record``, checked against ``shapes``; ``PayloadError`` with why.

    ``own``: the reader's model's buffers; a non-finite entry it holds too, the same, is the
    model's constant (a causal mask's ``-inf``), not a broken statistic.
    """
    if list(record.keys()) != list(shapes):
        raise PayloadError(f"{BUFFERS_KEY} holds {list(record.keys())[:4]}..., expected "
                           f"the model's {len(shapes)} floating-point buffers")
    out: dict[str, np.ndarray] = {}
    for name, shape in shapes.items():
        arr = record[name]
        if str(arr.dtype) != "float32" or tuple(arr.shape) != tuple(shape):
            raise PayloadError(f"{BUFFERS_KEY}[{name!r}] is {arr.dtype} {tuple(arr.shape)}, "
                               f"expected float32 {tuple(shape)}")
        value = arr.numpy()
        mine = None if own is None else own.get(name)
        problem = statistic_problem(name, value if mine is None or mine.shape != value.shape
                                    else np.where(value == mine, 0, value))
        if problem is not None:
            raise PayloadError(f"{BUFFERS_KEY}[{name!r}] {problem}")
        out[name] = value
    return out


def statistic_problem(name: str, value: np.ndarray) -> str | None:
    """Why a buffer named ``name`` cannot hold ``value`` (``None``: it can).

    Floating-point values must be finite, a ``running_var``'s non-negative.
    """
    if value.dtype.kind not in "fc":
        return None
    if not np.isfinite(value).all():
        return "is not finite"
    if name.endswith("running_var") and (value < 0).any():
        return "has a negative variance"
    return None


def weighted_buffers(parts: list[dict[str, np.ndarray]],
                     weights: list[float]) -> dict[str, np.ndarray]:
    """The ``weights``-weighted mean of each buffer over ``parts`` (float32)."""
    w = np.asarray(weights, dtype=np.float64)
    pairs = list(zip(w / w.sum(), parts, strict=True))
    return {name: np.asarray(sum(wi * p[name].astype(np.float64) for wi, p in pairs),
                             dtype=np.float32) for name in parts[0]}
