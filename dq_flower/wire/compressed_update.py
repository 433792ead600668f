"""Record names and array layout shared by :class:`dq_flower.CompressedUpdates` and its mod.

A train message is the inner strategy's plus ``compression-*`` config keys; with
``downlink="fp16"`` its ``ArrayRecord`` becomes ``compression-model`` (coded arrays, flat,
fp16), ``compression-raw`` (the others) and ``compression-layout`` (JSON). A reply carries
the update (returned minus received coded arrays) as ``compression-update[-<i>]``, the
other arrays under ``compression-raw`` and the user's own records untouched. Coded arrays
are the floating-point ones except BatchNorm's running statistics (a lossy codec could make
a variance negative).
"""

from __future__ import annotations

import functools
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

MODEL_KEY = "compression-model"
RAW_KEY = "compression-raw"
UPDATE_KEY = "compression-update"
LAYOUT_KEY = "compression-layout"
#: Array dtypes whose update is coded; every other array travels as it is.
FLOAT_DTYPES = ("float16", "float32", "float64")
#: Floating-point arrays sent as they are: BatchNorm's running statistics.
RAW_SUFFIXES = ("running_mean", "running_var")
#: Most arrays a layout may list (at most 16 dimensions each).
MAX_ARRAYS = 1 << 16


@dataclass(frozen=True)
class Layout:
    """Names, dtypes and shapes of the arrays of the ``ArrayRecord`` named ``key``, in order."""

    key: str
    names: tuple[str, ...]
    dtypes: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]

    @classmethod
    def of(cls, key: str, record: ArrayRecord) -> Layout:
        """The layout of ``record`` (named ``key``)."""
        items = list(record.items())  # lists, not generators: a message has many arrays
        return cls(key, tuple([k for k, _ in items]), tuple([str(a.dtype) for _, a in items]),
                   tuple([tuple(map(int, a.shape)) for _, a in items]))

    def is_coded(self, i: int) -> bool:
        """Whether array ``i``'s update is coded: floating point, not a BatchNorm statistic."""
        return self.dtypes[i] in FLOAT_DTYPES and not self.names[i].endswith(RAW_SUFFIXES)

    @functools.cached_property
    def coded(self) -> list[int]:
        """Positions of the coded arrays (worked out once per layout, as the next four)."""
        return [i for i in range(len(self.names)) if self.is_coded(i)]

    @functools.cached_property
    def raw(self) -> list[int]:
        """Positions of the arrays sent as they are."""
        return [i for i in range(len(self.names)) if i not in self.coded]

    @functools.cached_property
    def coded_shapes(self) -> list[tuple[int, ...]]:
        """Shapes of the coded arrays."""
        return [self.shapes[i] for i in self.coded]

    @functools.cached_property
    def coded_sizes(self) -> list[int]:
        """Element counts of the coded arrays."""
        return [math.prod(s) for s in self.coded_shapes]

    @functools.cached_property
    def dim(self) -> int:
        """Length of the flat update."""
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
        """``record`` back in this layout's dtypes and shapes (averaged integers rounded)."""
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
        """The ``ArrayRecord`` from a flat vector and the raw arrays.

        Raises :class:`PayloadError` when ``vec`` or ``raw`` does not match the layout.
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

    def read_raw(self, raw: ArrayRecord | None) -> dict[str, np.ndarray]:
        """The arrays of a reply's ``raw`` record by name, checked against the layout.

        Raises :class:`PayloadError` for a missing, extra or misshapen array.
        """
        names = [self.names[i] for i in self.raw]
        have = [] if raw is None else list(raw.keys())
        if sorted(have) != sorted(names):
            raise PayloadError(f"{RAW_KEY} holds arrays {sorted(have)[:8]}, expected "
                               f"{sorted(names)[:8]}")
        out: dict[str, np.ndarray] = {}
        for i in self.raw:
            assert raw is not None
            name, arr = self.names[i], raw[self.names[i]]
            if str(arr.dtype) != self.dtypes[i] or tuple(arr.shape) != self.shapes[i]:
                raise PayloadError(f"{RAW_KEY}[{name!r}] is {arr.dtype} {tuple(arr.shape)}, "
                                   f"expected {self.dtypes[i]} {self.shapes[i]}")
            out[name] = arr.numpy()
        return out

    def check(self, record: ArrayRecord, what: str) -> None:
        """Raise ``ValueError`` unless ``record`` has this layout (any float dtype for floats)."""
        got = Layout.of(self.key, record)
        if got.names != self.names:
            raise ValueError(f"{what} hold arrays {list(got.names)[:8]}..., expected "
                             f"{list(self.names)[:8]}... (the arrays received)")
        for name, d0, s0, d1, s1 in zip(self.names, self.dtypes, self.shapes, got.dtypes,
                                        got.shapes, strict=True):
            same = d0 == d1 or (d0 in FLOAT_DTYPES and d1 in FLOAT_DTYPES)
            if not same or s0 != s1:
                raise ValueError(f"{what}[{name!r}] is {d1} {s1}, received {d0} {s0}")

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
                  and all(isinstance(s, list) and len(s) <= 16
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
