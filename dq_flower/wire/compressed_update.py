"""What the wrapper and the mod share: record names and the layout of the model's arrays.

A train message of :class:`dq_flower.CompressedUpdates` is the inner strategy's message with
the knobs added to its config (``compression-*`` keys). With ``downlink="fp16"`` its one
``ArrayRecord`` is replaced by ``compression-model`` (every coded array, flat, as an
``fp16`` codec payload), ``compression-raw`` (the other arrays, as they were) and the
layout in the config (``compression-layout``, JSON), from which the mod rebuilds the
``ArrayRecord`` the user's ``train()`` reads.

A reply carries the update (returned minus received weights of the coded arrays, flat or
per array) as codec payloads ``compression-update`` (or ``compression-update-<i>``), the
other arrays as returned under ``compression-raw``, and the user's own ``MetricRecord``
(and any ``ConfigRecord``) untouched. The coded arrays are the floating-point ones but
BatchNorm's running statistics (names ending in ``running_mean`` / ``running_var``), which
travel as they are: a lossy codec could turn a variance negative.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord

from dq_flower.codecs import PayloadError

__all__ = ["Layout", "MODEL_KEY", "RAW_KEY", "UPDATE_KEY", "LAYOUT_KEY", "FLOAT_DTYPES",
           "RAW_SUFFIXES", "MAX_ARRAYS"]

#: Record of the fp16-coded floating-point arrays of a train message (``downlink="fp16"``).
MODEL_KEY = "compression-model"
#: Record of the arrays that are not floating point (counters such as BatchNorm's).
RAW_KEY = "compression-raw"
#: Record name (and prefix, per array) of the coded update in a reply.
UPDATE_KEY = "compression-update"
#: Config key of the JSON layout (``downlink="fp16"``).
LAYOUT_KEY = "compression-layout"
#: Array dtypes whose update is coded; every other array travels as it is.
FLOAT_DTYPES = ("float16", "float32", "float64")
#: Name endings of floating-point arrays that travel as they are all the same: BatchNorm's
#: running statistics (PyTorch's names), which a lossy codec could make negative variances.
RAW_SUFFIXES = ("running_mean", "running_var")
#: Most arrays a layout may list, and most dimensions per array.
MAX_ARRAYS = 1 << 16
MAX_NDIM = 16


@dataclass(frozen=True)
class Layout:
    """Names, dtypes and shapes of the arrays of one ``ArrayRecord``, in order.

    Attributes
    ----------
    key : str
        The record's name in the message (``arrays`` for Flower's strategies).
    names, dtypes : tuple of str
        Each array's name and numpy dtype.
    shapes : tuple of tuple of int
        Each array's shape.
    """

    key: str
    names: tuple[str, ...]
    dtypes: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]

    @classmethod
    def of(cls, key: str, record: ArrayRecord) -> Layout:
        """The layout of ``record`` (named ``key``)."""
        items = list(record.items())
        return cls(key, tuple(k for k, _ in items), tuple(str(a.dtype) for _, a in items),
                   tuple(tuple(int(d) for d in a.shape) for _, a in items))

    # ------------------------------------------------------------------ coded arrays
    def is_coded(self, i: int) -> bool:
        """Whether array ``i``'s update is coded: floating point, not a BatchNorm statistic."""
        return self.dtypes[i] in FLOAT_DTYPES and not self.names[i].endswith(RAW_SUFFIXES)

    @property
    def coded(self) -> list[int]:
        """Positions of the arrays whose update is coded."""
        return [i for i in range(len(self.names)) if self.is_coded(i)]

    @property
    def raw(self) -> list[int]:
        """Positions of the other arrays (sent as they are)."""
        return [i for i in range(len(self.names)) if not self.is_coded(i)]

    @property
    def coded_shapes(self) -> list[tuple[int, ...]]:
        """Shapes of the floating-point arrays."""
        return [self.shapes[i] for i in self.coded]

    @property
    def coded_sizes(self) -> list[int]:
        """Element counts of the floating-point arrays."""
        return [math.prod(s) for s in self.coded_shapes]

    @property
    def dim(self) -> int:
        """Total floating-point elements: the length of the flat update."""
        return int(sum(self.coded_sizes))

    def flat(self, record: ArrayRecord) -> np.ndarray:
        """The floating-point arrays of ``record`` as one float32 vector."""
        self.check(record, "arrays")
        parts = [np.asarray(record[self.names[i]].numpy(), dtype=np.float32).reshape(-1)
                 for i in self.coded]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)

    def raw_record(self, record: ArrayRecord) -> ArrayRecord:
        """The arrays of ``record`` that are not floating point."""
        return ArrayRecord({self.names[i]: record[self.names[i]] for i in self.raw})

    def with_dtypes(self, record: ArrayRecord) -> ArrayRecord:
        """``record`` with each array of this layout back in the layout's dtype.

        An aggregate averages integer arrays (a batch-norm layer's ``num_batches_tracked``)
        into floats, of shape ``(1,)`` where they were scalars (as Flower's FedAvg returns
        them); they are rounded and reshaped back, so every round's broadcast has one
        layout.
        """
        arrays: dict[str, Array] = {}
        for name, arr in record.items():
            if name not in self.names:
                arrays[name] = arr
                continue
            i = self.names.index(name)
            want, shape = self.dtypes[i], self.shapes[i]
            if str(arr.dtype) == want and tuple(arr.shape) == shape:
                arrays[name] = arr
                continue
            values = arr.numpy().reshape(shape)  # a 0-d array may come back as (1,)
            if np.dtype(want).kind in "iub":
                values = np.rint(values)
            arrays[name] = Array(np.array(values, dtype=want, order="C"))  # 0-d stays 0-d
        return ArrayRecord(arrays)

    def rebuild(self, vec: np.ndarray, raw: ArrayRecord | None) -> ArrayRecord:
        """The ``ArrayRecord`` of this layout from a flat vector and the raw arrays.

        Raises :class:`PayloadError` when ``vec`` has another length or ``raw`` lacks an
        array, holds another one, or one of another dtype or shape.
        """
        if vec.size != self.dim:
            raise PayloadError(f"{vec.size} values for {self.dim} floating-point elements")
        raw_names = [self.names[i] for i in self.raw]
        have = [] if raw is None else list(raw.keys())
        if sorted(have) != sorted(raw_names):
            raise PayloadError(f"{RAW_KEY} holds arrays {sorted(have)}, expected "
                               f"{sorted(raw_names)}")
        arrays: dict[str, Array] = {}
        offset = 0
        for i, name in enumerate(self.names):
            shape, dtype = self.shapes[i], self.dtypes[i]
            if self.is_coded(i):
                n = math.prod(shape)
                part = vec[offset:offset + n].astype(dtype).reshape(shape)
                offset += n
                arrays[name] = Array(np.array(part, order="C"))  # 0-d stays 0-d
                continue
            assert raw is not None
            arr = raw[name]
            if str(arr.dtype) != dtype or tuple(arr.shape) != shape:
                raise PayloadError(f"{RAW_KEY}[{name!r}] is {arr.dtype} {tuple(arr.shape)}, "
                                   f"expected {dtype} {shape}")
            arrays[name] = arr
        return ArrayRecord(arrays)

    def check(self, record: ArrayRecord, what: str) -> None:
        """Raise ``ValueError`` unless ``record`` has this layout's arrays and shapes.

        A floating-point array may come back in another floating-point dtype (a model
        loaded from float64 weights returns float32); any other array keeps its dtype.
        """
        got = Layout.of(self.key, record)
        if got.names != self.names:
            raise ValueError(f"{what} hold arrays {list(got.names)[:8]}..., expected "
                             f"{list(self.names)[:8]}... (the arrays received)")
        for name, d0, s0, d1, s1 in zip(self.names, self.dtypes, self.shapes, got.dtypes,
                                        got.shapes, strict=True):
            same = d0 == d1 or (d0 in FLOAT_DTYPES and d1 in FLOAT_DTYPES)
            if not same or s0 != s1:
                raise ValueError(f"{what}[{name!r}] is {d1} {s1}, received {d0} {s0}")

    # ------------------------------------------------------------------ JSON
    def to_json(self) -> str:
        """The layout as compact JSON (a config value)."""
        return json.dumps([self.key, list(self.names), list(self.dtypes),
                           [list(s) for s in self.shapes]], separators=(",", ":"))

    @classmethod
    def from_json(cls, text: Any) -> Layout:
        """Inverse of :meth:`to_json`; ``PayloadError`` for anything malformed."""
        try:
            key, names, dtypes, shapes = json.loads(str(text))
            n = len(names)
            ok = (isinstance(key, str) and 0 < n <= MAX_ARRAYS and len(dtypes) == n
                  and len(shapes) == n and all(isinstance(x, str) for x in names)
                  and all(isinstance(x, str) for x in dtypes)
                  and all(isinstance(s, list) and len(s) <= MAX_NDIM
                          and all(isinstance(d, int) and 0 <= d < 1 << 31 for d in s)
                          for s in shapes))
        except (ValueError, TypeError) as exc:
            raise PayloadError(f"{LAYOUT_KEY} is not a layout: {exc}") from None
        if not ok:
            raise PayloadError(f"{LAYOUT_KEY} is not a valid layout")
        return cls(key, tuple(names), tuple(dtypes), tuple(tuple(s) for s in shapes))


def single_array_record(records: Mapping[str, ArrayRecord], what: str) -> str:
    """The name of the one ``ArrayRecord`` in ``records``; ``ValueError`` otherwise."""
    if len(records) != 1:
        raise ValueError(f"{what} must carry exactly one ArrayRecord (the model), found "
                         f"{len(records)}: {sorted(records)}")
    return next(iter(records))
